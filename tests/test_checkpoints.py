"""Checkpoint discovery, corrupt set-aside (never delete) and --resume resolution: on crafted folders, and
on the real checkpoints of a tiny CPU run whose files are then truncated."""

import json
import os
import shutil
import signal

import numpy as np
import pytest
from safetensors.numpy import save_file

from grpo_pipeline.pipeline.run.checkpoints import (
    PREVIOUS_DIR,
    TRAJECTORY_FILES,
    checkpoint_problem,
    complete_checkpoints,
    list_checkpoints,
    previous_run_entries,
    resolve_resume,
    set_aside_corrupt,
    set_aside_previous_run,
)


def make_checkpoint(root, step, *, state=True, weights=True, state_text=None):
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if state:
        (path / "trainer_state.json").write_text(state_text or json.dumps({"global_step": step}))
    if weights:
        save_file({"lora_A": np.zeros((2, 2), dtype=np.float32)}, str(path / "adapter_model.safetensors"))
    return path


def test_complete_checkpoint_has_no_problem(tmp_path):
    assert checkpoint_problem(make_checkpoint(tmp_path, 2)) is None


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"state": False}, "trainer_state.json is missing"),
        ({"state_text": "{not json"}, "trainer_state.json is unreadable"),
        ({"state_text": "{}"}, "trainer_state.json is unreadable"),
        ({"weights": False}, "no model weights"),
    ],
)
def test_incomplete_checkpoints_are_named(tmp_path, kwargs, expected):
    assert expected in checkpoint_problem(make_checkpoint(tmp_path, 3, **kwargs))


def test_list_is_numeric_not_lexical(tmp_path):
    for step in (10, 9, 100):
        make_checkpoint(tmp_path, step)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-9", "checkpoint-10", "checkpoint-100"]


def test_corrupt_checkpoint_is_moved_aside_not_deleted(tmp_path):
    good = make_checkpoint(tmp_path, 2)
    bad = make_checkpoint(tmp_path, 4, state=False)
    (bad / "optimizer.pt").write_bytes(b"keep me")
    messages = []
    moved = set_aside_corrupt(tmp_path, log=messages.append)
    assert len(moved) == 1 and not bad.exists() and good.exists()
    kept = moved[0].path
    assert kept.parent == tmp_path / "corrupt" and (kept / "optimizer.pt").read_bytes() == b"keep me"
    assert "checkpoint-4 is incomplete" in messages[0] and "not deleted" in messages[0]


def test_resume_auto_picks_newest_complete(tmp_path):
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4)
    make_checkpoint(tmp_path, 6, weights=False)  # the newest is broken: set aside, resume from 4
    resumed = resolve_resume("auto", tmp_path, log=lambda m: None)
    assert resumed == str((tmp_path / "checkpoint-4").resolve())
    assert (tmp_path / "corrupt").is_dir()


def test_resume_never_and_empty(tmp_path):
    make_checkpoint(tmp_path, 2)
    assert resolve_resume("never", tmp_path) is None
    assert resolve_resume("auto", tmp_path / "fresh-run") is None


def test_resume_path_relative_and_errors(tmp_path, monkeypatch):
    make_checkpoint(tmp_path / "run", 5)
    monkeypatch.chdir(tmp_path)
    assert resolve_resume("run/checkpoint-5", tmp_path / "run") == str(tmp_path / "run" / "checkpoint-5")
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        resolve_resume("run/checkpoint-9", tmp_path / "run")
    make_checkpoint(tmp_path / "run", 7, state=False)
    with pytest.raises(ValueError, match="trainer_state.json is missing"):
        resolve_resume("run/checkpoint-7", tmp_path / "run")


def test_complete_checkpoints_skip_broken_ones_without_moving_them_and_respect_below_step(tmp_path):
    for step in (2, 4, 6, 8):
        make_checkpoint(tmp_path, step, weights=step != 6)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-4", "checkpoint-8"]
    assert [p.name for p in complete_checkpoints(tmp_path, below_step=8)] == ["checkpoint-2", "checkpoint-4"]
    assert complete_checkpoints(tmp_path, below_step=2) == [] and (tmp_path / "checkpoint-6").is_dir()


# --- a fresh start in a used folder: the earlier run's trajectory is moved aside, whole --------------------

# What a run folder may hold that is NOT one trajectory: keyed caches and logs, which a fresh start keeps.
KEPT_ENTRIES = ("warmup", "eval_before.json", "data_report.json", "reward_dry_run.json", "logs")


