"""Every path option of every command x every bad kind of path, through the real CLI (`grpo_pipeline.pipeline.cli.main`).

Each case must end with exit 2, one message naming the option, no traceback, and before any work: the
tokenizer and the backends are replaced by tripwires, so a path that slips through fails the test at once
(as an internal error, exit 1) instead of training. The second half is "nothing destructive touches inputs":
an output that is, holds or lies inside what the command reads is refused, and `--overwrite` replaces only a
previous export, set aside until the new one is complete.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from grpo_pipeline.env.path_check import EXPORT_MARKER, INPUT_FILE, OUTPUT_FILE, PATH_OPTIONS, PathError, check_path

from tests.cli_helpers import fault_table, run_cli

ROOT = Path(__file__).resolve().parent.parent

faults = fault_table()


class WorkStarted(Exception):
    """Raised by the tripwires: the command got past its path checks."""


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory) -> Path:
    """One real LoRA (peft, tiny Qwen2) with its run's manifest.json, shared read-only by the cases."""
    return faults.adapter(tmp_path_factory.mktemp("adapter"))


def tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _modules_binding_load_tokenizer() -> tuple[str, ...]:
    return tuple(".".join(("grpo_pipeline", *path.relative_to(ROOT).with_suffix("").parts))
                 for path in (ROOT / "pipeline").rglob("*.py")
                 if "from grpo_pipeline.pipeline.data.tokenizer import" in path.read_text(encoding="utf-8"))


def tripwires(monkeypatch) -> None:
    # Every module that binds load_tokenizer by name is imported now, so it keeps the real one, not the wire: a
    # module first imported under the wire would keep it for the rest of the process (another test's export).
    for name in _modules_binding_load_tokenizer():  # the checkout's files read once
        importlib.import_module(name)

    def started(*args, **kwargs):
        raise WorkStarted("work started before the path was refused")

    monkeypatch.setattr("grpo_pipeline.pipeline.data.tokenizer.load_tokenizer", started)
    for name in ("load_model", "load_for_training", "load_generator", "export"):
        monkeypatch.setattr(f"grpo_pipeline.pipeline.backends.plain.{name}", started)


