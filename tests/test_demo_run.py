"""The built-in CPU demo (`grpo train` with no GPU and no config), shortened: the whole loop runs and shows it.

Format warm-up -> eval before -> GRPO -> save -> eval after -> plots + summary, with the demo's own
settings and fewer steps.
"""

import json

import pytest

from pipeline.config import from_mapping
from pipeline.demo.registry import cpu_demo_config
from pipeline.train import run_training

pytestmark = pytest.mark.slow


def test_shortened_demo_learns_and_writes_plots_and_summary(tmp_path, capsys):
    """The demo's own settings (format warm-up included) with 40 GRPO steps instead of 200: about 2 minutes."""
    run_dir = tmp_path / "demo"
    cfg = from_mapping({**cpu_demo_config(), "output_dir": str(run_dir), "max_steps": 40, "eval_limit": 20,
                        "save_steps": 100, "eval_steps": 20})
    result = run_training(cfg)
    assert result.status == "completed" and result.steps == 40
    printed = capsys.readouterr().out
    # The warm-up reports in readable lines (5 of them), not in the raw dicts of transformers' printer.
    assert printed.count("[grpo] warm-up step ") == 5 and "[grpo] warm-up step 1000/1000: loss " in printed
    assert "{'loss'" not in printed

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 40 and summary["wall_time_s"] > 0
    before, after = summary["eval_before"], summary["eval_after"]
    assert before["n"] == after["n"] == 20
    # The warm-up taught the answer format that the random model never produces ...
    assert before["format_rate"] >= 0.9 and after["format_rate"] >= 0.9
    # ... and GRPO's correctness reward rises within 40 steps (the sloppy teacher's habit fades) ...
    records = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    correctness = [r["rewards/correctness_reward_func/mean"] for r in records]
    assert len(correctness) == 40
    first, last = sum(correctness[:10]) / 10, sum(correctness[-10:]) / 10
    assert last >= first + 0.5, correctness  # on the reward's 0..2 scale
    # ... and that shows on held-out problems the run never trained on.
    assert after["accuracy"] >= before["accuracy"] + 0.15, (before, after)
    assert summary["accuracy_gain_points"] == round(100 * (after["accuracy"] - before["accuracy"]), 1)
    for name in ("reward.png", "completion_length.png", "health.png", "reward_correctness_reward_func.png"):
        assert (run_dir / "plots" / name).stat().st_size > 5_000, name
    assert (run_dir / "lora" / "adapter_config.json").is_file() and (run_dir / "manifest.json").is_file()
    # eval_steps (on in the demo): held-out accuracy at steps 20 and 40, the best adapter kept in best_lora/
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    assert sorted(evals) == [20, 40] and evals[40] == after["accuracy"]  # the same greedy eval as eval_after
    best_step = min(step for step, accuracy in evals.items() if accuracy == max(evals.values()))
    assert summary["best"] == {"step": best_step, "accuracy": max(evals.values())}
    assert (run_dir / "best_lora" / "grpo_adapter.json").is_file() and (run_dir / "plots" / "eval.png").is_file()
