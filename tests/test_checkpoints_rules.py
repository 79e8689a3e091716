"""pipeline/run/checkpoints.py's rules over their classes, fast: on crafted folders, and on a real transformers
`Trainer` over a tiny LoRA model (well under a second a run). TRL's GRPOTrainer saves and loads checkpoints with
the methods it inherits from that Trainer (`_save_checkpoint` only adds a model card first), so what is wrapped
here is what a GRPO run wraps; the real GRPO runs that reach the same code end to end are the slow tests of
test_checkpoints.py and test_saves.py. These are the tests bench/mutants.py runs against the module."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from grpo_pipeline.pipeline.config import fields_with
from grpo_pipeline.pipeline.run.checkpoints import (
    WEIGHT_FILES,
    checkpoint_problem,
    file_mode_callback,
    list_checkpoints,
    remove_staging_leftovers,
    resolve_resume,
    save_checkpoint_now,
    set_aside_checkpoints_after,
    set_aside_corrupt,
    set_aside_previous_run,
    stage_checkpoint_saves,
    torch_zip_problem,
)
from grpo_pipeline.pipeline.run.resume import (
    SHAPE_NAME,
    checkpoint_record,
    load_every_adapter,
    recorded_shape,
    resume_key,
    resume_mismatch,
)
from grpo_pipeline.pipeline.run.stop import interrupts_raise
from train_helpers import demo_config

# --- a real Trainer over a tiny LoRA model ---------------------------------------------------------------------


def tiny_lora_model(*, seed: int = 0, adapters: tuple[str, ...] = ("default",), active: str = "default"):
    """A 1-layer tiny Qwen2 with LoRA adapters of random (non-zero) weights. A second adapter named "ref" is made
    as TRL's GRPOTrainer.__init__ makes it (beta != 0 on a model that is already a PeftModel): the "default"
    config again, its weights copied from "default"."""
    import torch
    from peft import LoraConfig, get_peft_model

    from grpo_pipeline.pipeline.demo.model import build_tiny_qwen2

    torch.manual_seed(seed)
    config = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(build_tiny_qwen2(32, seed=seed, num_hidden_layers=1), config)
    for name in adapters[1:]:
        model.add_adapter(name, model.peft_config["default"])
        if name == "ref":
            for param_name, param in model.named_parameters():
                if ".default." in param_name:
                    model.get_parameter(param_name.replace(".default.", ".ref.")).data.copy_(param.data)
    model.set_adapter(active)
    return model


def real_trainer(run_dir: Path, *, max_steps: int = 2, save_steps: int = 1, save_total_limit=None, wrapped=True,
                 callbacks=(), save_strategy: str = "steps", **model_kwargs):
    """A transformers Trainer as pipeline/trainer/build.py leaves a GRPO one: checkpoint files get the usual modes,
    saves are staged, loads restore every adapter."""
    import torch
    from transformers import Trainer, TrainingArguments

    rows = [{"input_ids": torch.tensor([1, 2, 3, 4, 5]), "labels": torch.tensor([1, 2, 3, 4, 5])}] * 8
    args = TrainingArguments(output_dir=str(run_dir), max_steps=max_steps, save_steps=save_steps,
                             save_total_limit=save_total_limit, save_strategy=save_strategy,
                             per_device_train_batch_size=2, learning_rate=0.05,
                             report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=tiny_lora_model(**model_kwargs), args=args, train_dataset=rows,
                      callbacks=[file_mode_callback(), *callbacks])
    if wrapped:
        trainer._save_checkpoint = stage_checkpoint_saves(trainer, resume_key(demo_config(run_dir)))
        trainer._load_from_checkpoint = load_every_adapter(trainer)
    return trainer


def adapter_weights(model, adapter: str = "default") -> dict[str, np.ndarray]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().numpy().copy() for k, v in
            get_peft_model_state_dict(model, adapter_name=adapter).items()}


def saved_weights(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def same_weights(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


# --- stage_checkpoint_saves: every save appears whole or not at all ---------------------------------------------


def test_every_staged_save_is_published_whole_with_its_weight_shape_and_leaves_nothing_hidden(tmp_path, umask_022):
    run_dir = tmp_path / "run"
    trainer = real_trainer(run_dir, max_steps=3)
    trainer.train()
    assert [p.name for p in list_checkpoints(run_dir)] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    for step, checkpoint in enumerate(list_checkpoints(run_dir), start=1):
        assert checkpoint_problem(checkpoint) is None
        assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
        assert json.loads((checkpoint / SHAPE_NAME).read_text()) == json.loads(
            json.dumps(checkpoint_record(resume_key(demo_config(run_dir)))))
        assert (checkpoint / "adapter_model.safetensors").stat().st_mode & 0o777 == 0o644  # safetensors wrote 0600
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert same_weights(saved_weights(run_dir / "checkpoint-3"), adapter_weights(trainer.model))
    # the redirect of the Trainer's output folder lasts one save only
    assert "_get_output_dir" not in vars(trainer) and trainer._get_output_dir(trial=None) == str(run_dir)


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_staged_saves_keep_the_trainers_rotation_of_save_total_limit(tmp_path, limit):
    run_dir = tmp_path / "run"
    real_trainer(run_dir, max_steps=4, save_total_limit=limit).train()
    assert [p.name for p in list_checkpoints(run_dir)] == [f"checkpoint-{n}" for n in range(5 - limit, 5)]


def test_the_rotation_keeps_the_trainers_best_checkpoint(tmp_path):
    """transformers' rotate_checkpoints never deletes state.best_model_checkpoint: the staged save passes it on."""
    from transformers import TrainerCallback

    run_dir = tmp_path / "run"

    class BestIsTheFirst(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            state.best_model_checkpoint = str(run_dir / "checkpoint-1")

    real_trainer(run_dir, max_steps=4, save_total_limit=2, callbacks=[BestIsTheFirst()]).train()
    assert [p.name for p in list_checkpoints(run_dir)] == ["checkpoint-1", "checkpoint-4"]


def test_a_save_that_fails_midway_leaves_no_checkpoint_and_the_earlier_ones_untouched(tmp_path, monkeypatch):
    from transformers import Trainer

    run_dir = tmp_path / "run"
    trainer = real_trainer(run_dir, max_steps=3)
    save_rng_state = Trainer._save_rng_state

    def full_disk_at_step_2(self, output_dir):
        if self.state.global_step == 2:  # after the adapter, optimizer and scheduler of checkpoint-2 are written
            raise OSError(errno.ENOSPC, "No space left on device")
        save_rng_state(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", full_disk_at_step_2)
    with pytest.raises(OSError, match="No space left"):
        trainer.train()
    assert [p.name for p in run_dir.iterdir()] == ["checkpoint-1"]  # no checkpoint-2, no staging folder
    assert checkpoint_problem(run_dir / "checkpoint-1") is None
    assert "_get_output_dir" not in vars(trainer)


def test_a_save_failing_before_it_wrote_anything_raises_its_own_error(tmp_path, monkeypatch):
    """A full disk at the first write (the checkpoint folder cannot even be made): the cleanup of the staging
    folder that was never made must not replace the error that says why."""
    from transformers import Trainer

    run_dir = tmp_path / "run"
    trainer = real_trainer(run_dir, max_steps=2)
    save_model = Trainer.save_model

    def full_disk_at_step_2(self, output_dir=None, _internal_call=False):
        if self.state.global_step == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        save_model(self, output_dir, _internal_call)

    monkeypatch.setattr(Trainer, "save_model", full_disk_at_step_2)
    with pytest.raises(OSError, match="No space left on device") as caught:
        trainer.train()
    assert caught.value.errno == errno.ENOSPC
    assert [p.name for p in run_dir.iterdir()] == ["checkpoint-1"]


def test_a_save_publishes_only_what_it_wrote_never_a_killed_saves_leftovers(tmp_path):
    run_dir = tmp_path / "run"
    stale = run_dir / ".checkpoint-1.staging" / "checkpoint-1"
    stale.mkdir(parents=True)
    (stale / "optimizer.pt").write_bytes(b"from a save killed earlier")
    (stale / "stale.txt").write_text("not from this save")
    real_trainer(run_dir, max_steps=1).train()
    assert not (run_dir / "checkpoint-1" / "stale.txt").exists()
    assert torch_zip_problem(run_dir / "checkpoint-1" / "optimizer.pt") is None
    assert not (run_dir / ".checkpoint-1.staging").exists()


# --- load_every_adapter: a checkpoint load restores the adapter it trained --------------------------------------


@pytest.fixture(scope="module")
def checkpoint_with_ref(tmp_path_factory):
    """checkpoint-2 of a run whose model holds TRL's frozen "ref" adapter beside the trained "default" one."""
    run_dir = tmp_path_factory.mktemp("with-ref") / "run"
    real_trainer(run_dir, max_steps=2, save_steps=2, adapters=("default", "ref")).train()
    checkpoint = run_dir / "checkpoint-2"
    assert (checkpoint / "ref" / "adapter_model.safetensors").is_file()
    return checkpoint


@pytest.mark.parametrize("weights", ["adapter_model.safetensors", "adapter_model.bin"])
def test_loading_a_checkpoint_with_a_ref_adapter_restores_the_trained_adapter_trainable(checkpoint_with_ref, tmp_path,
                                                                                        weights):
    """Whatever the top-level adapter's file (adapter_model.bin: a checkpoint of an older transformers)."""
    import shutil

    import torch

    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(checkpoint_with_ref, checkpoint)
    saved = saved_weights(checkpoint)
    if weights.endswith(".bin"):
        torch.save({k: torch.from_numpy(v) for k, v in saved.items()}, checkpoint / weights)
        (checkpoint / "adapter_model.safetensors").unlink()
    trainer = real_trainer(tmp_path / "new", seed=1, adapters=("default", "ref"))
    assert not same_weights(adapter_weights(trainer.model), saved)  # another seed: other weights in memory
    trainer._load_from_checkpoint(str(checkpoint))
    assert same_weights(adapter_weights(trainer.model), saved)
    assert same_weights(adapter_weights(trainer.model, "ref"), saved_weights(checkpoint / "ref"))
    assert trainer.model.active_adapters == ["default"]
    trained = [p.requires_grad for n, p in trainer.model.named_parameters() if ".default." in n]
    assert trained and all(trained)  # it goes on training the loaded adapter
    assert not any(p.requires_grad for n, p in trainer.model.named_parameters() if ".ref." in n)


def test_a_model_passed_to_the_load_gets_the_weights_not_the_trainers_own(checkpoint_with_ref, tmp_path):
    """transformers passes the model to load into where it is not trainer.model (`model_wrapped` under some
    distributed set-ups): that one is restored, adapters and all."""
    trainer = real_trainer(tmp_path / "new", seed=1, adapters=("default", "ref"))
    other = tiny_lora_model(seed=2, adapters=("default", "ref"))
    untouched = {name: adapter_weights(trainer.model, name) for name in ("default", "ref")}
    trainer._load_from_checkpoint(str(checkpoint_with_ref), model=other)
    assert same_weights(adapter_weights(other), saved_weights(checkpoint_with_ref))
    assert same_weights(adapter_weights(other, "ref"), saved_weights(checkpoint_with_ref / "ref"))
    assert all(same_weights(adapter_weights(trainer.model, name), weights) for name, weights in untouched.items())


def test_a_checkpoint_of_a_model_without_adapters_loads_as_transformers_loads_it(tmp_path):
    import torch
    from transformers import Trainer, TrainingArguments

    from grpo_pipeline.pipeline.demo.model import build_tiny_qwen2

    rows = [{"input_ids": torch.tensor([1, 2, 3]), "labels": torch.tensor([1, 2, 3])}] * 4

    def trainer_for(run_dir, seed):
        args = TrainingArguments(output_dir=str(run_dir), max_steps=1, save_steps=1, per_device_train_batch_size=2,
                                 report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True)
        trainer = Trainer(model=build_tiny_qwen2(32, seed=seed, num_hidden_layers=1), args=args,
                          train_dataset=rows)
        load_every_adapter(trainer)
        return trainer

    trainer_for(tmp_path / "run", 0).train()
    fresh = trainer_for(tmp_path / "new", 1)
    fresh._load_from_checkpoint(str(tmp_path / "run" / "checkpoint-1"))
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "run" / "checkpoint-1" / "model.safetensors"))
    state = fresh.model.state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in saved.items())


