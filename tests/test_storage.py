"""Every command against a full disk and a read-only folder, on a real small tmpfs (tests/conftest.py small_tmpfs).

A storage failure wherever it happens (the built-in model built into the cache root, the data cache, generate
--output, eval --output, export --out, the run folder, the reward dry-run file, plan --write) is exit 2 with one
message naming the path on that file system, the free space there and the fix: never "internal error ... Errno 28"
(exit 1), never a message blaming model_name_or_path. Nothing half-written is left looking complete: no final
file or folder, no staging leftovers. The classifier is env/disk.py storage_failure, at the one boundary
pipeline/errors.py run_command; env/paths.py's writers name their final path (storage_named).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from grpo_pipeline.env.paths import atomic_write_text
from grpo_pipeline.pipeline.cli import COMMANDS
from grpo_pipeline.pipeline.run.log import MetricsJsonlCallback
from tests.cli_helpers import fault_table, own_cache_root, run_cli

QUICK = "sft_warmup_steps: 0\nmax_steps: 1\neval_before: false\neval_after: false\n"
PLAN_RECIPE = str(Path(__file__).resolve().parents[1] / "configs" / "qwen2.5-0.5b-gsm8k.yaml")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with own_cache_root(tmp_path_factory) as root:
        yield root


@pytest.fixture(scope="module")
def lora(cache, tmp_path_factory) -> Path:
    return fault_table().adapter(tmp_path_factory.mktemp("storage"))


def recipe(work: Path, *extra: str) -> str:
    return str(fault_table().recipe(work, QUICK + "".join(extra)))


# Where each command writes, put on the small file system `disk`; `work` is a normal folder. (command, argv)
# The built-in model's build into the cache root is one row per command (GRPO_CACHE_DIR on `disk`).
OUTPUTS = {
    "data: data_cache_dir": ("data", lambda disk, work, lora: ["--config",
                                                               recipe(work, f"data_cache_dir: {disk}/c\n")]),
    "train: output_dir": ("train", lambda disk, work, lora: ["--config", recipe(work), "--output_dir", f"{disk}/run"]),
    "rewards: the dry-run file": ("rewards", lambda disk, work, lora: ["--config", recipe(work),
                                                                       "--output_dir", f"{disk}/run"]),
    "generate --output": ("generate", lambda disk, work, lora: ["--lora", str(lora), "--prompt", "1+1?",
                                                                "--max_tokens", "4", "--backend", "plain", "--output",
                                                                f"{disk}/answers.jsonl"]),
    "eval --output": ("eval", lambda disk, work, lora: ["--lora", str(lora), "--data", "demo-arithmetic", "--limit",
                                                        "2", "--max_tokens", "4", "--backend", "plain", "--output",
                                                        f"{disk}/eval.json"]),
    "export --out": ("export", lambda disk, work, lora: ["--lora", str(lora), "--to", "merged16", "--backend",
                                                         "plain", "--out", f"{disk}/merged"]),
    "plan --write": ("plan", lambda disk, work, lora: ["--config", PLAN_RECIPE, "--gpu", "T4", "--write",
                                                       f"{disk}/fitted.yaml"]),
}
BUILTIN_MODEL = {
    "data": lambda work, lora: ["--config", recipe(work)],
    "train": lambda work, lora: ["--config", recipe(work)],
    "rewards": lambda work, lora: ["--config", recipe(work)],
    "generate": lambda work, lora: ["--base", "--model", "tiny-demo", "--prompt", "1+1?", "--backend", "plain"],
    "eval": lambda work, lora: ["--base", "--model", "tiny-demo", "--data", "demo-arithmetic", "--limit", "2",
                                "--output", str(work / "eval.json"), "--backend", "plain"],
    "export": lambda work, lora: ["--lora", str(lora), "--to", "merged16", "--out", str(work / "merged"),
                                  "--backend", "plain"],  # its base, tiny-qwen2.5, is built into the cache root
}
# Commands that write nothing a full or read-only cache root stops: they still succeed there.
NOTHING_TO_STOP = {
    "env": ["--json"],
    "plan": ["--config", PLAN_RECIPE, "--gpu", "T4"],  # its parameter-count cache is optional (plan/shape.py)
}


# Commands that write inside the run folder they read (`grpo plot`: its plots/): the run is written onto the small
# file system first, then it is filled or made read-only.
IN_THE_RUN_FOLDER = {"plot": lambda run: ["--run", str(run)]}


def test_every_command_is_in_the_tables():
    assert ({command for command, _ in OUTPUTS.values()} | set(BUILTIN_MODEL) | set(NOTHING_TO_STOP)
            | set(IN_THE_RUN_FOLDER)) == set(COMMANDS)


def leftovers(disk: Path) -> list[str]:
    """What a failed command left on the small file system besides the filler: staging copies and anything that
    looks like a finished output (a file with data; an empty lock file or folder is no output)."""
    found = []
    for root, dirs, files in os.walk(disk):
        for name in dirs + files:
            path = Path(root) / name
            if name == ".filler" or (path.is_file() and path.stat().st_size == 0):
                continue
            if ".tmp-" in name or ".old-" in name or path.is_file():
                found.append(str(path.relative_to(disk)))
    return found


def assert_named_storage_failure(code: int, output: str, disk: Path) -> None:
    assert code == 2, output[-3000:]
    assert "Traceback" not in output and "internal error" not in output, output[-3000:]
    error = [line for line in output.splitlines() if line.startswith(("error:", "grpo "))][-1]
    assert str(disk) in error, error  # the path on that file system
    assert "model_name_or_path" not in error, error
    assert ("free on that disk" in error or "read-only" in error), error  # the free space, or why nothing goes


@pytest.mark.parametrize("kind", ["full", "ro"])
@pytest.mark.parametrize("case", list(OUTPUTS))
def test_a_full_or_read_only_output_is_exit_2_naming_it(case, kind, small_tmpfs, cache, lora, tmp_path,
                                                        monkeypatch, capsys):
    disk = small_tmpfs(kind)
    monkeypatch.chdir(tmp_path)
    command, argv = OUTPUTS[case]
    code, output = run_cli([command, *argv(disk, tmp_path, lora)], capsys)
    assert_named_storage_failure(code, output, disk)
    assert leftovers(disk) == []


@pytest.mark.parametrize("kind", ["full", "ro"])
@pytest.mark.parametrize("command", list(IN_THE_RUN_FOLDER))
def test_a_run_folder_on_a_full_or_read_only_disk_is_exit_2_naming_it(command, kind, small_tmpfs, tmp_path,
                                                                     monkeypatch, capsys):
    import subprocess

    disk = small_tmpfs("empty")
    run = disk / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5, "loss": 0.1}\n')
    if kind == "full":
        small_tmpfs.fill(disk)
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True, check=True)
    monkeypatch.chdir(tmp_path)
    code, output = run_cli([command, *IN_THE_RUN_FOLDER[command](run)], capsys)
    assert_named_storage_failure(code, output, disk)
    assert leftovers(disk) == ["run/metrics.jsonl"]


@pytest.mark.parametrize("kind", ["full", "ro"])
@pytest.mark.parametrize("command", list(BUILTIN_MODEL))
def test_the_builtin_model_in_a_full_or_read_only_cache_root_is_exit_2(command, kind, small_tmpfs, cache, lora,
                                                                       tmp_path, monkeypatch, capsys):
    disk = small_tmpfs(kind)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRPO_CACHE_DIR", str(disk / "cache"))
    code, output = run_cli([command, *BUILTIN_MODEL[command](tmp_path, lora)], capsys)
    assert_named_storage_failure(code, output, disk)
    assert "GRPO_CACHE_DIR" in output  # the fix: the setting that chose that place
    assert leftovers(disk) == []


@pytest.mark.parametrize("kind", ["full", "ro"])
@pytest.mark.parametrize("command", list(NOTHING_TO_STOP))
def test_commands_that_only_cache_still_work_with_a_full_or_read_only_cache_root(command, kind, small_tmpfs, cache,
                                                                                  tmp_path, monkeypatch, capsys):
    disk = small_tmpfs(kind)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRPO_CACHE_DIR", str(disk / "cache"))
    code, output = run_cli([command, *NOTHING_TO_STOP[command]], capsys)
    assert code in (0, 1) and "Traceback" not in output and "internal error" not in output, output[-3000:]
    assert leftovers(disk) == []


# ---------------------------------------------------------------- the classifier itself, by errno and shape


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM])
def test_the_boundary_turns_any_storage_oserror_into_exit_2_naming_its_path(number, tmp_path, monkeypatch, capsys):
    """Wherever it is raised (here: a log write the writers do not wrap), an OSError with a storage errno is exit 2
    naming e.filename and the free space, whatever wraps it."""
    from grpo_pipeline.pipeline.errors import run_command

    target = tmp_path / "logs" / "metrics.jsonl"

    def write(argv):
        try:
            raise OSError(number, os.strerror(number), str(target))
        except OSError as err:
            raise RuntimeError("a library wrapped it") from err

    assert run_command("train", write, []) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: ") and str(target) in error and "free on that disk" in error, error


def test_a_permission_error_without_a_path_is_not_a_storage_failure(capsys):
    """EACCES/EPERM count only with the path they concern (a signal to another user's process is no storage)."""
    from grpo_pipeline.env.disk import storage_errno
    from grpo_pipeline.pipeline.errors import run_command

    assert storage_errno(PermissionError(errno.EPERM, "Operation not permitted")) is None

    def signal(argv):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    assert run_command("train", signal, []) == 1
    assert "bug" in capsys.readouterr().err


def test_a_storage_error_is_no_oserror_so_an_input_check_cannot_take_it_for_a_missing_file(tmp_path):
    """`except OSError` around a model read (pipeline/preflight.py lora_module_types) must not catch the cache
    root's failure and blame model_name_or_path."""
    from grpo_pipeline.env.disk import StorageError

    err = StorageError(tmp_path, errno.EROFS, None, "run it again.", option=None)
    assert not isinstance(err, OSError) and err.errno == errno.EROFS


REWRITES = {
    # a file the pipeline rewrites in place of an earlier version
    "atomic_write_text": lambda path: atomic_write_text(path, "x" * 20000),
    "metrics.jsonl trimmed on resume": lambda path: MetricsJsonlCallback(path, resume_step=1).on_train_begin(
        None, __import__("transformers").TrainerState(), None),
}


@pytest.mark.parametrize("name", list(REWRITES))
def test_a_rewrite_on_a_full_disk_keeps_the_earlier_version_whole(name, small_tmpfs):
    """A full disk in the middle of a rewrite: the earlier version stays as it was, nothing hidden is left."""
    from grpo_pipeline.env.disk import StorageError

    disk = small_tmpfs("empty")
    target = disk / "metrics.jsonl"
    earlier = "".join(f'{{"step": {step}, "loss": 0.5, "pad": "{"p" * 900}"}}\n' for step in range(1, 9))
    target.write_text(earlier, encoding="utf-8")
    small_tmpfs.fill(disk)
    with pytest.raises(StorageError, match=f"the disk is full: could not save in {target}"):
        REWRITES[name](target)
    assert target.read_text(encoding="utf-8") == earlier
    assert sorted(p.name for p in disk.iterdir()) == [".filler", "metrics.jsonl"]


@pytest.mark.parametrize("where", ["staging", "elsewhere"])
def test_a_writer_names_its_final_path_not_its_staging_name_and_a_failure_elsewhere_as_it_is(where, tmp_path):
    from grpo_pipeline.env.disk import StorageError
    from grpo_pipeline.env.paths import atomic_directory

    other = tmp_path / "models" / "config.json"
    with pytest.raises(StorageError) as caught, atomic_directory(tmp_path / "out", seen=None) as staging:
        failed = staging / "model.safetensors" if where == "staging" else other
        raise OSError(errno.ENOSPC if where == "staging" else errno.EACCES, "failed", str(failed))
    named = tmp_path / "out" if where == "staging" else other
    assert f"could not {'save in' if where == 'staging' else 'write or read'} {named} (" in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the staging copy is gone, nothing published
