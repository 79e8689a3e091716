"""The built-in CPU demo (`grpo train` with no GPU and no config), shortened: the whole loop runs and shows it.

Format warm-up -> eval before -> GRPO -> save -> eval after -> plots + summary, with the demo's own
settings and fewer steps: the notebook's smoke warm-up (DEMO_RUN_WARMUP_STEPS, 700, the demo's own) and
DEMO_RUN_STEPS of its 100 GRPO steps. The whole demo runs in CI as .ci/run's main job (`grpo train`).
"""

import json
import shutil

import pytest

from grpo_pipeline.pipeline.config import from_mapping
from grpo_pipeline.pipeline.demo.registry import cpu_demo_config
from grpo_pipeline.pipeline.train import run_training
from train_helpers import DEMO_RUN_EVAL_STEPS, DEMO_RUN_STEPS, DEMO_RUN_WARMUP_STEPS, PLOTS_IN_TEST_RUNS

# demo_run (tests/conftest.py) is trained once per test run; the notebook's smoke run starts from its warm-up too.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo")]


def test_shortened_demo_runs_every_part_and_writes_plots_and_summary(demo_run):
    run_dir, result, printed = demo_run
    assert result.status == "completed" and result.steps == DEMO_RUN_STEPS
    # The warm-up reports in readable lines (5 of them), not in the raw dicts of transformers' printer.
    last = f"[grpo] warm-up step {DEMO_RUN_WARMUP_STEPS}/{DEMO_RUN_WARMUP_STEPS}: loss "
    assert printed.count("[grpo] warm-up step ") == 5 and last in printed
    assert "{'loss'" not in printed

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == DEMO_RUN_STEPS and summary["wall_time_s"] > 0
    before, after = summary["eval_before"], summary["eval_after"]
    assert before["n"] == after["n"] == 20
    # The warm-up (supervised, on the teacher's worked solutions) taught the answer format that the random model
    # never produces: a wide margin, not a GRPO trajectory ...
    assert before["format_rate"] >= 0.9 and after["format_rate"] >= 0.9
    # ... and GRPO ran all its steps, logging the correctness reward on each of them. Whether it rises, and by how
    # much on held-out problems, is a trajectory: bench/learning.py measures it over seeds.
    records = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    correctness = [r["rewards/correctness_reward_func/mean"] for r in records]
    assert len(correctness) == DEMO_RUN_STEPS and all(0.0 <= c <= 2.0 for c in correctness)
    assert summary["accuracy_gain_points"] == round(100 * (after["accuracy"] - before["accuracy"]), 1)
    for name in ("reward.png", "completion_length.png", "health.png", "reward_correctness_reward_func.png"):
        assert (run_dir / "plots" / name).stat().st_size > 5_000, name
    assert (run_dir / "lora" / "adapter_config.json").is_file() and (run_dir / "manifest.json").is_file()
    # eval_steps (on in the demo): held-out accuracy at every DEMO_RUN_EVAL_STEPS, the best adapter in best_lora/
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    assert sorted(evals) == [DEMO_RUN_EVAL_STEPS, DEMO_RUN_STEPS] and DEMO_RUN_STEPS == 2 * DEMO_RUN_EVAL_STEPS
    assert evals[DEMO_RUN_STEPS] == after["accuracy"]  # the same greedy eval as eval_after
    best_step = min(step for step, accuracy in evals.items() if accuracy == max(evals.values()))
    assert summary["best"] == {"step": best_step, "accuracy": max(evals.values())}
    assert (run_dir / "best_lora" / "grpo_adapter.json").is_file() and (run_dir / "plots" / "eval.png").is_file()


# --- reward up, held-out accuracy down: the hacking rule on a real run, with a signal that is certain ---------
#
# Whether a policy *learns* to game a reward fast enough to leave the rule's sampling noise depends on the
# machine's floating-point kernels and the package versions (the gamed-reward run went 14% -> 8% -> 2%, then
# 26% -> 20% -> 15%, then 3% -> 0% before the first eval on another machine). So these tests do not ask
# training for a trajectory: the training reward rises with the step (train_helpers.step_rising_reward reads
# TRL's trainer_state), and the held-out accuracy is the real eval's, its score replaced by a sequence the
# test sets. Everything else is the real run: the real trainer, periodic eval callback, health rule,
# checkpoint, best_lora/ and summary. How fast the demo model really learns, and games first_operand_reward,
# is measured over seeds by bench/learning.py.