def test_without_the_wrap_transformers_restores_only_the_ref_adapter(checkpoint_with_ref, tmp_path):
    """Why load_every_adapter exists (transformers 5.17 `Trainer._load_from_checkpoint`): if this starts failing,
    transformers loads the top-level adapter itself and the wrap can go."""
    trainer = real_trainer(tmp_path / "new", seed=1, adapters=("default", "ref"), wrapped=False)
    before = adapter_weights(trainer.model)
    trainer._load_from_checkpoint(str(checkpoint_with_ref))
    assert same_weights(adapter_weights(trainer.model), before)


def test_a_checkpoint_with_one_adapter_loads_it_as_transformers_does(tmp_path):
    run_dir = tmp_path / "run"
    real_trainer(run_dir, max_steps=1).train()
    trainer = real_trainer(tmp_path / "new", seed=1)
    trainer._load_from_checkpoint(str(run_dir / "checkpoint-1"))
    assert same_weights(adapter_weights(trainer.model), saved_weights(run_dir / "checkpoint-1"))
    assert list(trainer.model.peft_config) == ["default"]


def test_an_active_adapter_saved_in_its_own_folder_is_not_overwritten_by_the_top_level_one(tmp_path):
    """peft writes "default" at the top and every other adapter in a sub-folder of its name; when the trained
    (active) adapter is one of those, transformers restored it, and the top level is another adapter's."""
    run_dir = tmp_path / "run"
    real_trainer(run_dir, max_steps=1, adapters=("default", "mine"), active="mine").train()
    checkpoint = run_dir / "checkpoint-1"
    trainer = real_trainer(tmp_path / "new", seed=1, adapters=("default", "mine"), active="mine")
    trainer._load_from_checkpoint(str(checkpoint))
    assert trainer.model.active_adapters == ["mine"]
    assert same_weights(adapter_weights(trainer.model, "mine"), saved_weights(checkpoint / "mine"))
    assert not same_weights(adapter_weights(trainer.model, "mine"), saved_weights(checkpoint))


