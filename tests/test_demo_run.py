"""The built-in CPU demo (`grpo train` with no GPU and no config), shortened: the whole loop runs and shows it.

Format warm-up -> eval before -> GRPO -> save -> eval after -> plots + summary, with the demo's own
settings and fewer steps.
"""

import json

import pytest

from pipeline.config import from_mapping
from pipeline.demo import DEMO_CONFIG
from pipeline.train import run_training

pytestmark = pytest.mark.slow


def test_shortened_demo_learns_the_format_and_writes_plots_and_summary(tmp_path):
    run_dir = tmp_path / "demo"
    cfg = from_mapping({**DEMO_CONFIG, "output_dir": str(run_dir), "sft_warmup_steps": 400, "max_steps": 10,
                        "logging_steps": 1, "save_steps": 100})
    result = run_training(cfg)
    assert result.status == "completed" and result.steps == 10

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 10 and summary["wall_time_s"] > 0
    before, after = summary["eval_before"], summary["eval_after"]
    assert before["n"] == after["n"] == 20
    # The warm-up taught the answer format that the untrained model never produces ...
    assert before["format_rate"] >= 0.5 and after["format_rate"] >= 0.5
    # ... so GRPO's reward rises from the random model's 0 (every format reward needs the tags).
    rewards = [r["reward"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
               if "reward" in r]
    assert len(rewards) == 10 and min(rewards) > 0.5, rewards
    for name in ("reward.png", "completion_length.png", "health.png", "reward_correctness_reward_func.png"):
        assert (run_dir / "plots" / name).stat().st_size > 5_000, name
    assert (run_dir / "model" / "config.json").is_file() and (run_dir / "manifest.json").is_file()