def _fill_run_folder(root, entries):
    for name in entries:
        if name.startswith("checkpoint-"):
            make_checkpoint(root, int(name.split("-")[1]))
        elif "." in name:
            (root / name).write_text(f"old {name}")
        else:
            (root / name).mkdir(parents=True)
            (root / name / "inside.txt").write_text(f"old {name}")


@pytest.mark.parametrize("entry", [*TRAJECTORY_FILES, "checkpoint-3"])
def test_each_trajectory_entry_of_an_earlier_run_is_moved_aside_whole_and_the_caches_stay(tmp_path, entry):
    _fill_run_folder(tmp_path, [entry, *KEPT_ENTRIES])
    assert previous_run_entries(tmp_path) == [tmp_path / entry]  # seen before anything moves
    messages = []
    target = set_aside_previous_run(tmp_path, log=messages.append)
    assert target.parent == tmp_path / PREVIOUS_DIR and not (tmp_path / entry).exists()
    moved = target / entry
    if entry.startswith("checkpoint-"):
        assert checkpoint_problem(moved) is None and json.loads((moved / "trainer_state.json").read_text()) == {
            "global_step": 3}
    else:
        assert (moved if moved.is_file() else moved / "inside.txt").read_text() == f"old {entry}"
    assert all((tmp_path / name).exists() for name in KEPT_ENTRIES)
    assert entry in messages[0] and str(target) in messages[0] and "not deleted" in messages[0]
    assert previous_run_entries(tmp_path) == []


def test_a_folder_without_an_earlier_run_is_left_as_it_is_and_two_set_asides_never_collide(tmp_path):
    _fill_run_folder(tmp_path, KEPT_ENTRIES)
    assert set_aside_previous_run(tmp_path, log=lambda m: None) is None and not (tmp_path / PREVIOUS_DIR).exists()
    _fill_run_folder(tmp_path, ["metrics.jsonl"])
    first = set_aside_previous_run(tmp_path, log=lambda m: None)
    _fill_run_folder(tmp_path, ["metrics.jsonl"])
    second = set_aside_previous_run(tmp_path, log=lambda m: None)  # within the same second, often
    assert first != second and (first / "metrics.jsonl").is_file() and (second / "metrics.jsonl").is_file()


def _metric_steps(run_dir):
    return [row["step"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in row]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["--resume never", "auto, its checkpoints deleted"])
def test_a_fresh_start_in_a_used_folder_plots_and_resumes_only_its_own_steps(trained_run, tmp_path, capsys, how):
    """The earlier run trained 4 steps (checkpoint-3, -4 kept). A fresh 1-step run in its folder must not show the
    old steps in metrics.jsonl or plots, nor resume the old checkpoint-4 later; the old files are all kept aside."""
    from grpo_pipeline.pipeline.preflight import check_resume
    from grpo_pipeline.pipeline.run.resume import contents_problem
    from grpo_pipeline.pipeline.run.resume import resume_key, resume_mismatch
    from grpo_pipeline.pipeline.train import run_training
    from train_helpers import demo_config

    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    old_metrics = (run_dir / "metrics.jsonl").read_text()
    if how.startswith("auto"):  # "rm -rf checkpoint-*" to free the disk, then the same command again
        for checkpoint in list_checkpoints(run_dir):
            shutil.rmtree(checkpoint)
    resume = "never" if how == "--resume never" else "auto"
    cfg = demo_config(run_dir, max_steps=1, save_steps=1, resume=resume)
    # --check says what the run will do with the earlier files
    said = check_resume(cfg.grpo.resume, cfg.grpo.output_dir,
                        lambda path: resume_mismatch(path, resume_key(cfg)) or contents_problem(path, resume_key(cfg)))
    assert "metrics.jsonl" in said and "lora" in said and str(run_dir / PREVIOUS_DIR) in said
    result = run_training(cfg)
    assert result.status == "completed" and result.steps == 1
    assert _metric_steps(run_dir) == [1]
    assert [p.name for p in list_checkpoints(run_dir)] == ["checkpoint-1"]
    [previous] = (run_dir / PREVIOUS_DIR).iterdir()
    assert (previous / "metrics.jsonl").read_text() == old_metrics  # nothing lost
    assert (previous / "lora" / "adapter_model.safetensors").is_file() and (previous / "summary.json").is_file()
    if how == "--resume never":
        assert (previous / "checkpoint-4" / "trainer_state.json").is_file()
    assert "moved to " + str(previous) in capsys.readouterr().out
    # The same command again (--resume auto, as the printed resume command says) continues THIS run.
    again = run_training(demo_config(run_dir, max_steps=2, save_steps=1))
    assert again.status == "completed" and again.steps == 2 and _metric_steps(run_dir) == [1, 2]
    assert len(list((run_dir / PREVIOUS_DIR).iterdir())) == 1  # a resume moves nothing