# --- save_checkpoint_now: a checkpoint outside the training loop (a reward failed mid-step) ---------------------


class SaveEvents:
    """A TrainerCallback recording on_save's global_step: the Trainer's own callback mechanism."""

    def __new__(cls):
        from transformers import TrainerCallback

        class _Events(TrainerCallback):
            steps: list[int]

            def __init__(self):
                self.steps = []

            def on_save(self, args, state, control, **kwargs):
                self.steps.append(state.global_step)

        return _Events()


@pytest.mark.parametrize("steps", [1, 2])
def test_save_checkpoint_now_writes_a_complete_resumable_checkpoint_of_the_last_step(tmp_path, umask_022, steps):
    run_dir = tmp_path / "run"
    events = SaveEvents()
    trainer = real_trainer(run_dir, max_steps=steps, save_strategy="no", callbacks=[events])
    trainer.train()  # as a loop that a reward failure ended before any save
    assert list_checkpoints(run_dir) == [] and events.steps == []
    folder = save_checkpoint_now(trainer, run_dir)
    assert folder == run_dir / f"checkpoint-{steps}" and checkpoint_problem(folder) is None
    assert (folder / SHAPE_NAME).is_file() and (folder / "optimizer.pt").is_file()  # staged, optimizer included
    assert events.steps == [steps]  # the callbacks' on_save ran, as at any save
    assert same_weights(saved_weights(folder), adapter_weights(trainer.model))
    assert resolve_resume("auto", run_dir, log=lambda m: None) == str(folder.resolve())