def run(argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    return run_cli(argv, capsys)


# ---------------------------------------------------------------- the bad kinds: folder -> the value to pass


def _loop(folder: Path) -> str:
    (folder / "loop").symlink_to(folder / "loop")
    return str(folder / "loop" / "x")


def _dangling(folder: Path) -> str:
    (folder / "dangling").symlink_to(folder / "gone")
    return str(folder / "dangling")


def _wrong_type(folder: Path, want: str, role: str) -> str:
    if want == "file" or (want == "any" and role == "input"):
        target = folder / "a-folder"  # an input file (or a data file) given as a folder
        target.mkdir()
        if want == "any":
            return str(folder / "missing" / "data.jsonl")  # --data: file or folder; a missing one instead
        return str(target)
    target = folder / "a-file.txt"
    target.write_text("x")
    return str(target)


def _parent_is_file(folder: Path) -> str:
    (folder / "plain.txt").write_text("x")
    return str(folder / "plain.txt" / "inside")


BAD_KINDS: dict[str, Callable[[Path, str, str], str]] = {
    "unset $VAR": lambda d, want, role: "$GRPO_TEST_UNSET_VAR/x",
    "${VAR} set but empty": lambda d, want, role: "${GRPO_TEST_EMPTY_VAR}/x",
    "empty string": lambda d, want, role: "",
    "~user that does not exist": lambda d, want, role: "~grpo-no-such-user-xyz/x",
    "symlink loop": lambda d, want, role: _loop(d),
    "dangling symlink": lambda d, want, role: _dangling(d),
    "file vs folder": _wrong_type,
    "a file as a parent folder": lambda d, want, role: _parent_is_file(d),
}
INPUT_ONLY = {"missing": lambda d, want, role: str(d / "no" / "such" / ("x.jsonl" if want != "dir" else "dir"))}


@dataclass
class Option:
    command: str
    name: str  # the table's key
    argv: Callable[[Path, Path, str], list[str]]  # (folder, adapter, value) -> argv after `grpo`
    expect: str  # how the message names the option


def _recipe(folder: Path) -> str:
    return str(faults.recipe(folder, "sft_warmup_steps: 0\nmax_steps: 1\neval_before: false\neval_after: false\n"))


def _config_command(command: str, field: str) -> Option:
    """`grpo train` / `grpo data`: the recipe's path fields, given on the command line."""
    def argv(folder, adapter, value):
        if field == "config":
            return [command, "--config", value]
        return [command, "--config", _recipe(folder), f"--{field}", value]

    return Option(command, field, argv, "`config`" if field == "config" else f"`{field}`")


def _inference(command: str, option: str) -> Option:
    def argv(folder, adapter, value):
        tail = ["--backend", "plain"]
        out = [] if command == "generate" else ["--output", str(folder / "eval.json")]
        what = ["--prompt", "1+1?"] if command == "generate" else ["--data", "demo-arithmetic"]
        if option == "lora":
            return [command, "--lora", value, *what, *out, *tail]
        if option == "run":
            return [command, "--base", "--run", value, *what, *out, *tail]
        if option == "model":
            return [command, "--base", "--model", value, *what, *out, *tail]
        if option == "input":
            return [command, "--lora", str(adapter), "--input", value, *tail]
        if option == "output":
            return [command, "--lora", str(adapter), *what, "--output", value, *tail]
        if option == "data":
            return [command, "--lora", str(adapter), "--data", value, *out, *tail]
        return [command, "--lora", str(adapter), *what, f"--{option}", value, *out, *tail]

    return Option(command, option, argv, f"`--{option}`")


def _export(option: str) -> Option:
    def argv(folder, adapter, value):
        lora = value if option == "lora" else str(adapter)
        out = value if option == "out" else str(folder / "merged")
        return ["export", "--lora", lora, "--to", "merged16", "--out", out, "--backend", "plain"]

    return Option("export", option, argv, f"`--{option}`")


def every_option() -> list[Option]:
    """Built from grpo_pipeline.env.path_check.PATH_OPTIONS, so a path option added there is tested here."""
    def build(command: str, name: str) -> Option:
        if command in ("train", "data"):
            return _config_command(command, name)
        if command == "plot":
            return Option(command, name, lambda folder, adapter, value: ["plot", f"--{name}", value], f"`--{name}`")
        return _export(name) if command == "export" else _inference(command, name)

    return [build(command, name) for command, table in PATH_OPTIONS.items() for name in table]


CASES = [(option, kind) for option in every_option()
         for kind in [*BAD_KINDS, *(INPUT_ONLY if PATH_OPTIONS[option.command][option.name].role == "input"
                                    else {})]]


@pytest.mark.parametrize("option,kind", CASES, ids=[f"{o.command} {o.name}: {k}" for o, k in CASES])
def test_every_bad_path_is_refused_before_any_work(option, kind, adapter_dir, tmp_path, monkeypatch, capsys):
    spec = PATH_OPTIONS[option.command][option.name]
    for key, value in faults.OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GRPO_TEST_UNSET_VAR", raising=False)
    monkeypatch.setenv("GRPO_TEST_EMPTY_VAR", "")
    monkeypatch.chdir(tmp_path)
    make = {**BAD_KINDS, **INPUT_ONLY}[kind]
    value = make(tmp_path, spec.want, spec.role)
    argv = option.argv(tmp_path, adapter_dir, value)
    tripwires(monkeypatch)
    code, output = run(argv, monkeypatch, capsys)
    assert code == 2, output[-2000:]
    assert "Traceback" not in output and "internal error" not in output, output[-2000:]
    assert option.expect in output, output[-2000:]
    assert output.count("error:") == 1, output


def test_read_only_place_is_refused_for_every_output(adapter_dir, tmp_path, monkeypatch, capsys):
    """A read-only mount (simulated where the write probe meets the OS) for each output option."""
    import tempfile

    real_mkstemp = tempfile.mkstemp

    def refuse(*args, dir=None, **kwargs):  # only under new/: the recipe's own output_dir stays writable
        if dir is not None and "new" in Path(dir).parts:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.chdir(tmp_path)
    (tmp_path / "new").mkdir()
    outputs = [o for o in every_option() if PATH_OPTIONS[o.command][o.name].role == "output"]
    assert {(o.command, o.name) for o in outputs} >= {("train", "output_dir"), ("train", "data_cache_dir"),
                                                      ("generate", "output"), ("eval", "output"), ("export", "out")}
    for option in outputs:
        with monkeypatch.context() as patch:
            patch.setattr(tempfile, "mkstemp", refuse)
            tripwires(patch)
            code, output = run(option.argv(tmp_path, adapter_dir, str(tmp_path / "new" / "target")), patch, capsys)
        assert code == 2 and "read-only file system" in output and option.expect in output, (option, output)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_input_is_refused(tmp_path):
    secret = tmp_path / "secret.jsonl"
    secret.write_text("{}\n")
    secret.chmod(0)
    with pytest.raises(PathError, match="cannot be read"):
        check_path("--input", secret, INPUT_FILE)


def test_unreadable_input_is_refused_as_root_too(tmp_path, monkeypatch):
    """The read probe is a real open(): whatever refuses it (permissions, ACLs, a FUSE mount) is named."""
    import builtins

    secret = tmp_path / "secret.jsonl"
    secret.write_text("{}\n")
    real_open = builtins.open

    def guarded_open(file, *args, **kwargs):
        if Path(file) == secret:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    with pytest.raises(PathError, match=r"`--input`: .*secret.jsonl cannot be read \(Permission denied\)"):
        check_path("--input", secret, INPUT_FILE)


def test_existing_output_file_is_replaced_but_its_parent_must_take_files(tmp_path):
    target = tmp_path / "answers.jsonl"
    target.write_text("old\n")
    assert check_path("--output", str(target), OUTPUT_FILE) == target  # a file output is replaced, as `>` does


# ---------------------------------------------------------------- nothing destructive touches inputs


def _export_argv(lora: Path, out: Path, *extra: str) -> list[str]:
    return ["export", "--lora", str(lora), "--to", "merged16", "--out", str(out), "--backend", "plain", *extra]


@pytest.fixture
def run_copy(adapter_dir, tmp_path) -> Path:
    """A private copy of the run (lora/ + manifest.json + a checkpoint), so a test may try to destroy it."""
    import shutil

    run_dir = tmp_path / "my run"
    shutil.copytree(adapter_dir.parent, run_dir)
    checkpoint = run_dir / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    return run_dir


OVERLAPS = {
    "--out is the adapter": lambda run_dir: run_dir / "lora",
    "--out is the run folder": lambda run_dir: run_dir,
    "--out is inside the adapter": lambda run_dir: run_dir / "lora" / "merged",
    "--out is a checkpoint": lambda run_dir: run_dir / "checkpoint-2",
}


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "--overwrite"])
@pytest.mark.parametrize("name", list(OVERLAPS))
def test_export_never_replaces_what_it_reads(name, overwrite, run_copy, tmp_path, monkeypatch, capsys):
    before = tree_digest(run_copy)
    monkeypatch.chdir(tmp_path)
    tripwires(monkeypatch)
    out = OVERLAPS[name](run_copy)
    code, output = run(_export_argv(run_copy / "lora", out, *(["--overwrite"] if overwrite else [])),
                       monkeypatch, capsys)
    assert code == 2 and "`--out`" in output and "Traceback" not in output, output
    assert tree_digest(run_copy) == before  # the adapter, manifest and checkpoint are untouched
    assert sorted(p.name for p in run_copy.parent.iterdir() if p.name.startswith(".")) == []


