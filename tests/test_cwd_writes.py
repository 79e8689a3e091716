"""Whatever folder a command is run from, it writes only inside the folders its options name: every command,
run from a fresh empty folder with its outputs named elsewhere, leaves that folder empty."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli_helpers import fault_table, run_cli

faults = fault_table()
ROOT = Path(__file__).resolve().parents[1]
QUICK_RUN = "sft_warmup_steps: 0\nmax_steps: 1\nsave_steps: 1\neval_before: false\neval_after: false\neval_limit: 2\n"


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """A cache root, a recipe whose run folder and data cache are named, and a saved adapter: all outside cwd."""
    root = tmp_path_factory.mktemp("named")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRPO_CACHE_DIR", str(root / "grpo-cache"))
        recipe = faults.recipe(root, QUICK_RUN)
        # A recipe without output_dir (its default is relative): `grpo eval` reads only its eval set, so the
        # run folder it names is none of eval's business (it once put data_report_eval.json under the cwd).
        bare = root / "no-output-dir.yaml"
        bare.write_text("".join(line for line in recipe.read_text(encoding="utf-8").splitlines(keepends=True)
                                if not line.startswith("output_dir:")), encoding="utf-8")
        logged = root / "logged-run"  # what `grpo plot` reads: a run folder's metrics.jsonl
        logged.mkdir()
        (logged / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5, "loss": 0.1}\n')
        yield {"root": root, "recipe": str(recipe), "bare": str(bare),
               "adapter": str(faults.adapter(root / "adapter-home"))}


def commands(p: dict) -> dict[str, list[str]]:
    out = p["root"]
    return {
        "env": ["env", "--json"],
        "data": ["data", "--config", p["recipe"]],
        "plan": ["plan", "--config", str(ROOT / "configs" / "qwen2.5-1.5b-gsm8k.yaml"), "--gpu_memory_gb", "24"],
        "rewards": ["rewards", "--config", p["recipe"], "--prompts", "2"],
        "train --check": ["train", "--check", "--config", p["recipe"]],
        "train": ["train", "--config", p["recipe"]],
        "generate": ["generate", "--lora", p["adapter"], "--prompt", "1+1?", "--backend", "plain", "--max_tokens",
                     "4"],
        "eval --config": ["eval", "--lora", p["adapter"], "--config", p["recipe"], "--limit", "2", "--max_tokens",
                          "4", "--backend", "plain", "--output", str(out / "eval.json")],
        "eval --config without output_dir": ["eval", "--lora", p["adapter"], "--config", p["bare"], "--limit", "2",
                                             "--max_tokens", "4", "--backend", "plain", "--output",
                                             str(out / "eval2.json")],
        "export": ["export", "--lora", p["adapter"], "--to", "merged16", "--out", str(out / "merged"), "--backend",
                   "plain"],
        "plot": ["plot", "--run", str(out / "logged-run")],
    }


PLACEHOLDERS = {"root": Path("/x"), "recipe": "r", "bare": "b", "adapter": "a"}


def test_the_table_holds_every_command():
    from grpo_pipeline.pipeline.cli import COMMANDS

    assert {name.split()[0] for name in commands(PLACEHOLDERS)} == set(COMMANDS)


@pytest.mark.parametrize("command", list(commands(PLACEHOLDERS)))
def test_a_command_run_from_another_folder_writes_nothing_there(command, places, tmp_path, monkeypatch, capsys):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    code, output = run_cli(commands(places)[command], capsys)
    assert code == 0, output[-3000:]
    assert sorted(os.listdir(cwd)) == [], output[-2000:]