def test_save_checkpoint_now_at_step_0_saves_nothing(tmp_path):
    run_dir = tmp_path / "run"
    events = SaveEvents()
    trainer = real_trainer(run_dir, callbacks=[events])
    assert trainer.state.global_step == 0
    assert save_checkpoint_now(trainer, run_dir) is None
    assert not run_dir.exists() or list(run_dir.iterdir()) == [] and events.steps == []


def test_save_checkpoint_now_keeps_a_complete_checkpoint_and_replaces_an_incomplete_one(tmp_path):
    run_dir = tmp_path / "run"
    events = SaveEvents()
    trainer = real_trainer(run_dir, max_steps=2, save_steps=2, callbacks=[events])
    trainer.train()
    complete = run_dir / "checkpoint-2"
    (complete / "marker.txt").write_text("the checkpoint the loop saved")
    assert save_checkpoint_now(trainer, run_dir) == complete and (complete / "marker.txt").is_file()
    assert events.steps == [2]  # the loop's save only
    (complete / "trainer_state.json").unlink()  # now it is incomplete
    assert save_checkpoint_now(trainer, run_dir) == complete
    assert checkpoint_problem(complete) is None and not (complete / "marker.txt").exists()
    assert events.steps == [2, 2]


# --- file_mode_callback ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("main_process", [True, False])
def test_the_file_mode_callback_opens_the_saved_checkpoints_files_on_the_main_process_only(tmp_path, umask_022,
                                                                                          main_process):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    checkpoint = tmp_path / "checkpoint-7" / "sub"
    checkpoint.mkdir(parents=True)
    weights = checkpoint / "adapter_model.safetensors"
    weights.write_bytes(b"x")
    weights.chmod(0o600)
    other = tmp_path / "checkpoint-6.txt"
    other.write_bytes(b"x")
    other.chmod(0o600)
    state = TrainerState(global_step=7, is_world_process_zero=main_process)
    file_mode_callback().on_save(TrainingArguments(output_dir=str(tmp_path), report_to=[]), state, TrainerControl())
    assert weights.stat().st_mode & 0o777 == (0o644 if main_process else 0o600)
    assert other.stat().st_mode & 0o777 == 0o600  # only checkpoint-<global_step>