def test_export_out_is_the_local_base_model(adapter_dir, tmp_path, monkeypatch, capsys):
    """The adapter's base model, when it is a folder, is read by the export: never its --out."""
    from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path

    base = Path(resolve_model_path("tiny-qwen2.5"))
    before = tree_digest(base)
    tripwires(monkeypatch)
    code, output = run(_export_argv(adapter_dir, base, "--overwrite"), monkeypatch, capsys)
    assert code == 2 and "the base model" in output, output
    assert tree_digest(base) == before


def test_overwrite_replaces_only_a_previous_export_and_restores_it_on_failure(tmp_path, monkeypatch, capsys):
    adapter_dir = faults.adapter(tmp_path / "adapter", faults.RUNNABLE_BASE)  # real exports: the demo's small model
    out = tmp_path / "merged"
    monkeypatch.chdir(tmp_path)
    code, output = run(_export_argv(adapter_dir, out), monkeypatch, capsys)
    assert code == 0, output
    assert (out / EXPORT_MARKER).is_file() and (out / "config.json").is_file()
    first = tree_digest(out)

    def fails(*args, **kwargs):
        raise RuntimeError("export failed half-way")

    with monkeypatch.context() as patch:
        patch.setattr("grpo_pipeline.pipeline.backends.plain.export", fails)
        code, output = run(_export_argv(adapter_dir, out, "--overwrite"), patch, capsys)
    assert code == 1 and "internal error" in output  # a bug, not the user's input
    assert tree_digest(out) == first  # the old export is back under its name
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".merged")] == []

    assert run(_export_argv(adapter_dir, out, "--overwrite"), monkeypatch, capsys)[0] == 0
    assert (out / EXPORT_MARKER).is_file()

    mine = tmp_path / "my-folder"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    code, output = run(_export_argv(adapter_dir, mine, "--overwrite"), monkeypatch, capsys)
    assert code == 2 and "only replaces a folder that `grpo export` wrote" in output
    assert (mine / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_output_file_never_replaces_an_input(command, run_copy, tmp_path, monkeypatch, capsys):
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"prompt": "1+1?"}\n', encoding="utf-8")
    before = tree_digest(run_copy), questions.read_bytes()
    tripwires(monkeypatch)
    lora = run_copy / "lora"
    targets = [lora / "adapter_config.json", lora / "eval.json", run_copy / "manifest.json"]
    if command == "generate":
        targets.append(questions)
    for target in targets:
        what = ["--input", str(questions)] if command == "generate" else ["--data", "demo-arithmetic"]
        code, output = run([command, "--lora", str(lora), *what, "--output", str(target), "--backend", "plain"],
                           monkeypatch, capsys)
        assert code == 2 and "`--output`" in output, (target, output)
    assert (tree_digest(run_copy), questions.read_bytes()) == before


