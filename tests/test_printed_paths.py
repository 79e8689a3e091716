"""Every path a command reports having written is printed as a shell word: pasted back into a shell (or split
with shlex) it names that path, whatever it holds (spaces, quotes, non-ASCII). The class: each command's own
"wrote X" / "exported to X" / "report: X" line, for an output named by the user."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.cli_helpers import fault_table, run_cli

faults = fault_table()
ROOT = Path(__file__).resolve().parents[1]
ODD = "my run's 数据"  # a space, a quote and non-ASCII (a `$` is refused: env/path_check.py expands none)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return faults.adapter(tmp_path_factory.mktemp("adapter-home"))


def writers(folder: Path, lora: Path) -> dict[str, tuple[list[str], Path]]:
    """command -> (argv, the path it must print as a shell word)."""
    out = folder / ODD
    return {
        "export --out": (["export", "--lora", str(lora), "--to", "merged16", "--out", str(out), "--backend", "plain"],
                         out),
        "generate --output": (["generate", "--lora", str(lora), "--prompt", "1+1?", "--max_tokens", "4",
                               "--backend", "plain", "--output", str(out / "a.jsonl")], out / "a.jsonl"),
        "eval --output": (["eval", "--lora", str(lora), "--data", "demo-arithmetic", "--limit", "2", "--max_tokens",
                           "4", "--backend", "plain", "--output", str(out / "e.json")], out / "e.json"),
        "plan --write": (["plan", "--config", str(ROOT / "configs" / "qwen2.5-1.5b-gsm8k.yaml"), "--gpu", "T4",
                          "--write", str(out / "fitted.yaml")], out / "fitted.yaml"),
    }


@pytest.mark.parametrize("command", list(writers(Path("/x"), Path("/y"))))
def test_a_written_path_is_printed_so_that_it_pastes_back(command, adapter, tmp_path, capsys):
    argv, path = writers(tmp_path, adapter)[command]
    path.parent.mkdir(parents=True, exist_ok=True)
    code, output = run_cli(argv, capsys)
    assert code == 0, output[-3000:]
    assert path.exists(), output[-2000:]
    lines = [line for line in output.splitlines() if ODD in line or shlex.quote(str(path)) in line]
    assert lines, output[-2000:]
    # every line naming it splits (as a shell would) into words one of which is exactly the path
    assert all(str(path) in shlex.split(line.replace("(", " ").replace(")", " ").replace(";", " "))
               for line in lines if "wrote" in line or "exported" in line), lines
