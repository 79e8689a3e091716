"""The built-in CPU demo (`grpo train` with no GPU and no config), shortened: the whole loop runs and shows it.

Format warm-up -> eval before -> GRPO -> save -> eval after -> plots + summary, with the demo's own
settings and fewer steps.
"""

import contextlib
import io
import json
import shutil

import pytest

from pipeline.config import from_mapping
from pipeline.demo.registry import cpu_demo_config
from pipeline.train import run_training

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The demo's own settings (format warm-up included) with 40 GRPO steps instead of 200: about 2 minutes.
    Its warmup/ (the warmed weights and the settings they came from) also serves the reward-hacking runs below."""
    run_dir = tmp_path_factory.mktemp("demo") / "demo"
    cfg = from_mapping({**cpu_demo_config(), "output_dir": str(run_dir), "max_steps": 40, "eval_limit": 20,
                        "save_steps": 100, "eval_steps": 20})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = run_training(cfg)
    return run_dir, result, printed.getvalue()


def test_shortened_demo_learns_and_writes_plots_and_summary(demo_run):
    run_dir, result, printed = demo_run
    assert result.status == "completed" and result.steps == 40
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


# --- reward up, held-out accuracy down, on the real demo model (hacking_window, hacking_action) -------------


def _after_warmup(demo_run, tmp_path, **settings):
    """30 GRPO steps from the demo's warmed-up model (its warmup/ copied in, so the warm-up is reused, not
    retrained), held-out accuracy on all 100 held-out sums every 5 steps."""
    run_dir = tmp_path / "run"
    shutil.copytree(demo_run[0] / "warmup", run_dir / "warmup")
    cfg = from_mapping({**cpu_demo_config(), "output_dir": str(run_dir), "max_steps": 30, "save_steps": 100,
                        "eval_steps": 5, "eval_limit": 100, "eval_before": False, "eval_after": False,
                        "hacking_window": 3, **settings})
    result = run_training(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    return run_dir, result, evals


def test_a_gamed_reward_rises_while_held_out_accuracy_falls_and_the_hacking_rule_stops_the_run(demo_run, tmp_path):
    """train_helpers.first_operand_reward pays for the sloppy teacher's wrong answer (the first operand): GRPO
    learns it, the training reward rises, and held-out accuracy on the real sums falls (21% -> 10% -> 6% when
    last measured). At the demo's own learning rate the fall was 14% -> 8% -> 2% with the packages of the day it
    was written, and 26% -> 20% -> 15% (inside the rule's sampling noise) with later ones: 3x the rate makes the
    hacking unmistakable (1e-3 collapses accuracy to 0% within 10 steps, before the rule has 3 evals)."""
    reward = ["strict_format", "train_helpers:first_operand_reward"]
    run_dir, result, evals = _after_warmup(demo_run, tmp_path, reward_funcs=reward, hacking_action="stop",
                                           learning_rate=6e-4)
    assert result.status == "stopped" and result.exit_code == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["health"]["stop_rule"] == "hacking"
    stop_step = summary["health"]["stop_step"]
    assert stop_step == evals[-1][0] and stop_step < 30  # it stopped at the eval that completed the pattern
    accuracies = [a for _, a in evals[-3:]]
    assert accuracies == sorted(accuracies, reverse=True) and accuracies[0] - accuracies[-1] >= 0.08, evals
    reason = summary["stop_reason"]
    assert "the training reward rose (" in reason and "held-out accuracy fell (" in reason
    assert (run_dir / f"checkpoint-{stop_step}" / "trainer_state.json").is_file()
    # best_lora/ keeps the adapter of the best held-out accuracy: before the policy learned the wrong answer
    best = json.loads((run_dir / "best_lora" / "grpo_best.json").read_text())
    assert best["accuracy"] == max(a for _, a in evals) and best["step"] == evals[0][0]


def test_an_honest_run_at_its_plateau_does_not_look_like_reward_hacking(demo_run, tmp_path):
    """The demo's own rewards on the same schedule: accuracy climbs and then wobbles by a point or so at its
    plateau (90% -> 89% -> 89% when written) while the reward still moves: within chance, no warning."""
    run_dir, result, evals = _after_warmup(demo_run, tmp_path, hacking_action="stop")
    assert result.status == "completed" and result.steps == 30
    assert evals[-1][1] >= evals[0][1] + 0.2, evals  # it learned
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not any("reward hacking" in warning for warning in summary["health_warnings"])
