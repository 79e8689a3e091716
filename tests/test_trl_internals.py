"""TRL's methods this project replaces are listed in one module (pipeline/trainer/trl_internals.py): each is still a
method of the installed TRL's GRPOTrainer (an upgrade that renames one fails here, not silently), and a trainer the
pipeline builds carries exactly those replacements."""

import pytest

from grpo_pipeline.pipeline.trainer import trl_internals


@pytest.mark.parametrize("name", trl_internals.REPLACED)
def test_each_replaced_method_is_one_the_installed_trl_has(name):
    from trl import GRPOTrainer

    assert callable(getattr(GRPOTrainer, name, None)), f"trl.GRPOTrainer has no {name} any more"


def test_a_built_trainer_carries_every_replacement_and_no_other(tmp_path, monkeypatch):
    import grpo_pipeline.pipeline.trainer.build as build
    from grpo_pipeline.pipeline.train import run_training
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


def test_a_run_without_vllm_imports_trls_trainer_without_vllm_and_a_later_vllm_run_gets_trls_vllm_names():
    """TRL's trainer module imports vLLM at its top when it is installed (pipeline/config/trl_fields.py
    grpo_trainer_module): a run that does not generate with it skips that import; a later run in the same process
    that does finds TRL's vLLM modules as an import with vLLM visible leaves them. A fresh process: this one's
    imports are the test harness's."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from grpo_pipeline.pipeline.config.trl_fields import grpo_trainer_module\n"
            "grpo_trainer_module(uses_vllm=False)\n"
            "import trl.generation.vllm_client as c, trl.generation.vllm_generation as g, trl.trainer.grpo_trainer\n"
            "print('vllm' in sys.modules, hasattr(g, 'LLM'), hasattr(c, 'get_ip'))\n"
            "grpo_trainer_module(uses_vllm=True)\n"
            "print('vllm' in sys.modules, hasattr(g, 'LLM'), hasattr(c, 'get_ip'))\n"
            "print(trl.trainer.grpo_trainer.VLLMGeneration._init_vllm.__globals__['LLM'] is g.LLM)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["False False False", "True True True", "True"], done.stdout
