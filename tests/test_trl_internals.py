"""TRL's methods this project replaces are listed in one module (pipeline/trainer/trl_internals.py): each is still a
method of the installed TRL's GRPOTrainer (an upgrade that renames one fails here, not silently), and a trainer the
pipeline builds carries exactly those replacements."""

import pytest

from pipeline.trainer import trl_internals


@pytest.mark.parametrize("name", trl_internals.REPLACED)
def test_each_replaced_method_is_one_the_installed_trl_has(name):
    from trl import GRPOTrainer

    assert callable(getattr(GRPOTrainer, name, None)), f"trl.GRPOTrainer has no {name} any more"


def test_a_built_trainer_carries_every_replacement_and_no_other(tmp_path, monkeypatch):
    import pipeline.trainer.build as build
    from pipeline.train import run_training
    from train_helpers import demo_config

    built = []

    def install_and_keep(trainer, *args):
        before = set(vars(trainer))
        trl_internals.replace_trl_internals(trainer, *args)
        built.append((trainer, set(vars(trainer)) - before))

    monkeypatch.setattr(build, "replace_trl_internals", install_and_keep)
    assert run_training(demo_config(tmp_path / "run", max_steps=1, save_steps=1,
                                    reward_funcs=["train_helpers:digit_share_reward"])).status == "completed"
    (trainer, added), = built
    assert added == set(trl_internals.REPLACED)
    assert all(getattr(trainer, name) is not getattr(type(trainer), name) for name in trl_internals.REPLACED)
    assert (tmp_path / "run" / "checkpoint-1" / "grpo_shape.json").is_file()  # the staged save ran