# --- real checkpoints (a tiny CPU run), truncated as a full disk or a cut-short copy leaves them ---------


@pytest.fixture(scope="module")
def trained_run(adapter_runs):
    """A finished 4-step run saved at every step, save_total_limit 2: checkpoint-3 and checkpoint-4 (adapter,
    optimizer.pt, rng state...); trained once, read or copied by each test (adapter_runs(0) below)."""
    run_dir, settings = adapter_runs(0)
    assert settings["max_steps"] == 4 and (run_dir / "checkpoint-4" / "optimizer.pt").is_file()
    return run_dir


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["adapter_model.safetensors", "optimizer.pt"])
def test_truncated_file_of_a_real_checkpoint_is_named(trained_run, tmp_path, name):
    checkpoint = tmp_path / "checkpoint-4"
    shutil.copytree(trained_run / "checkpoint-4", checkpoint)
    assert checkpoint_problem(checkpoint) is None  # every real file (rng_state.pth, scheduler.pt...) passes
    truncate(checkpoint / name)
    problem = checkpoint_problem(checkpoint)
    assert problem is not None and name in problem and "truncated" in problem


@pytest.mark.slow
def test_resume_auto_sets_truncated_newest_aside_and_resumes_from_the_previous(trained_run, tmp_path, capsys):
    from grpo_pipeline.pipeline.train import run_training
    from train_helpers import demo_config

    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    shutil.rmtree(run_dir / "lora")  # as if the run had died after saving checkpoint-4
    truncate(run_dir / "checkpoint-4" / "adapter_model.safetensors")
    truncate(run_dir / "checkpoint-4" / "optimizer.pt", keep=0.9)
    result = run_training(demo_config(run_dir, **_adapter_settings(0)))
    out = capsys.readouterr().out
    assert result.exit_code == 0 and result.status == "completed" and result.steps == 4
    assert "checkpoint-4 is incomplete: " in out and "adapter_model.safetensors" in out and "not deleted" in out
    assert "resuming from " + str(run_dir / "checkpoint-3") in out
    kept = list((run_dir / "corrupt").iterdir())
    assert len(kept) == 1 and kept[0].name.startswith("checkpoint-4-")
    assert (kept[0] / "optimizer.pt").stat().st_size > 0  # the broken files are kept for inspection
    assert (run_dir / "checkpoint-4").is_dir()  # re-trained 4 and saved again


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_turns_the_next_step_end_into_save_and_stop_and_handlers_are_restored(signum):
    from transformers import TrainerControl

    from grpo_pipeline.pipeline.run.stop import GracefulStop

    before = signal.getsignal(signum)
    with GracefulStop() as stopper:
        callback = stopper.callback()
        quiet = callback.on_step_end(None, None, TrainerControl())
        assert (quiet.should_save, quiet.should_training_stop) == (False, False)  # no signal: train on
        os.kill(os.getpid(), signum)
        control = callback.on_step_end(None, None, TrainerControl())
        assert control.should_save is True and control.should_training_stop is True
        assert stopper.signal_name == signal.Signals(signum).name
        assert signal.getsignal(signum) is before  # a second signal aborts as it would without us
    assert signal.getsignal(signum) is before


def test_corrupt_checkpoints_found_in_later_runs_join_the_same_corrupt_folder_with_their_reasons(tmp_path):
    make_checkpoint(tmp_path, 4, state=False)
    first = set_aside_corrupt(tmp_path, log=lambda m: None)
    make_checkpoint(tmp_path, 6, weights=False)  # a later run, with corrupt/ already there
    second = set_aside_corrupt(tmp_path, log=lambda m: None)
    assert [p.path.parent for p in first + second] == [tmp_path / "corrupt"] * 2
    assert sorted(p.name.split("-2")[0] for p in (tmp_path / "corrupt").iterdir()) == ["checkpoint-4", "checkpoint-6"]
    assert "trainer_state.json is missing" in first[0].problem and "no model weights" in second[0].problem


