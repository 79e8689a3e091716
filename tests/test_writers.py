"""Every writer of a user-visible path against what can happen to that path while the command runs.

The class: export --out, generate --output, eval --output, the reward dry-run file, data_report.json, the data
cache, the built-in model and tokenizer caches, best_lora/, lora/ and eval_before.json. Each takes what it saw
at its start (grpo_pipeline.env.locations.snapshot) to the one publish step (grpo_pipeline.env.paths.publish), which replaces only that. Three
cases, each made to happen between the writer's start and its publish (inside the function it runs meanwhile):

- appeared: nothing was there; the user made a folder or file there meanwhile;
- changed: an earlier version the writer may replace was there (an old export with --overwrite, last run's
  answers, ...); it was changed meanwhile;
- second writer: nothing was there; another run of the same writer published its complete copy first.

The user's or the other writer's copy is never deleted or replaced. The command exits 2 naming the path
(PathChangedError); a cache keeps the other process's complete copy and goes on with it (the first complete copy
wins), which is no loss. No staging copy is left beside the path.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest

from grpo_pipeline.env.locations import PathChangedError
from grpo_pipeline.pipeline.data.cache import DATASET_IN_CACHE, REPORT_IN_CACHE
from grpo_pipeline.pipeline.demo.model import built_dir
from tests.cli_helpers import fault_table, own_cache_root, run_cli

QUICK = "sft_warmup_steps: 0\nmax_steps: 1\nsave_steps: 1\neval_before: false\neval_after: false\n"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with own_cache_root(tmp_path_factory) as root:
        yield root


@pytest.fixture(scope="module")
def lora(cache, tmp_path_factory) -> Path:
    """A real LoRA on the built-in demo model, the one the train rows build anyway (its byte tokenizer loads at once;
    the tiny Qwen2's real Qwen2.5 tokenizer and 151k-row vocabulary cost each generate, eval and export seconds)."""
    return fault_table().adapter(tmp_path_factory.mktemp("writers"), base="tiny-demo")


@pytest.fixture(scope="module")
def finished_run(cache, tmp_path_factory) -> Path:
    """A complete one-step run (checkpoint-1, lora/, manifest, summary): resumed to step 2 by the lora/ rows."""
    work = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        assert run_cli_quiet(["train", "--config", recipe(work)]) == 0
    return work / "run"


def run_cli_quiet(argv: list[str]) -> int:
    from grpo_pipeline.pipeline import cli

    return cli.main(argv)


def recipe(work: Path, text: str = "") -> str:
    """The fault table's tiny-demo recipe, QUICK, then `text` (whose keys replace QUICK's)."""
    keys = {line.split(":", 1)[0] for line in text.splitlines()}
    quick = "".join(line + "\n" for line in QUICK.splitlines() if line.split(":", 1)[0] not in keys)
    return str(fault_table().recipe(work, quick + text))


@dataclass
class Writer:
    target: Callable[[Path], Path]  # where it writes, in the test's folder
    during: str  # a function it calls between its start and its publish (dotted)
    run: Callable[[Path, Path], list[str]]  # (folder, lora) -> `grpo` argv; or a call returning None (library)
    kind: str = "dir"  # "dir" or "file"
    earlier: Callable[[Path, Path], object] = None  # (target, lora): an earlier version it may replace, at target
    theirs: Callable[[Path, Path], object] = None  # (target, lora): a complete copy as another run of it publishes
    shares: bool = False  # a cache: another process's complete copy is kept and used
    prepare: Optional[Callable[[Path, Path, Path], Path]] = None  # (folder, lora, finished_run) -> folder to use


def write_mine(target: Path, kind: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "file":
        target.write_text("mine\n", encoding="utf-8")
    else:
        target.mkdir()
        (target / "mine.txt").write_text("mine\n", encoding="utf-8")


def change(target: Path, kind: str) -> None:
    if kind == "file":
        target.write_text("changed meanwhile\n", encoding="utf-8")
    else:
        (target / "added meanwhile.txt").write_text("mine\n", encoding="utf-8")


def content(target: Path) -> object:
    if target.is_file():
        return target.read_bytes()
    if not target.is_dir():
        return None
    return {str(p.relative_to(target)): p.read_bytes() for p in sorted(target.rglob("*")) if p.is_file()}


def old_export(target: Path, lora: Path) -> None:
    from grpo_pipeline.env.path_check import EXPORT_MARKER

    target.mkdir()
    (target / EXPORT_MARKER).write_text('{"to": "merged16"}', encoding="utf-8")
    (target / "config.json").write_text("{}", encoding="utf-8")


def text_file(text: str) -> Callable[[Path, Path], None]:
    return lambda target, lora: target.write_text(text, encoding="utf-8")


def folder_with(*names: str) -> Callable[[Path, Path], None]:
    """A folder holding `names` (a name ending in / is a folder)."""
    def make(target: Path, lora: Path) -> None:
        target.mkdir(parents=True)
        for name in names:
            (target / name).mkdir() if name.endswith("/") else (target / name).write_text("{}", encoding="utf-8")
    return make


def a_built_model(target: Path, lora: Path) -> None:
    """Another process's complete build of the built-in model (its config and its build record)."""
    from grpo_pipeline.pipeline.demo.model import BUILD_NAME, build_inputs
    from grpo_pipeline.env.kept import record

    folder_with("config.json")(target, lora)
    (target / BUILD_NAME).write_text(json.dumps(record(build_inputs("tiny-demo"))), encoding="utf-8")


def the_adapter(target: Path, lora: Path) -> None:
    shutil.copytree(lora, target)


def best_of(accuracy: float) -> Callable[[Path, Path], None]:
    def make(target: Path, lora: Path) -> None:
        from grpo_pipeline.env.kept import record

        shutil.copytree(lora, target)  # a kept best measured from the same (here: no) evaluation inputs
        (target / "grpo_best.json").write_text(json.dumps(record({}, step=1, accuracy=accuracy)), encoding="utf-8")
    return make


def data_entry(folder: Path) -> Path:
    """The data cache entry `grpo data` writes for the recipe below (the cache key's folder): found by a first
    run into a scratch cache."""
    scratch = folder / "scratch-cache"
    assert run_cli_quiet(["data", "--config", recipe(folder, f"data_cache_dir: {scratch}\n")]) == 0
    entries = [p for p in scratch.iterdir() if not p.name.startswith(".")]  # the train set's and the eval set's
    first = min(entries, key=lambda p: (p / REPORT_IN_CACHE).stat().st_mtime_ns)  # the first one built
    return folder / "cache" / first.name


def resumed(folder: Path, lora: Path, run: Path) -> Path:
    shutil.copytree(run, folder / "run")
    shutil.rmtree(folder / "run" / "lora")  # what the cases put there (or nothing) is lora/ at the start
    return folder


def library(call: Callable[[Path], object]) -> Callable[[Path, Path], None]:
    def run(folder: Path, lora: Path) -> None:
        call(folder)
    run.library = True
    return run


def best_lora_offer(folder: Path) -> None:
    from grpo_pipeline.pipeline.infer.periodic_eval import BestAdapter

    def save(model, staging: Path) -> None:
        shutil.copytree(model, staging, dirs_exist_ok=True)

    best = BestAdapter(folder / "run", save, resume=True)
    best.offer(folder / "adapter", step=5, result={"accuracy": 0.9, "format_rate": 1.0, "n": 2})


def prepare_best(folder: Path, lora: Path, run: Path) -> Path:
    shutil.copytree(lora, folder / "adapter")
    (folder / "run").mkdir(exist_ok=True)
    return folder


WRITERS: dict[str, Writer] = {
    "export --out": Writer(
        lambda d: d / "merged", "grpo_pipeline.pipeline.infer.export.carry_training_defaults",
        lambda d, lora: ["export", "--lora", str(lora), "--to", "merged16", "--out", str(d / "merged"), "--backend",
                         "plain", *(["--overwrite"] if (d / "merged").exists() else [])],
        earlier=old_export, theirs=old_export),
    "generate --output": Writer(
        lambda d: d / "answers.jsonl", "grpo_pipeline.pipeline.infer.generate.generate_answers",
        lambda d, lora: ["generate", "--lora", str(lora), "--prompt", "1+1?", "--max_tokens", "4", "--backend",
                         "plain", "--output", str(d / "answers.jsonl")],
        kind="file", earlier=text_file('{"text": "last run"}\n'), theirs=text_file('{"text": "theirs"}\n')),
    "eval --output": Writer(
        lambda d: d / "eval.json", "grpo_pipeline.pipeline.infer.evaluate.evaluate_rows",
        lambda d, lora: ["eval", "--lora", str(lora), "--data", "demo-arithmetic", "--limit", "2", "--max_tokens", "4",
                         "--backend", "plain", "--output", str(d / "eval.json")],
        kind="file", earlier=text_file('{"n": 1}\n'), theirs=text_file('{"n": 2}\n')),
    "rewards: reward_dry_run.json": Writer(
        lambda d: d / "run" / "reward_dry_run.json", "grpo_pipeline.pipeline.infer.dry_run.verdicts",
        lambda d, lora: ["rewards", "--config", recipe(d), "--prompts", "2"],
        kind="file", earlier=text_file("{}\n"), theirs=text_file('{"prompts": 2}\n'),
        prepare=lambda d, lora, run: (d / "run").mkdir() or d),
    "data: data_report.json": Writer(
        lambda d: d / "run" / "data_report.json", "grpo_pipeline.pipeline.data.prepare._build",
        lambda d, lora: ["data", "--config", recipe(d)],
        kind="file", earlier=text_file("{}\n"), theirs=text_file('{"status": "ok"}\n'),
        prepare=lambda d, lora, run: (d / "run").mkdir() or d),
    "data: the cache entry": Writer(
        lambda d: data_entry(d), "grpo_pipeline.pipeline.data.prepare._build",
        lambda d, lora: ["data", "--config", recipe(d)],
        earlier=folder_with("stray.txt"), theirs=folder_with(f"{DATASET_IN_CACHE}/", REPORT_IN_CACHE), shares=True),
    "the built-in model cache": Writer(
        lambda d: built_dir("tiny-demo", d / "models"), "grpo_pipeline.pipeline.demo.model.build_tiny_qwen2",
        library(lambda d: __import__("grpo_pipeline.pipeline.demo.model", fromlist=["x"]).demo_model_dir(d / "models")),
        earlier=folder_with("stray.txt"), theirs=a_built_model, shares=True,
        prepare=lambda d, lora, run: (d / "models").mkdir() or d),
    "the bundled tokenizer cache": Writer(
        lambda d: d / "tok" / __import__("grpo_pipeline.pipeline.assets", fromlist=["x"]).QWEN_TOKENIZER_CACHE_NAME,
        "grpo_pipeline.pipeline.assets.shutil.copy2",
        library(lambda d: __import__("grpo_pipeline.pipeline.assets", fromlist=["x"]).qwen_tokenizer_dir()),
        earlier=folder_with("stray.txt"), theirs=folder_with("tokenizer.json"), shares=True,
        prepare=lambda d, lora, run: (d / "tok").mkdir() or d),
    "best_lora/": Writer(
        lambda d: d / "run" / "best_lora", "grpo_pipeline.pipeline.infer.periodic_eval.atomic_write_json_in_staging",
        library(best_lora_offer), earlier=best_of(0.1), theirs=best_of(0.5), prepare=prepare_best),
    "train: eval_before.json": Writer(
        lambda d: d / "run" / "eval_before.json", "grpo_pipeline.pipeline.infer.evaluate.evaluate_rows",
        lambda d, lora: ["train", "--config", recipe(d, "eval_before: true\neval_limit: 2\n")],
        kind="file", earlier=text_file('{"key": "another eval set"}\n'), theirs=text_file('{"key": "theirs"}\n'),
        prepare=lambda d, lora, run: (d / "run").mkdir() or d),
    "train: lora/": Writer(
        lambda d: d / "run" / "lora", "grpo_pipeline.pipeline.backends.plain.save_adapter",
        lambda d, lora: ["train", "--config", recipe(d, "max_steps: 2\n"), "--resume", "auto"],
        earlier=the_adapter, theirs=the_adapter, prepare=resumed),
}
CASES = ["appeared", "changed", "second writer"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", list(WRITERS))
def test_a_writer_never_replaces_what_appeared_or_changed_since_it_started(name, case, cache, lora, request,
                                                                           tmp_path, monkeypatch, capsys):
    writer = WRITERS[name]
    run = request.getfixturevalue("finished_run") if name == "train: lora/" else None
    folder = writer.prepare(tmp_path, lora, run) if writer.prepare else tmp_path
    monkeypatch.chdir(folder)
    if name == "the bundled tokenizer cache":
        monkeypatch.setenv("GRPO_CACHE_DIR", str(folder / "tok"))
    target = writer.target(folder)
    if case == "changed":
        writer.earlier(target, lora)
    recorded: dict[str, object] = {}

    def meanwhile() -> None:
        if recorded:
            return
        if case == "appeared":
            write_mine(target, writer.kind)
        elif case == "changed":
            change(target, writer.kind)
        else:
            writer.theirs(target, lora)
        recorded["content"] = content(target)

    _run_meanwhile(monkeypatch, writer.during, meanwhile)
    if getattr(writer.run, "library", False):
        try:
            writer.run(folder, lora)
            code, output = 0, ""
        except PathChangedError as err:
            code, output = 2, f"error: {err}"
    else:
        code, output = run_cli(writer.run(folder, lora), capsys)
    assert recorded, (f"{writer.during} was not called: the case never happened", output[-2000:])
    assert content(target) == recorded["content"], "what appeared or changed meanwhile was replaced or deleted"
    if writer.shares and case == "second writer":
        assert code == 0, output[-3000:]  # the cache's first complete copy wins; this run uses it
    else:
        assert code == 2 and "Traceback" not in output, output[-3000:]
        assert str(target) in output and "after this command started" in output, output[-3000:]
    assert sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.")) == []


def _run_meanwhile(monkeypatch, dotted: str, meanwhile: Callable[[], None]) -> None:
    """Make the function at `dotted` call `meanwhile` first (once), then do its own work."""
    if dotted == "grpo_pipeline.pipeline.infer.periodic_eval.atomic_write_json_in_staging":
        import grpo_pipeline.env.paths

        original = grpo_pipeline.env.paths.atomic_write_json

        def first(path, *args, **kwargs):
            if ".best_lora.tmp-" in str(path):
                meanwhile()
            return original(path, *args, **kwargs)

        monkeypatch.setattr(grpo_pipeline.env.paths, "atomic_write_json", first)
        return
    from tests.train_helpers import resolve_dotted

    owner, attr = resolve_dotted(dotted)
    original = getattr(owner, attr)

    def wrapped(*args, **kwargs):
        meanwhile()
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, attr, wrapped)


# ---------------------------------------------------------------- the publish step itself


def test_two_exports_to_one_out_the_second_is_refused_without_overwrite(cache, lora, tmp_path, monkeypatch, capsys):
    """Both checked --out while it was free; the first to finish keeps it, the second exits 2 naming it."""
    monkeypatch.chdir(tmp_path)
    argv = ["export", "--lora", str(lora), "--to", "merged16", "--out", str(tmp_path / "merged"), "--backend", "plain"]
    second: dict[str, object] = {}
    import grpo_pipeline.pipeline.infer.export as export

    original = export.carry_training_defaults

    def finish_the_other_first(folder, manifest):
        if not second:
            second["started"] = True
            second["code"] = run_cli(argv, capsys)[0]  # the other export, started after this one checked --out
            second["content"] = content(tmp_path / "merged")
        return original(folder, manifest)

    monkeypatch.setattr(export, "carry_training_defaults", finish_the_other_first)
    code, output = run_cli(argv, capsys)
    assert second["code"] == 0 and code == 2, output
    assert "--out" in output and "--overwrite" in output and content(tmp_path / "merged") == second["content"]


def test_what_is_seen_covers_a_file_deep_inside_a_folder(tmp_path):
    from grpo_pipeline.env.locations import snapshot

    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "sub" / "weights.bin").write_bytes(b"1")
    seen = snapshot(tmp_path / "out")
    (tmp_path / "out" / "sub" / "weights.bin").write_bytes(b"22")
    assert snapshot(tmp_path / "out").identity != seen.identity


@pytest.mark.parametrize("swap", [True, False], ids=["renameat2", "without renameat2"])
def test_publish_replaces_only_what_was_seen(swap, tmp_path, monkeypatch):
    """With and without renameat2 (RENAME_EXCHANGE / NOREPLACE): the recorded version is replaced, anything else
    refused and kept."""
    import grpo_pipeline.env.paths
    from grpo_pipeline.env.locations import snapshot
    from grpo_pipeline.env.paths import atomic_write_text

    if not swap:
        monkeypatch.setattr(grpo_pipeline.env.paths, "_renameat2", lambda src, dst, flags: False)
    target = tmp_path / "out.json"
    target.write_text("old")
    seen = snapshot(target)
    atomic_write_text(target, "new", seen=seen)  # unchanged since: replaced
    assert target.read_text() == "new"
    with pytest.raises(PathChangedError, match="changed after this command started"):
        atomic_write_text(target, "newer", seen=seen)  # what it saw is gone: "new" is someone else's now
    assert target.read_text() == "new"
    fresh = snapshot(tmp_path / "made.json")
    (tmp_path / "made.json").write_text("mine")
    with pytest.raises(PathChangedError, match="appeared after this command started"):
        atomic_write_text(tmp_path / "made.json", "ours", seen=fresh)
    assert (tmp_path / "made.json").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made.json", "out.json"]
    assert json.dumps(sorted(p.name for p in tmp_path.iterdir()))  # nothing hidden is left
