"""Saves and resume (docs/reliability.md): a kill at every moment of a save, storage errors of every shape at
every save, and resume refused when the weight-shaping settings changed.

Kills are real: a child process runs the tiny CPU training and SIGKILLs itself at the named moment (so no
cleanup code runs, as after a power cut or the OOM killer); then the same run_training call here must finish
the run correctly from what the kill left.
"""

import errno
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from grpo_pipeline.env.disk import PROBLEMS, StorageError, storage_errno, storage_errors_named
from grpo_pipeline.pipeline.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def config(run_dir, **overrides):
    from train_helpers import demo_config

    # digit_share_reward has variance on a random model, so every step moves the weights: a final lora/ that
    # came from the wrong step (or from no checkpoint at all) would differ from the checkpoint's weights. 16
    # completion tokens are enough for that variance; the saves do not depend on the completions' length.
    values = dict(max_steps=2, save_steps=1, max_samples=16, max_completion_length="16",
                  reward_funcs=["train_helpers:digit_share_reward"])
    values.update(overrides)
    return demo_config(run_dir, **values)


# ---------------------------------------------------------------- storage errors: one classifier


class SafetensorError(Exception):
    """Shaped like safetensors' own exception class (a plain Exception, neither OSError nor RuntimeError)."""


def _wrapped(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as err:
            raise RuntimeError("saving the checkpoint failed") from err
    except RuntimeError as outer:
        return outer


def _context(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException:
            raise ValueError("while handling it, another error")
    except ValueError as outer:
        return outer


STORAGE_SHAPES = {
    "OSError ENOSPC": (OSError(errno.ENOSPC, "No space left on device"), errno.ENOSPC),
    "OSError EDQUOT": (OSError(errno.EDQUOT, "Disk quota exceeded"), errno.EDQUOT),
    "OSError EROFS": (OSError(errno.EROFS, "Read-only file system"), errno.EROFS),
    "OSError EIO": (OSError(errno.EIO, "Input/output error"), errno.EIO),
    "torch stream writer": (RuntimeError("[enforce fail at inline_container.cc:659] . unexpected pos 1152 vs 1040: "
                                         "PytorchStreamWriter failed writing file data/0: file write failed"),
                            errno.ENOSPC),
    "safetensors (os error 28)": (SafetensorError("Error while serializing: I/O error: No space left on device "
                                                  "(os error 28)"), errno.ENOSPC),
    "safetensors (os error 30)": (SafetensorError('Error while serializing: I/O error: Read-only file system '
                                                  '(os error 30) at path "/x/.tmp"'), errno.EROFS),
    "re-wrapped OSError text": (ValueError("could not save: [Errno 122] Disk quota exceeded: '/x'"), errno.EDQUOT),
    "ENOSPC as __cause__": (_wrapped(OSError(errno.ENOSPC, "No space left on device")), errno.ENOSPC),
    "EIO as __context__": (_context(OSError(errno.EIO, "Input/output error")), errno.EIO),
    "safetensors as __cause__ of __cause__": (_wrapped(_wrapped(SafetensorError("I/O error: (os error 28)"))),
                                              errno.ENOSPC),
}
NOT_STORAGE = {
    "FileNotFoundError": FileNotFoundError(errno.ENOENT, "No such file or directory"),
    "PermissionError": PermissionError(errno.EACCES, "Permission denied"),
    "shape mismatch": RuntimeError("size mismatch for lora_A.weight: copying a param with shape [8, 64]"),
    "plain ValueError": ValueError("bad value 28"),
}


@pytest.mark.parametrize("name", STORAGE_SHAPES)
def test_storage_failures_are_recognised_by_what_they_are(name):
    err, number = STORAGE_SHAPES[name]
    assert storage_errno(err) == number
    assert PROBLEMS[storage_errno(err)]


@pytest.mark.parametrize("name", NOT_STORAGE)
def test_other_failures_are_not_storage_failures(name, tmp_path):
    err = NOT_STORAGE[name]
    assert storage_errno(err) is None
    with pytest.raises(type(err)), storage_errors_named(tmp_path, "retry."):
        raise err


def test_storage_error_message_names_where_why_and_what_next(tmp_path):
    with pytest.raises(StorageError) as caught, storage_errors_named(tmp_path / "run", "resume with X.", 5 * 2**20):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    text = str(caught.value)
    assert text.startswith("the disk is full: could not save in ") and str(tmp_path / "run") in text
    assert "free on that disk" in text and "5.0 MiB" in text and text.endswith("resume with X.")
    with pytest.raises(StorageError, match="the file system is read-only.*writable folder"), \
            storage_errors_named(tmp_path, "retry."):
        raise OSError(errno.EROFS, "Read-only file system")


SAVE_MOMENTS = {
    # where in the run, and the function that writes there (the fault is raised at its first call)
    "checkpoint": ("transformers.Trainer._save_rng_state", True),
    "lora": ("grpo_pipeline.pipeline.backends.plain.save_adapter", False),
    "warm-up": ("peft.PeftModel.save_pretrained", False),
}


def _patch_target(monkeypatch, dotted: str, err: BaseException) -> None:
    from train_helpers import resolve_dotted

    def fail(*args, **kwargs):
        raise err

    monkeypatch.setattr(*resolve_dotted(dotted), fail)


def _leftovers(run_dir: Path) -> list[str]:
    """Hidden staging copies, tmp-checkpoint folders and checkpoints without trainer_state.json."""
    from grpo_pipeline.pipeline.run.checkpoints import checkpoint_problem, list_checkpoints

    hidden = [p.name for p in run_dir.iterdir() if p.name.startswith(".") and p.name != ".grpo-run.lock"]
    staged = [p.name for p in run_dir.glob("tmp-checkpoint-*")]
    broken = [p.name for p in list_checkpoints(run_dir) if checkpoint_problem(p)]
    return hidden + staged + broken


@pytest.mark.slow
@pytest.mark.parametrize("moment", SAVE_MOMENTS)
@pytest.mark.parametrize("shape", ["safetensors (os error 28)", "ENOSPC as __cause__"])
def test_storage_error_at_every_save_is_named_and_leaves_nothing_half_written(moment, shape, tmp_path, monkeypatch,
                                                                             capsys):
    from grpo_pipeline.pipeline.train import main

    monkeypatch.syspath_prepend(str(TESTS))
    target, _ = SAVE_MOMENTS[moment]
    _patch_target(monkeypatch, target, STORAGE_SHAPES[shape][0])
    recipe = tmp_path / "recipe.yaml"
    cfg = config(tmp_path / "run", max_steps=1, sft_warmup_steps=1 if moment == "warm-up" else 0)
    import yaml

    recipe.write_text(yaml.safe_dump(cfg.to_dict()), encoding="utf-8")
    code = main(["--config", str(recipe)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "the disk is full: could not save in " + str(tmp_path / "run") in err
    assert _leftovers(tmp_path / "run") == []
    assert not (tmp_path / "run" / "lora").exists() and not (tmp_path / "run" / "warmup").exists()


def test_export_storage_error_is_named(tmp_path, monkeypatch, capsys):
    """grpo export: the merged model's save fails on a read-only disk -> exit 2, nothing at --out."""
    from fault_kit import adapter

    lora = adapter(tmp_path, base="tiny-demo")  # the built-in model: no 151k-row vocabulary to load or merge
    monkeypatch.setattr("grpo_pipeline.pipeline.backends.plain.export", lambda *a, **k: (_ for _ in ()).throw(
        SafetensorError("Error while serializing: I/O error: Read-only file system (os error 30)")))
    from grpo_pipeline.pipeline.infer.export import main

    out = tmp_path / "merged"
    code = main(["--lora", str(lora), "--to", "merged16", "--out", str(out), "--backend", "plain"])
    err = capsys.readouterr().err
    assert code == 2 and "the file system is read-only" in err and not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".merged")] == []


# ---------------------------------------------------------------- a kill at every moment of a save

# One process imports the training stack once (no computation, so no thread pools yet) and forks a child for
# each kill: the child patches the named function to SIGKILL itself at its nth call and trains. Importing torch,
# transformers and trl per kill would cost more than the kills themselves. That is everything a run imports
# (train_helpers.freeze_the_training_stack, as in the test processes), frozen, so a child's collections walk only
# what it made.
FORK_SERVER = textwrap.dedent("""
    import json, os, signal, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from test_saves import config
    from train_helpers import freeze_the_training_stack, resolve_dotted
    from grpo_pipeline.pipeline.train import run_training
    import transformers, peft  # noqa: F401 -- the classes a kill point names
    freeze_the_training_stack()

    def killed_at(target, nth, when, run_dir, overrides):
        import grpo_pipeline.env.paths
        if target == "os.rename":  # the two-rename replace, where renameat2 cannot swap
            grpo_pipeline.env.paths._renameat2 = lambda src, dst, flags: False
        owner, attr = resolve_dotted(target)
        original, calls = getattr(owner, attr), []

        def counted(args):
            if target == "os.rename":
                return ".lora.old-" in str(args[1])  # only the rename that moves lora/ aside counts
            if target == "grpo_pipeline.env.paths._renameat2":
                return args[2] == grpo_pipeline.env.paths._RENAME_EXCHANGE and os.path.basename(args[1]) == "lora"
            return True

        def killed_here(*args, **kwargs):
            if not counted(args):
                return original(*args, **kwargs)
            calls.append(1)
            if len(calls) == nth and when == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            result = original(*args, **kwargs)
            if len(calls) == nth and when == "after":
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        setattr(owner, attr, killed_here)
        run_training(config(run_dir, **overrides))

    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            log = os.open(os.path.join(request["run_dir"] + ".log"), os.O_WRONLY | os.O_CREAT, 0o644)
            os.dup2(log, 1), os.dup2(log, 2)
            try:
                killed_at(**request)
            finally:
                os._exit(0)  # the kill point was never reached
        _, status = os.waitpid(pid, 0)
        print(json.dumps({{"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}}), flush=True)
""")


@pytest.fixture(scope="module")
def kill_server(tmp_path_factory):
    script = tmp_path_factory.mktemp("fork-server") / "server.py"
    script.write_text(FORK_SERVER.format(root=str(ROOT), tests=str(TESTS)), encoding="utf-8")
    server = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**__import__("os").environ, "TOKENIZERS_PARALLELISM": "false"})
    ready = []  # read at the first kill: the server imports while this process makes the other fixtures

    def kill(target, nth, when, run_dir, overrides) -> dict:
        if not ready:
            ready.append(server.stdout.readline().strip())
            assert ready == ["ready"], ready
        server.stdin.write(json.dumps(dict(target=target, nth=nth, when=when, run_dir=str(run_dir),
                                           overrides=overrides)) + "\n")
        server.stdin.flush()
        return json.loads(server.stdout.readline())

    yield kill
    server.stdin.close()
    server.wait(timeout=60)