def test_an_empty_weights_file_is_no_model_weights(tmp_path):
    path = make_checkpoint(tmp_path, 5, weights=False)
    (path / "adapter_model.safetensors").write_bytes(b"")  # a save killed before its first byte
    assert "no model weights" in checkpoint_problem(path)


# --- every way a checkpoint is loaded restores the adapter it trained, whatever other adapters it holds ----


def _adapter_tensors(path):
    from safetensors.numpy import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def _adapter_settings(warmup_steps):
    """The runs adapter_runs trains. Without a warm-up: the module's shared 4-step run (trained_run), saved at every
    step and rotated to the newest 2; after a warm-up: one GRPO step. beta 0.04 (a reference model) and a reward
    with variance on a random model, so every step moves the weights."""
    shape = dict(max_steps=4, save_steps=1, save_total_limit=2) if not warmup_steps else dict(max_steps=1,
                                                                                                save_steps=1)
    return dict(shape, beta=0.04, sft_warmup_steps=warmup_steps, reward_funcs=["train_helpers:digit_share_reward"])


@pytest.fixture(scope="module")
def adapter_runs(tmp_path_factory):
    """`trained(warmup_steps)` -> (run folder, its settings): a completed run (_adapter_settings: beta 0.04, a
    checkpoint at its last step, lora/) with that many warm-up steps, trained once per warm-up setting in this
    module: each case copies it (or only reads it) and loads from the copy."""
    from grpo_pipeline.pipeline.train import run_training
    from train_helpers import demo_config

    runs = {}

    def trained(warmup_steps):
        if warmup_steps not in runs:
            run_dir = tmp_path_factory.mktemp(f"adapter-warmup-{warmup_steps}") / "run"
            settings = _adapter_settings(warmup_steps)
            result = run_training(demo_config(run_dir, **settings))
            assert result.status == "completed" and result.steps == settings["max_steps"]
            runs[warmup_steps] = run_dir, settings
        return runs[warmup_steps]

    return trained


@pytest.mark.slow
@pytest.mark.parametrize("how", ["resume", "finish the final save"])
@pytest.mark.parametrize("warmup_steps", [0, 4], ids=["no warm-up", "after a warm-up"])
def test_loading_a_checkpoint_restores_its_trained_adapter(adapter_runs, tmp_path, how, warmup_steps):
    """With beta > 0 after a format warm-up, TRL adds a frozen "ref" adapter, which the pipeline removes (kl is
    measured against the base model: pipeline/health/rollback.py base_model_reference), so checkpoints hold the
    trained adapter alone. A resumed run and a finished run's lora/ must hold the last checkpoint's trained weights,
    not the warm-up's (tests/test_checkpoints_rules.py covers a checkpoint that does hold ref/)."""
    from transformers import TrainerCallback

    from grpo_pipeline.pipeline.train import run_training
    from train_helpers import demo_config

    run_dir = tmp_path / "run"
    trained, settings = adapter_runs(warmup_steps)
    shutil.copytree(trained, run_dir)  # the run, trained once for both ways to load it
    steps = settings["max_steps"]
    last = run_dir / f"checkpoint-{steps}"
    assert not (last / "ref").exists()  # one reference, the base model: no "ref" adapter
    saved = _adapter_tensors(last)

    class Loaded(TrainerCallback):
        weights = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):  # after the checkpoint loads
            from peft import get_peft_model_state_dict

            # copied: .numpy() of a CPU tensor shares its memory, and step 3 then trains the weights in place
            self.weights = {k: v.detach().cpu().numpy().copy() for k, v in
                            get_peft_model_state_dict(model, adapter_name="default").items()}

    if how == "resume":
        loaded = Loaded()
        resumed = {**settings, "max_steps": steps + 1}
        assert run_training(demo_config(run_dir, **resumed), callbacks=[loaded]).steps == steps + 1
        got = loaded.weights
    else:
        shutil.rmtree(run_dir / "lora")  # as if killed during the final save
        assert run_training(demo_config(run_dir, **settings)).status == "completed"
        got = _adapter_tensors(run_dir / "lora")
    assert set(got) == set(saved)
    assert all(np.array_equal(got[name], saved[name]) for name in saved)


# --- small rules the real-run tests reach only end to end ------------------------------------------------


