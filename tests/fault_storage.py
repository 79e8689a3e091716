"""The fault table's cases (tests/fault_table.py) of faults v3: writers and storage (issue 36, points 1 and 2)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

from fault_kit import RUNNABLE_BASE, Fault, adapter, export_onto, generate_with, mine, quick, recipe

CASES: list[Fault] = []  # this part's cases, in the table's order

# ---------------------------------------------------------------- faults v3: writers and storage
# (issue 36, points 1 and 2: env/paths.py publish re-checks what each writer saw at its start; env/disk.py
# storage_failure at the one boundary, pipeline/errors.py run_command. tests/test_writers.py runs every writer x
# appeared / changed / second writer; tests/test_storage.py every command on a real full and read-only tmpfs.)


def os_fails(name: str, number: int, under: str = "") -> Callable:
    """`os.<name>` fails with errno `number` (for paths containing `under`, when given), as a full disk or a
    read-only mount makes it fail."""
    def patch(monkeypatch, folder: Path) -> None:
        real = getattr(os, name)

        def fail(*args, **kwargs):
            if not under or under in os.fsdecode(args[0] if args else ""):
                raise OSError(number, os.strerror(number), *([os.fsdecode(args[0])] if under else []))
            return real(*args, **kwargs)

        monkeypatch.setattr(os, name, fail)

    return patch


def meanwhile(target: str, make: Callable[[Path], None]) -> Callable:
    """While the command runs (when it calls `target`), `make(folder)` puts something where it will publish."""
    def patch(monkeypatch, folder: Path) -> None:
        from tests.train_helpers import resolve_dotted

        owner, attr = resolve_dotted(target)
        real, done = getattr(owner, attr), []

        def first(*args, **kwargs):
            if not done:
                done.append(target)
                make(folder)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, attr, first)

    return patch


def mine_kept(path: str) -> Callable[[Path], Optional[str]]:
    def after(folder: Path) -> Optional[str]:
        kept = folder / path / "mine.txt"
        return None if kept.is_file() and kept.read_text(encoding="utf-8") == "mine" else f"{kept} was deleted"
    return after


def another_export(folder: Path) -> None:
    """The same export, started after this one checked --out, finishing first."""
    from grpo_pipeline.pipeline import cli

    argv = ["export", "--lora", str(folder / "run" / "lora"), "--to", "merged16", "--out", str(folder / "merged"),
            "--backend", "plain"]
    assert cli.main(argv) == 0


def no_complete_cache_entry(folder: Path) -> Optional[str]:
    from grpo_pipeline.pipeline.data.cache import entry_is_complete

    cache = folder / "cache"
    entries = [p for p in cache.iterdir() if entry_is_complete(p) or ".tmp-" in p.name] if cache.is_dir() else []
    return f"the data cache holds {entries} after a failed save" if entries else None


def nothing_at(path: str) -> Callable[[Path], Optional[str]]:
    return lambda folder: f"{path} was left behind" if (folder / path).exists() else None


def data_cache_full(monkeypatch, folder: Path) -> None:
    """pyarrow/datasets' write of the prepared rows meets a full disk."""
    import errno

    import datasets

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", full)


CASES += [
    Fault("export --out made by the user while exporting", lambda d: export_onto(d, "new"),
          "appeared after this command started", patch=meanwhile("grpo_pipeline.pipeline.infer.export.carry_training_defaults",
                                                                 lambda d: mine(d / "merged")),
          after=mine_kept("merged")),
    Fault("two exports to one --out", lambda d: export_onto(d, "new"), "Pass --overwrite to replace it",
          patch=meanwhile("grpo_pipeline.pipeline.infer.export.carry_training_defaults", another_export)),
    Fault("generate --output written by another program meanwhile",
          lambda d: generate_with(d, "--prompt", "1+1?", "--max_tokens", "4", "--output", str(d / "out" / "a.jsonl")),
          "appeared after this command started",
          patch=meanwhile("grpo_pipeline.pipeline.infer.generate.generate_answers", lambda d: mine(d / "out" / "a.jsonl"))),
    Fault("the data cache saved to a full disk", lambda d: ["data", "--config", str(recipe(d))],
          "the disk is full: could not save in", patch=data_cache_full, after=no_complete_cache_entry),
    Fault("generate --output on a full disk",
          lambda d: generate_with(d, "--prompt", "1+1?", "--max_tokens", "4", "--output", str(d / "a.jsonl")),
          "point --output at a larger disk", patch=os_fails("open", 28, under="a.jsonl"), after=nothing_at("a.jsonl")),
    Fault("eval --output on a full disk",
          lambda d: ["eval", "--lora", str(adapter(d, RUNNABLE_BASE)), "--data", "demo-arithmetic", "--limit", "2", "--max_tokens",
                     "4", "--output", str(d / "e.json"), "--backend", "plain"],
          "point --output at a larger disk", patch=os_fails("open", 28, under="e.json"), after=nothing_at("e.json")),
    Fault("the built-in model built into a read-only cache root", lambda d: quick(d),
          "Point GRPO_CACHE_DIR (the cache root", env={"GRPO_CACHE_DIR": "/grpo-faults-ro-cache"},
          patch=os_fails("mkdir", 30, under="/grpo-faults-ro-cache")),
    Fault("output_dir on a full disk (the run's first write)", lambda d: quick(d),
          "point output_dir at a larger disk", patch=os_fails("fsync", 28)),
]