# --- signals outside the training loop ------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_inside_interrupts_raise_either_signal_is_a_keyboard_interrupt_and_the_handlers_come_back(signum):
    def mine(*_):
        return None

    previous = {sig: signal.signal(sig, mine) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(KeyboardInterrupt) as caught, interrupts_raise():
            os.kill(os.getpid(), signum)
        if signum == signal.SIGTERM:
            assert caught.value.args == ("SIGTERM",)
        assert all(signal.getsignal(sig) is mine for sig in previous)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_interrupts_raise_and_graceful_stop_are_no_ops_outside_the_main_thread():
    from grpo_pipeline.pipeline.run.stop import GracefulStop

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    errors = []

    def work():
        try:
            with interrupts_raise(), GracefulStop() as stopper:
                assert stopper.signal_name is None
        except BaseException as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert errors == [] and {sig: signal.getsignal(sig) for sig in before} == before


def test_the_first_signal_prints_what_happens_next_and_a_second_aborts_at_once(capsys):
    from grpo_pipeline.pipeline.run.stop import GracefulStop

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (`&` jobs ignore SIGINT)
    try:
        with GracefulStop() as stopper:
            os.kill(os.getpid(), signal.SIGTERM)
            assert stopper.signal_name == "SIGTERM"
            assert capsys.readouterr().out == ("\n[grpo] SIGTERM received: finishing this step, saving a checkpoint, "
                                               "then stopping. Send it again to abort without saving.\n")
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)  # the handler before ours is back
    finally:
        signal.signal(signal.SIGINT, before)


# --- checkpoint_problem and torch_zip_problem over the files a checkpoint holds --------------------------------


def make_checkpoint(root: Path, step: int, *, state: object = None, weights: str | None = "adapter_model.safetensors"):
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step} if state is None else state))
    if weights:
        save_file({"lora_A": np.zeros((2, 2), dtype=np.float32)}, str(path / weights))
    return path


def torch_file(path: Path) -> Path:
    import torch

    torch.save({"state": {0: {"exp_avg": torch.zeros(64)}}, "param_groups": [{"lr": 0.1}]}, path)
    return path