def test_train_output_dir_is_not_the_model_folder(tmp_path, monkeypatch, capsys):
    from grpo_pipeline.pipeline.demo.model import build_tiny_qwen2

    model = tmp_path / "my model"
    build_tiny_qwen2(vocab_size=256, hidden_size=32, intermediate_size=64).save_pretrained(str(model))
    monkeypatch.chdir(tmp_path)
    tripwires(monkeypatch)
    code, output = run(["train", "--config", _recipe(tmp_path), "--model_name_or_path", str(model),
                        "--output_dir", str(model)], monkeypatch, capsys)
    assert code == 2 and "`output_dir`" in output and "model_name_or_path" in output, output


# ---------------------------------------------------------------- every (output, input folder) pair, every command


def _output_input_pairs():
    from grpo_pipeline.env.path_check import PATH_OPTIONS

    for command, table in PATH_OPTIONS.items():
        for out, out_spec in table.items():
            for src, src_spec in table.items():
                if out_spec.role == "output" and src_spec.role == "input" and src_spec.want != "file":
                    yield command, out, src


PAIRS = list(_output_input_pairs())


def _values_with(command: str, src: str, folder: Path, out: str, target: Path) -> dict:
    from grpo_pipeline.env.path_check import PATH_OPTIONS

    values = {src: str(folder), out: str(target)}
    if command == "export":
        values.setdefault("lora", str(folder))
    return {k: v for k, v in values.items() if k in PATH_OPTIONS[command]}


def test_the_pairs_cover_the_known_mistakes():
    assert {("train", "data_cache_dir", "dataset_name"), ("train", "output_dir", "dataset_name"),
            ("data", "data_cache_dir", "eval_dataset_name"), ("generate", "output", "lora"),
            ("eval", "output", "data"), ("export", "out", "lora"), ("train", "output_dir", "model_name_or_path")
            } <= set(PAIRS)


@pytest.mark.parametrize(("command", "out", "src"), PAIRS, ids=[f"{c}-{o}-in-{s}" for c, o, s in PAIRS])
def test_an_output_inside_an_input_folder_is_refused_naming_the_output(tmp_path, command, out, src):
    from grpo_pipeline.env.path_check import PATH_OPTIONS, check_command_paths

    folder = tmp_path / "input folder"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n', encoding="utf-8")
    inside = folder / ("out.jsonl" if PATH_OPTIONS[command][out].want == "file" else "sub")
    with pytest.raises(PathError) as caught:
        check_command_paths(command, _values_with(command, src, folder, out, inside))
    assert caught.value.option.lstrip("-") == out and "which this command reads" in str(caught.value)
    # beside the input folder it is fine
    beside = tmp_path / ("out.jsonl" if PATH_OPTIONS[command][out].want == "file" else "beside")
    check_command_paths(command, _values_with(command, src, folder, out, beside))


def test_a_run_folder_may_hold_the_checkpoint_it_resumes(tmp_path):
    from grpo_pipeline.env.path_check import check_command_paths

    checkpoint = tmp_path / "run" / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    assert check_command_paths("train", {"output_dir": str(tmp_path / "run"), "resume": str(checkpoint)})