@pytest.mark.parametrize("argv, expected", [
    ([], "grpo train --resume auto"),
    (["--config", "my recipe.yaml"], "grpo train --config 'my recipe.yaml' --resume auto"),
    (["--resume", "never", "--max_steps", "5"], "grpo train --max_steps 5 --resume auto"),
    (["--resume=runs/x/checkpoint-4", "--config", "r.yaml"], "grpo train --config r.yaml --resume auto"),
    (["--resume", "a", "--resume", "b"], "grpo train --resume auto"),
    (["--output_dir", "it's here"], "grpo train --output_dir 'it'\"'\"'s here' --resume auto"),
    (["--resumes", "x"], "grpo train --resumes x --resume auto"),  # another option, kept
])
def test_the_resume_command_keeps_the_users_options_and_resumes_auto(argv, expected):
    from grpo_pipeline.pipeline.run.stop import resume_command

    assert resume_command(argv) == expected


def test_a_rollback_sets_aside_only_the_checkpoints_after_its_target(tmp_path):
    from grpo_pipeline.pipeline.run.checkpoints import set_aside_checkpoints_after

    for step in (1, 2, 3, 10):
        make_checkpoint(tmp_path, step)
    messages = []
    target = set_aside_checkpoints_after(tmp_path, 2, log=messages.append)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-1", "checkpoint-2"]
    assert target.parent == tmp_path / PREVIOUS_DIR and target.name.endswith("-rollback")
    assert sorted(p.name for p in target.iterdir()) == ["checkpoint-10", "checkpoint-3"]
    assert "checkpoint-3, checkpoint-10 moved to " + str(target) in messages[0]
    assert set_aside_checkpoints_after(tmp_path, 2, log=messages.append) is None and len(messages) == 1


def test_a_checkpoints_size_is_estimated_from_the_trained_parameters_only():
    import torch

    from grpo_pipeline.pipeline.run.checkpoints import save_size_estimate

    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 5))  # 110 + 55 parameters
    model[0].requires_grad_(False)
    assert save_size_estimate(model) == int(55 * 12 * 1.1)  # fp32 weights + Adam's two moments, + 10%


def test_a_storage_failure_during_a_save_names_the_run_folder_the_size_and_how_to_resume(tmp_path):
    import errno
    from types import SimpleNamespace

    import torch

    from grpo_pipeline.env.disk import StorageError
    from grpo_pipeline.pipeline.run.checkpoints import save_size_estimate, storage_errors_are_resumable

    model = torch.nn.Linear(512, 512)
    trainer = SimpleNamespace(model=model)
    with pytest.raises(StorageError) as err:
        with storage_errors_are_resumable(trainer, tmp_path):
            raise RuntimeError("safetensors write failed (os error 28)")
    assert err.value.where == tmp_path and err.value.needed_bytes == save_size_estimate(model)
    assert err.value.errno == errno.ENOSPC
    assert str(err.value).endswith(f"then resume with the same command (--resume auto continues from the newest "
                                   f"complete checkpoint in {tmp_path}).")
    with pytest.raises(ValueError, match="not a storage problem"):  # anything else passes through as it is
        with storage_errors_are_resumable(trainer, tmp_path):
            raise ValueError("not a storage problem")


@pytest.mark.slow
def test_staged_saves_record_the_weight_shape_and_keep_save_total_limit(adapter_runs):
    from grpo_pipeline.pipeline.run.resume import SHAPE_NAME, checkpoint_record, resume_key
    from train_helpers import demo_config

    run_dir, settings = adapter_runs(0)  # the shared run, only read: saved at steps 1-4, save_total_limit 2
    cfg = demo_config(run_dir, **settings)
    assert (settings["max_steps"], settings["save_steps"], settings["save_total_limit"]) == (4, 1, 2)
    assert [p.name for p in list_checkpoints(run_dir)] == ["checkpoint-3", "checkpoint-4"]  # the oldest rotated out
    for checkpoint in list_checkpoints(run_dir):
        recorded = json.loads((checkpoint / SHAPE_NAME).read_text())
        data = recorded.pop("data")  # what the data position counts (pipeline/run/resume.py data_record)
        assert data["dataset_name"] == cfg.data.dataset_name and data["rows"] > 0 and len(data["fingerprint"]) == 64
        assert recorded == json.loads(json.dumps(checkpoint_record(resume_key(cfg))))
        assert checkpoint_problem(checkpoint) is None
        assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == int(
            checkpoint.name.split("-")[1])
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".checkpoint-")]  # no staging folder left