@pytest.mark.parametrize("state, error", [
    ({}, "KeyError: 'global_step'"),
    ({"global_step": "three"}, "ValueError: invalid literal for int() with base 10: 'three'"),
    ({"global_step": None}, "TypeError: int() argument must be a string, a bytes-like object or a real number, "
                            "not 'NoneType'"),
    ([3], "TypeError: list indices must be integers or slices, not str"),
])
def test_an_unreadable_trainer_state_names_the_error_and_its_type(tmp_path, state, error):
    expected = f"trainer_state.json is unreadable ({error})"
    assert checkpoint_problem(make_checkpoint(tmp_path, 3, state=state)) == expected


def test_a_missing_trainer_state_is_an_interrupted_save(tmp_path):
    path = make_checkpoint(tmp_path, 3)
    (path / "trainer_state.json").unlink()
    assert checkpoint_problem(path) == "trainer_state.json is missing (the save was interrupted)"


@pytest.mark.parametrize("name", [n for n in WEIGHT_FILES if n.endswith(".safetensors")])
def test_each_safetensors_weights_file_alone_makes_a_complete_checkpoint(tmp_path, name):
    assert checkpoint_problem(make_checkpoint(tmp_path, 1, weights=name)) is None


@pytest.mark.parametrize("name", [n for n in WEIGHT_FILES if not n.endswith(".safetensors")])
def test_each_other_weights_file_alone_makes_a_complete_checkpoint(tmp_path, name):
    path = make_checkpoint(tmp_path, 1, weights=None)
    if name.endswith(".bin"):
        torch_file(path / name)
    else:
        (path / name).write_text(json.dumps({"weight_map": {}}))
    assert checkpoint_problem(path) is None


@pytest.mark.parametrize("how", ["none", "empty", "a folder"])
def test_without_a_non_empty_weights_file_there_are_no_model_weights(tmp_path, how):
    path = make_checkpoint(tmp_path, 1, weights=None)
    if how == "empty":
        (path / "adapter_model.safetensors").write_bytes(b"")
    elif how == "a folder":
        (path / "adapter_model.safetensors").mkdir()
    assert checkpoint_problem(path) == "no model weights (adapter_model.safetensors / model.safetensors)"


def test_a_one_byte_weights_file_is_there_but_truncated(tmp_path):
    path = make_checkpoint(tmp_path, 1, weights=None)
    (path / "adapter_model.safetensors").write_bytes(b"\x10")
    problem = checkpoint_problem(path)
    assert "adapter_model.safetensors is truncated" in problem


@pytest.mark.parametrize("name", ["model.safetensors", "extra.safetensors"])
def test_any_broken_safetensors_file_beside_good_weights_is_named(tmp_path, name):
    path = make_checkpoint(tmp_path, 1)
    (path / name).write_bytes(b"\x10")
    assert name in checkpoint_problem(path)


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "rng_state_1.pth",
                                  "training_args.bin", "pytorch_model.bin"])
@pytest.mark.parametrize("damage", ["truncated", "not a zip"])
def test_every_broken_torch_file_of_a_checkpoint_is_named(tmp_path, name, damage):
    path = make_checkpoint(tmp_path, 1)
    torch_file(path / name)
    assert checkpoint_problem(path) is None
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not a zip file at all")
    assert checkpoint_problem(path) == (f"{name} is truncated or corrupt (no readable torch zip directory)")


def test_the_torch_zip_check_names_a_member_running_past_the_end_and_an_unreadable_file(tmp_path):
    good = torch_file(tmp_path / "optimizer.pt")
    assert torch_zip_problem(good) is None
    with zipfile.ZipFile(good) as archive:
        first = archive.infolist()[0]
        size = good.stat().st_size
    # The directory promises more bytes than the file holds: grow the first member's compressed size past the end.
    data = bytearray(good.read_bytes())
    entry = data.find(b"PK\x01\x02")  # the first central directory entry; its compressed size is at +20
    data[entry + 20:entry + 24] = (size * 2).to_bytes(4, "little")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    assert torch_zip_problem(bad) == (f"bad.pt is truncated: member {first.filename} runs past the end "
                                      f"({size} bytes)")
    folder = tmp_path / "folder.pt"
    folder.mkdir()
    assert torch_zip_problem(folder).startswith("folder.pt cannot be read: ")


