"""Shared pieces for tests that drive the real CLI in-process: the fault table's set-up helpers and one run.

Not a test module (pytest collects only test_*.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import fault_kit

from grpo_pipeline.pipeline import cli

ROOT = Path(__file__).resolve().parents[1]


def fault_table():
    """The fault table's set-up helpers (tests/fault_kit.py: recipe, train, adapter, trained_checkpoint, ...)."""
    return fault_kit


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """`grpo ARGV` through grpo_pipeline.pipeline.cli.main: (exit status, stdout + stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as stop:  # argparse's own exits
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@contextmanager
def own_cache_root(tmp_path_factory) -> Iterator[Path]:
    """A fresh GRPO_CACHE_DIR for a test module (its built-in model built once, its crash logs in its logs/)."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRPO_CACHE_DIR", str(root))
        yield root