def _after_warmup(demo_run, tmp_path, monkeypatch, capsys, accuracies, **settings):
    """8 GRPO steps (2 prompts x 4 completions: the reward is the step's, whatever the completions) from the demo's
    warmed-up model (its warmup/ copied in, so the warm-up is reused), an eval every 2 steps over 20 held-out sums
    (the rule's noise allowance takes its n from the real eval), whose accuracy is `accuracies[i]` at the i-th eval:
    each a whole number of problems out of 20."""
    import grpo_pipeline.pipeline.infer.evaluate as evaluate

    real, scripted = evaluate.evaluate_rows, iter(accuracies)

    def scored_by_the_test(*args, **kwargs):
        return {**real(*args, **kwargs), "accuracy": next(scripted)}

    monkeypatch.setattr(evaluate, "evaluate_rows", scored_by_the_test)
    run_dir = tmp_path / "run"
    shutil.copytree(demo_run[0] / "warmup", run_dir / "warmup")
    cfg = from_mapping({**cpu_demo_config(), "output_dir": str(run_dir), "sft_warmup_steps": DEMO_RUN_WARMUP_STEPS,
                        "max_steps": 8, "save_steps": 100,
                        "num_generations": 4, "per_device_train_batch_size": 8, "eval_steps": 2, "eval_limit": 20,
                        "eval_before": False, "eval_after": False, "plots": PLOTS_IN_TEST_RUNS,
                        "hacking_window": 3, "reward_funcs": ["train_helpers:step_rising_reward"],
                        "reward_weights": None, **settings})
    result = run_training(cfg)
    assert "[grpo] format warm-up: reusing " in capsys.readouterr().out  # demo_run's, with its settings
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    assert {r["eval/n"] for r in rows if "eval/accuracy" in r} == {20}  # the n the rule's allowance is computed for
    return run_dir, result, evals


def test_a_rising_reward_while_held_out_accuracy_falls_stops_the_run_with_the_hacking_rule(
        demo_run, tmp_path, monkeypatch, capsys):
    """90% -> 60% -> 30% over 20 problems is far past two standard errors (about 31 points), while the reward
    rises by construction: the rule stops the run at the third eval (step 6), with a checkpoint there, and
    best_lora/ keeps the adapter of the best accuracy (step 2)."""
    run_dir, result, evals = _after_warmup(demo_run, tmp_path, monkeypatch, capsys, [0.9, 0.6, 0.3, 0.1],
                                           hacking_action="stop")
    assert result.status == "stopped" and result.exit_code == 3
    assert evals == [(2, 0.9), (4, 0.6), (6, 0.3)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["health"]["stop_rule"] == "hacking" and summary["health"]["stop_step"] == 6
    reason = summary["stop_reason"]
    assert "the training reward rose (" in reason and "held-out accuracy fell (90% -> 60% -> 30%)" in reason
    assert (run_dir / "checkpoint-6" / "trainer_state.json").is_file()
    best = json.loads((run_dir / "best_lora" / "grpo_best.json").read_text())
    assert best["accuracy"] == 0.9 and best["step"] == 2


def test_a_plateau_that_wobbles_within_chance_is_not_reward_hacking(demo_run, tmp_path, monkeypatch, capsys):
    """90% -> 85% -> 85% (one problem of wobble, inside the about 21 points two standard errors allow on 20
    problems; without that allowance any steady fall warns) while the reward still rises: no warning, and the run
    completes."""
    run_dir, result, evals = _after_warmup(demo_run, tmp_path, monkeypatch, capsys, [0.9, 0.85, 0.85, 0.8],
                                           hacking_action="stop")
    assert result.status == "completed" and result.steps == 8
    assert [a for _, a in evals] == [0.9, 0.85, 0.85, 0.8]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not any("reward hacking" in warning for warning in summary["health_warnings"])