# --- which folders are checkpoints, and which leftovers are removed ---------------------------------------------


def test_only_checkpoint_n_folders_are_checkpoints(tmp_path):
    for name in ("checkpoint-3", "checkpoint-12", "checkpoint-x", "checkpoint-", "xcheckpoint-4", "checkpoint-5a",
                 "Checkpoint-6"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-7").write_text("a file")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-3", "checkpoint-12"]
    assert list_checkpoints(tmp_path / "checkpoint-7") == [] and list_checkpoints(tmp_path / "nothing") == []


LEFTOVERS = {  # name -> removed?
    ".checkpoint-3.staging": True,  # our staged save, killed
    "tmp-checkpoint-3": True,  # older transformers' staging folder
    ".lora.tmp-123-0123abcd": True,  # atomic_directory's copy, killed
    ".summary.json.tmp-9-deadbeef": True,  # atomic_write_text's
    "checkpoint-3": False,
    ".checkpoint-3.staging.bak": False,
    ".checkpoint-x.staging": False,
    "tmp-checkpoint-x": False,
    "lora": False,
    ".grpo-run.lock": False,
}


@pytest.mark.parametrize("kind", ["folder", "file", "symlink"])
def test_what_killed_saves_left_is_removed_and_nothing_else(tmp_path, kind):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in LEFTOVERS:
        path = run_dir / name
        if kind == "folder":
            path.mkdir()
            (path / "inside.txt").write_text("x")
        elif kind == "file":
            path.write_text("x")
        else:
            path.symlink_to(outside, target_is_directory=True)
    messages = []
    removed = remove_staging_leftovers(run_dir, log=messages.append)
    expected = sorted(name for name, gone in LEFTOVERS.items() if gone)
    assert sorted(p.name for p in removed) == expected
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(n for n, gone in LEFTOVERS.items() if not gone)
    assert outside.is_dir()  # a symlink is unlinked, never followed
    assert messages == ["[checkpoints] removed what an interrupted save left: " + ", ".join(
        p.name for p in removed)]
    assert remove_staging_leftovers(run_dir, log=messages.append) == [] and len(messages) == 1
    assert remove_staging_leftovers(tmp_path / "no-run", log=messages.append) == []


# --- moving things aside: what is said ------------------------------------------------------------------------


def test_each_move_aside_says_what_moved_where_and_that_nothing_was_deleted(tmp_path):
    messages = []
    make_checkpoint(tmp_path, 2)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    earlier = set_aside_previous_run(tmp_path, log=messages.append)
    assert re.fullmatch(r"\d{8}-\d{6}", earlier.name)  # previous/<date>-<time>: sorts as it happened
    for step in (1, 2, 3):
        make_checkpoint(tmp_path, step)
    rollback = set_aside_checkpoints_after(tmp_path, 1, log=messages.append)
    assert re.fullmatch(r"\d{8}-\d{6}-rollback(-\d+)?", rollback.name)
    make_checkpoint(tmp_path, 5, state={})
    [corrupt] = set_aside_corrupt(tmp_path, log=messages.append)
    assert corrupt.path.parent == tmp_path / "corrupt" and re.fullmatch(r"checkpoint-5-\d{8}-\d{6}", corrupt.path.name)
    assert messages == [
        f"a fresh start in a used folder: the earlier run's checkpoint-2, metrics.jsonl moved to {earlier} "
        "(not deleted)",
        f"rolling back to checkpoint-1: the collapsed checkpoint-2, checkpoint-3 moved to {rollback} (not deleted)",
        f"[checkpoints] checkpoint-5 is incomplete: {corrupt.problem}. Moved to {corrupt.path} (not deleted).",
    ]