# name -> (function, nth call, kill before/after it, config overrides). Each a moment of a run's saves.
KILL_POINTS = {
    "inside checkpoint-2's save (rng state)": ("transformers.Trainer._save_rng_state", 2, "before", {}),
    "checkpoint-2 saved, before the lora/ save": ("grpo_pipeline.pipeline.backends.plain.save_adapter", 1, "before", {}),
    "lora/ staged with weights, before its metadata": ("grpo_pipeline.pipeline.run.manifest.write_adapter_metadata", 1,
                                                       "before", {}),
    "lora/ published, before manifest.json": ("grpo_pipeline.pipeline.run.manifest.write_manifest", 1, "before", {}),
    "manifest.json written, before eval after": ("grpo_pipeline.pipeline.infer.evaluate.evaluate_rows", 1, "before",
                                                 {"eval_after": True, "eval_limit": 2}),
    # the last moment before summary.json (the plots are written): the state any kill after the manifest leaves
    "plots written, summary.json not yet": ("grpo_pipeline.pipeline.run.finish.final_metrics", 1, "before",
                                            {"plots": True}),
    "replacing lora/: old moved aside, new not yet in place": ("os.rename", 1, "after", {"max_steps": 3}),
    "replacing lora/: swapped in one step, the old copy not yet deleted": ("grpo_pipeline.env.paths._renameat2", 1, "after",
                                                                            {"max_steps": 3}),
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A complete 2-step run (checkpoint-1, checkpoint-2, lora/, manifest, summary), trained once."""
    from grpo_pipeline.pipeline.train import run_training

    run_dir = tmp_path_factory.mktemp("base") / "run"
    sys.path.insert(0, str(TESTS))
    assert run_training(config(run_dir)).status == "completed"
    return run_dir


def _adapter_weights(folder: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_kill_at_any_moment_of_a_save_is_completed_by_the_same_command(point, kill_server, finished_run, tmp_path,
                                                                         capsys):
    from grpo_pipeline.pipeline.infer.session import verify_trained_dir
    from grpo_pipeline.pipeline.train import run_training

    target, nth, when, overrides = KILL_POINTS[point]
    run_dir = tmp_path / "run"
    if overrides.get("max_steps", 2) > 2:
        shutil.copytree(finished_run, run_dir)  # a finished run trained further: its lora/ is replaced
    outcome = kill_server(target, nth, when, run_dir, overrides)
    log = Path(str(run_dir) + ".log")
    assert outcome["signal"] == 9, log.read_text()[-3000:]  # killed at that point, cleanup code never ran

    cfg = config(run_dir, **overrides)
    result = run_training(cfg)  # the same command again
    steps = cfg.grpo.max_steps
    assert (result.status, result.exit_code, result.steps) == ("completed", 0, steps)
    verify_trained_dir(run_dir / "lora")
    final = _adapter_weights(run_dir / "lora")
    trained = _adapter_weights(run_dir / f"checkpoint-{steps}")
    assert final.keys() == trained.keys() and all(np.array_equal(final[k], trained[k]) for k in final)
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert manifest["adapter_dir"] == str(run_dir / "lora")
    assert (summary["status"], summary["steps"]) == ("completed", steps)
    if overrides.get("eval_after"):
        assert summary["eval_after"] is not None
    assert _leftovers(run_dir) == []
    # and once complete, the same command says so without loading anything
    again = run_training(cfg)
    assert again.status == "completed" and "run already complete" in capsys.readouterr().out


# ---------------------------------------------------------------- resume: the weights must fit

SHAPE_CHANGES = {
    "lora_r": {"lora_r": 8},
    "lora_alpha": {"lora_alpha": 32},
    "lora_target_modules": {"lora_target_modules": ["q_proj", "v_proj"]},
    "lora_modules_to_save": {"lora_modules_to_save": ["norm"]},
    "model_name_or_path": {"model_name_or_path": "tiny-qwen2.5"},
}


def test_every_weight_shaping_field_is_in_the_table():
    from grpo_pipeline.pipeline.config import fields_with

    assert set(SHAPE_CHANGES) == set(fields_with("resume_shaping"))


@pytest.mark.slow
@pytest.mark.parametrize("field_name", SHAPE_CHANGES)
def test_resume_with_other_weight_shapes_is_refused_before_loading(field_name, finished_run, tmp_path, monkeypatch):
    from grpo_pipeline.pipeline.run.resume import resume_key
    from grpo_pipeline.pipeline.train import run_training

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    shutil.rmtree(run_dir / "checkpoint-2")  # resume from checkpoint-1: there is training left
    loaded = []
    monkeypatch.setattr("grpo_pipeline.pipeline.data.tokenizer.load_tokenizer", lambda *a, **k: loaded.append(a))
    change = SHAPE_CHANGES[field_name]
    with pytest.raises(ConfigError) as caught:
        run_training(config(run_dir, **change))
    text = str(caught.value)
    assert caught.value.field == "resume" and loaded == []  # refused before the tokenizer (or model) loads
    old, new = dict(resume_key(config(run_dir)).shape)[field_name], dict(resume_key(config(run_dir, **change)).shape)[field_name]
    assert old != new and f"{field_name} {old!r} -> {new!r}" in text
    assert "--output_dir" in text and "--resume never" in text


def test_resume_mismatch_reads_peft_adapter_config_of_older_checkpoints(tmp_path):
    from train_helpers import demo_config

    from grpo_pipeline.pipeline.run.resume import resume_key, resume_mismatch

    ckpt = tmp_path / "checkpoint-3"
    ckpt.mkdir()
    (ckpt / "adapter_config.json").write_text(json.dumps({"r": 16, "lora_alpha": 16, "target_modules": [
        "v_proj", "q_proj"], "modules_to_save": None}), encoding="utf-8")
    same = demo_config(tmp_path, lora_r=16, lora_alpha=16, lora_target_modules=["q_proj", "v_proj"])
    assert resume_mismatch(ckpt, resume_key(same)) is None
    problem = resume_mismatch(ckpt, resume_key(demo_config(tmp_path, lora_r=32, lora_alpha=16,
                                                lora_target_modules=["q_proj", "v_proj"])))
    assert "lora_r 16 -> 32" in problem


@pytest.mark.slow
def test_resume_refusal_through_the_command_is_exit_2(finished_run, tmp_path, capsys):
    import yaml

    from grpo_pipeline.pipeline.train import main

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(config(run_dir).to_dict()), encoding="utf-8")
    sys.path.insert(0, str(TESTS))
    assert main(["--config", str(recipe), "--lora_r", "4"]) == 2
    err = capsys.readouterr().err
    assert "config error in `resume`" in err and "lora_r 16 -> 4" in err and "Traceback" not in err