def test_resume_auto_takes_the_newest_of_many_complete_checkpoints_and_says_what_it_set_aside(tmp_path, capsys):
    for step in (1, 2, 3, 4):
        make_checkpoint(tmp_path, step)
    make_checkpoint(tmp_path, 5, weights=None)
    messages = []
    assert resolve_resume("auto", tmp_path, log=messages.append) == str((tmp_path / "checkpoint-4").resolve())
    assert len(messages) == 1 and messages[0].startswith("[checkpoints] checkpoint-5 is incomplete")
    assert capsys.readouterr().out == ""  # said through the run's log, not printed past it


# --- the weight shape a checkpoint was trained with ------------------------------------------------------------


def test_the_weight_shape_sorts_module_lists_reads_none_as_empty_and_makes_a_local_model_absolute(tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-model").mkdir()
    cfg = demo_config(tmp_path, model_name_or_path="my-model", lora_r=8, lora_alpha=32,
                      lora_target_modules=["v_proj", "q_proj"], lora_modules_to_save=None)
    assert dict(resume_key(cfg).shape) == {"model_name_or_path": str(tmp_path / "my-model"), "lora_r": 8, "lora_alpha": 32,
                                 "lora_target_modules": ["q_proj", "v_proj"], "lora_modules_to_save": []}
    hub = demo_config(tmp_path, model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct", lora_modules_to_save=["lm_head"])
    shape = dict(resume_key(hub).shape)
    assert shape["model_name_or_path"] == "Qwen/Qwen2.5-0.5B-Instruct" and shape["lora_modules_to_save"] == ["lm_head"]
    assert list(shape) == list(fields_with("resume_shaping"))


@pytest.mark.parametrize("files, expected", [
    ({}, {}),
    ({SHAPE_NAME: {"lora_r": 8, "lora_target_modules": ["v", "q"], "lora_modules_to_save": None}},
     {"lora_r": 8, "lora_target_modules": ["q", "v"], "lora_modules_to_save": []}),
    ({SHAPE_NAME: {"lora_r": 8}, "adapter_config.json": {"r": 4}}, {"lora_r": 8}),  # ours first
    ({SHAPE_NAME: "{not json", "adapter_config.json": {"r": 4, "lora_alpha": 8, "target_modules": "q_proj",
                                                       "modules_to_save": None, "peft_type": "LORA"}},
     {"lora_r": 4, "lora_alpha": 8, "lora_target_modules": ["q_proj"], "lora_modules_to_save": []}),
    ({SHAPE_NAME: [1, 2], "adapter_config.json": {"target_modules": ["v", "q"]}}, {"lora_target_modules": ["q", "v"]}),
    ({"adapter_config.json": ["r"]}, {}),
])
def test_a_checkpoints_recorded_shape_is_read_from_ours_else_peft_s_config(tmp_path, files, expected):
    for name, content in files.items():
        (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    assert recorded_shape(tmp_path) == expected


def test_resume_mismatch_names_every_changed_field_old_to_new_and_only_fields_recorded(tmp_path):
    checkpoint = tmp_path / "run" / "checkpoint-4"
    checkpoint.mkdir(parents=True)
    cfg = demo_config(tmp_path, lora_r=16, lora_alpha=16, lora_target_modules=["q_proj", "v_proj"])
    (checkpoint / SHAPE_NAME).write_text(json.dumps({**dict(resume_key(cfg).shape), "lora_r": 8, "lora_alpha": 32}))
    assert resume_mismatch(checkpoint, resume_key(cfg)) == (
        f"checkpoint-4 in {tmp_path / 'run'} was trained with other weights: lora_r 8 -> 16; lora_alpha 32 -> 16. "
        "It cannot be resumed under the new values. Train into a new folder (--output_dir NEW_FOLDER), or start this "
        "one over with --resume never (its checkpoints are then replaced), or put the old values back.")
    (checkpoint / SHAPE_NAME).write_text(json.dumps({"lora_r": 16}))  # what is not recorded is not compared
    assert resume_mismatch(checkpoint, resume_key(cfg)) is None
    (checkpoint / SHAPE_NAME).unlink()
    assert resume_mismatch(checkpoint, resume_key(cfg)) is None  # nothing recorded: nothing to refuse
