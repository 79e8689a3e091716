"""Guardrails that act on a run without learning signal: the flat-reward rule (with real TrainerControl /
TrainerState, then a real tiny CPU run), the reward dry run, eval during training with the best adapter
kept, reward-up-accuracy-down, and rollback on collapse."""

from __future__ import annotations

import json
import math

import pytest
from transformers import TrainerControl, TrainerState

from grpo_pipeline.pipeline.config import HealthArguments
from grpo_pipeline.pipeline.health.rules import HealthCallback
from grpo_pipeline.pipeline.run.metric_names import GARBLED_RATE as GARBLED_RATE_KEY
from grpo_pipeline.pipeline.run.metric_names import REPETITION_RATE as REPETITION_RATE_KEY
from grpo_pipeline.pipeline.health.signal import FLAT_GROUP_SHARE, flat_reward_causes, no_signal_causes
from grpo_pipeline.rewards.declared import DECLARED

# Each built-in reward's range and kind, by the name TRL logs it under, from its declaration (rewards/declared.py).
REWARD_RANGES = {facts.logged_name: facts.range for facts in DECLARED.values() if facts.range}
FORMAT_REWARD_NAMES = {facts.logged_name for facts in DECLARED.values() if facts.kind == "format"}

FORMAT, CORRECT = "strict_format_reward_func", "correctness_reward_func"


def _log(callback: HealthCallback, step: int, **logs) -> TrainerControl:
    control = TrainerControl()
    callback.on_log(None, TrainerState(global_step=step), control, logs=dict(logs))
    return control


def _flat_logs(share: float, means: dict[str, float], stds: dict[str, float], **extra) -> dict:
    logs = {"loss": 0.0, FLAT_GROUP_SHARE: share, **extra}
    for name in means:
        logs[f"rewards/{name}/mean"], logs[f"rewards/{name}/std"] = means[name], stds[name]
    return logs


# --------------------------------------------------------------------------------------------
# The cause of a flat reward, over every built-in reward and each place it can be flat
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REWARD_RANGES))
@pytest.mark.parametrize("where", ["min", "max", "middle"])
def test_every_builtin_reward_flat_anywhere_gets_a_cause_and_a_fix(name, where):
    low, high = REWARD_RANGES[name]
    mean = {"min": low, "max": high, "middle": (low + high) / 2}[where]
    causes = flat_reward_causes({name: mean}, temperature=1.0, clipped_share=0.8)
    assert causes[0].startswith(f"{name}: ") and "Fix:" in causes[0]
    if where == "min":
        expected = "sft_warmup_steps" if name in FORMAT_REWARD_NAMES else "easier problems"
        assert expected in causes[0]
        assert causes[1] == ("80% of completions hit max_completion_length: if they were on their way to "
                             "</answer>, raise max_completion_length")
    elif where == "max":
        expected = "the form is learned" if name in {*FORMAT_REWARD_NAMES, "int_reward_func"} else "difficulty"
        assert len(causes) == 1 and "maximum" in causes[0] and expected in causes[0]
    else:
        assert len(causes) == 1 and "raise temperature (now 1;" in causes[0]


def test_rewards_flat_for_the_same_cause_share_one_sentence():
    causes = flat_reward_causes({name: 0.0 for name in sorted(FORMAT_REWARD_NAMES)}, temperature=1.0)
    assert len(causes) == 1 and all(name in causes[0] for name in FORMAT_REWARD_NAMES)


def test_a_plugin_reward_flat_at_zero_is_named_without_guessing_its_range():
    cause = flat_reward_causes({"my_reward": 0.0}, temperature=1.0)[0]
    assert cause.startswith("my_reward: 0 on every completion") and "Fix:" in cause


def test_a_reward_flat_while_the_completions_differ_is_not_blamed_on_the_rollouts():
    """Found trying `grpo rewards` as a new user: a reward of my own gave 1 to every completion while correctness
    separated them, and the verdict said the rollouts were too alike (raise temperature)."""
    cause = flat_reward_causes({"brevity": 1.0}, temperature=1.0, completions_differ=True)[0]
    assert cause.startswith("brevity: 1 on every completion, although the completions differ")
    assert "raise temperature" not in cause and "drop it from reward_funcs" in cause
    assert "too alike" in flat_reward_causes({"brevity": 1.0}, temperature=1.0)[0]  # nothing says they differ


def test_groups_flat_while_every_reward_varies_points_at_rollout_diversity():
    causes = no_signal_causes({CORRECT: 1.0}, {CORRECT: 0.9}, temperature=1.0, num_generations=4)
    assert len(causes) == 1 and "not within a group" in causes[0] and "num_generations (now 4)" in causes[0]


def test_a_low_temperature_is_named_with_the_flat_rewards():
    causes = no_signal_causes({FORMAT: 0.0}, {FORMAT: 0.0}, temperature=0.1, num_generations=8)
    assert any("temperature 0.1 is low" in cause for cause in causes)


# --------------------------------------------------------------------------------------------
# The flat-reward rule on logged steps
# --------------------------------------------------------------------------------------------


def test_flat_reward_fires_after_a_full_window_naming_the_flat_rewards():
    callback = HealthCallback(HealthArguments(flat_reward_threshold=0.9, flat_reward_window=3,
                                              flat_reward_action="stop"), beta=0.0)
    logs = _flat_logs(1.0, {FORMAT: 0.0, CORRECT: 2.0, "health": 0.0}, {FORMAT: 0.0, CORRECT: 0.0, "health": 0.0},
                      **{"completions/clipped_ratio": 0.0})
    assert not _log(callback, 1, **logs).should_training_stop
    assert not _log(callback, 2, **logs).should_training_stop  # window not full yet
    control = _log(callback, 3, **logs)
    assert control.should_training_stop and control.should_save  # the existing stop path: exit 3, checkpoint
    assert callback.stop_rule == "flat_reward" and callback.stop_step == 3
    reason = callback.stop_reason
    assert "100%-100% of the groups" in reason and "last 3 logged steps" in reason
    assert f"{FORMAT}: 0 on every completion" in reason and "sft_warmup_steps" in reason
    assert f"{CORRECT}: at its maximum 2" in reason and "difficulty" in reason
    assert "health" not in reason  # the observer always scores 0 and is not a reward
    assert "flat_reward_action: warn" in reason


def test_flat_reward_warns_by_default():
    callback = HealthCallback(HealthArguments(flat_reward_window=2), beta=0.0, temperature=0.2)
    logs = _flat_logs(0.95, {CORRECT: 1.0}, {CORRECT: 0.8})
    for step in (1, 2):
        assert not _log(callback, step, **logs).should_training_stop
    assert callback.stop_reason is None and len(callback.warnings) == 1
    assert "not within a group" in callback.warnings[0] and "temperature (now 0.2)" in callback.warnings[0]


@pytest.mark.parametrize("shares", [
    [0.5] * 6,                     # half the groups learn: fine
    [1.0, 1.0, 0.5, 1.0, 1.0, 0.8],  # never a full window at or above the threshold
    [1.0, 1.0],                    # too few steps for the window
])
def test_flat_reward_does_not_fire_while_enough_groups_have_signal(shares):
    callback = HealthCallback(HealthArguments(flat_reward_threshold=0.9, flat_reward_window=3,
                                              flat_reward_action="stop"), beta=0.0)
    for step, share in enumerate(shares, start=1):
        assert not _log(callback, step, **_flat_logs(share, {FORMAT: 0.0}, {FORMAT: 0.0})).should_training_stop
    assert callback.stop_reason is None and callback.warnings == []


def test_bad_flat_reward_action_is_a_config_error():
    from grpo_pipeline.pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="flat_reward_action"):
        HealthCallback(HealthArguments(flat_reward_action="halt"), beta=0.0)


# --------------------------------------------------------------------------------------------
# Real tiny CPU runs
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_run_whose_format_reward_is_never_hit_stops_with_exit_3_and_a_checkpoint(tmp_path):
    """The random tiny model never writes <answer>: strict_format is 0 on every completion, every group is flat."""
    from grpo_pipeline.pipeline.train import EXIT_HEALTH_STOP, run_training
    from train_helpers import demo_config

    run_dir = tmp_path / "run"
    cfg = demo_config(run_dir, max_steps=6, save_steps=100, reward_funcs=["strict_format"],
                      flat_reward_window=2, flat_reward_action="stop")
    result = run_training(cfg)
    assert result.status == "stopped" and result.exit_code == EXIT_HEALTH_STOP and result.steps == 2
    assert (run_dir / "checkpoint-2" / "trainer_state.json").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["health"]["stop_rule"] == "flat_reward"
    assert "strict_format_reward_func: 0 on every completion" in summary["stop_reason"]


# --------------------------------------------------------------------------------------------
# The reward dry run (`grpo rewards`)
# --------------------------------------------------------------------------------------------


def test_reward_table_counts_zeros_nones_and_flat_groups_per_reward_and_in_total():
    from grpo_pipeline.pipeline.infer.dry_run import reward_table

    # 3 groups of 2: reward a is flat in groups 1 and 3, b is None in group 2 (not judged) and flat in group 1.
    a = [0.0, 0.0, 1.0, 0.0, 2.0, 2.0]
    b = [0.5, 0.5, None, None, 0.0, 0.5]
    table = reward_table(["a", "b"], [a, b], [1.0, 2.0], group_size=2)
    assert table["a"]["zero_share"] == pytest.approx(3 / 6) and table["a"]["none_share"] == 0
    assert table["a"]["flat_group_share"] == pytest.approx(2 / 3)
    assert table["b"]["none_share"] == pytest.approx(2 / 6) and table["b"]["zero_share"] == pytest.approx(1 / 6)
    assert table["b"]["flat_group_share"] == pytest.approx(2 / 3)  # group 2 has no scored pair: flat
    # total = a + 2 b with None as 0: [1, 1, 1, 0, 2, 3]: groups 1 flat, 2 and 3 not
    total = table["total"]
    assert total["mean"] == pytest.approx(8 / 6) and total["flat_group_share"] == pytest.approx(1 / 3)


def _dry_run(tmp_path, capsys, *options):
    from grpo_pipeline.pipeline.infer.dry_run import main

    out = tmp_path / "dry"
    code = main(["--config", "configs/cpu-demo.yaml", "--output_dir", str(out), "--prompts", "2", "--json",
                 *options])
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = json.loads(printed)
    assert json.loads((out / "reward_dry_run.json").read_text())["verdicts"] == result["verdicts"]
    return result


@pytest.mark.slow
def test_dry_run_on_the_demo_without_its_warm_up_says_no_signal_and_why(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[1])
    result = _dry_run(tmp_path, capsys)
    assert result["prompts"] == 2 and result["num_generations"] == 8 and result["completions"] == 16
    assert result["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.1,
                                  "max_completion_length": 64}
    assert set(result["rewards"]) == {*REWARD_RANGES, "total"}
    assert all(row["zero_share"] == 1.0 and row["flat_group_share"] == 1.0 for row in result["rewards"].values())
    assert result["format_hit_rate"] == 0.0 and 0 <= result["clipped_share"] <= 1
    text = "\n".join(result["verdicts"])
    assert "the model never writes the <reasoning>/<answer> format" in text and "sft_warmup_steps" in text
    assert "BEFORE the format warm-up" in text and "--after-warmup" in text
    assert result["verdicts"][-1].startswith("verdict: NO LEARNING SIGNAL: 100% of the groups")


@pytest.mark.slow
def test_dry_run_with_a_reward_that_varies_finds_the_signal(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[1])
    result = _dry_run(tmp_path, capsys, "--reward_funcs", "train_helpers:digit_share_reward")
    assert set(result["rewards"]) == {"digit_share_reward", "total"}
    assert result["rewards"]["total"]["flat_group_share"] < 0.9
    assert result["verdicts"][-1].startswith("verdict: learning signal in")
    assert result["verdicts"][0].startswith("digit_share_reward: ok")


@pytest.mark.slow
def test_dry_run_calls_every_reward_as_the_trainer_does(tmp_path, capsys, monkeypatch):
    """numpy values, a callable object and an async reward are scored and written (numpy's float32 once stopped the
    dry run writing its JSON); a reward that raises on the sampled batch only is exit 2 naming it, no traceback."""
    from grpo_pipeline.pipeline.infer.dry_run import main

    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[1])
    result = _dry_run(tmp_path, capsys, "--reward_funcs", "train_helpers:float32_digit_share",
                      "train_helpers:async_digit_share", "--reward_weights", "1", "1")
    means = {name: result["rewards"][name]["mean"] for name in ("float32_digit_share", "async_digit_share")}
    assert means["float32_digit_share"] == pytest.approx(means["async_digit_share"], abs=1e-6) and means[
        "async_digit_share"] > 0
    code = main(["--config", "configs/cpu-demo.yaml", "--output_dir", str(tmp_path / "fails"), "--prompts", "2",
                 "--reward_funcs", "train_helpers:fails_past_the_probe"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    [said] = [line for line in err.splitlines() if line.startswith("error: ")]  # after the model's loading bar
    assert said.startswith("error: config error in `reward_funcs`: reward function `fails_past_the_probe` raised "
                           "ValueError: cannot score 16 completions at once")
    assert "in this dry run" in said and not (tmp_path / "fails" / "reward_dry_run.json").exists()


def test_dry_run_bad_input_is_one_message_and_exit_2(tmp_path, capsys):
    from grpo_pipeline.pipeline.infer.dry_run import main

    assert main(["--config", "configs/cpu-demo.yaml", "--output_dir", str(tmp_path), "--prompts", "0"]) == 2
    assert "--prompts" in capsys.readouterr().err
    assert main(["--config", "configs/cpu-demo.yaml", "--output_dir", str(tmp_path),
                 "--reward_funcs", "no_such_reward"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no_such_reward" in err and "Traceback" not in err


# --------------------------------------------------------------------------------------------
# Eval during training (eval_steps) and the best adapter (best_lora/)
# --------------------------------------------------------------------------------------------


def _eval_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], r["eval/accuracy"], r["eval/format_rate"]) for r in rows if "eval/accuracy" in r]


@pytest.mark.slow
def test_eval_steps_logs_plots_keeps_the_best_and_resume_never_replaces_it_with_a_worse_one(tmp_path, capsys):
    from grpo_pipeline.pipeline.cli import main as grpo
    from grpo_pipeline.pipeline.infer.session import verify_trained_dir
    from grpo_pipeline.pipeline.train import run_training
    from train_helpers import demo_config

    run_dir = tmp_path / "run"
    reward = ["train_helpers:digit_share_reward"]  # a random model's completions differ here: the run learns
    result = run_training(demo_config(run_dir, max_steps=2, save_steps=2, eval_steps=1, eval_limit=4,
                                      reward_funcs=reward, plots=True, eval_after=True))
    assert result.status == "completed"
    # eval after training is the eval at the final step (the same weights, scored the same way), not a second one
    assert "(the eval at step 2: the same weights)" in capsys.readouterr().out
    evals = _eval_rows(run_dir)
    assert [step for step, _, _ in evals] == [1, 2] and all(0 <= a <= 1 and 0 <= f <= 1 for _, a, f in evals)
    best_dir = run_dir / "best_lora"
    verify_trained_dir(best_dir)
    best = json.loads((best_dir / "grpo_best.json").read_text())
    accuracies = {step: accuracy for step, accuracy, _ in evals}
    # the first step with the highest accuracy (a tie keeps the earlier adapter)
    assert best["step"] == min(s for s, a in accuracies.items() if a == max(accuracies.values()))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best"] == {"step": best["step"], "accuracy": best["accuracy"]}
    assert summary["eval_after"]["accuracy"] == accuracies[2] and summary["eval_after"]["n"] == 4
    assert (run_dir / "plots" / "eval.png").stat().st_size > 5_000
    # neither rule may fire here: the groups differ, and held-out accuracy (0 on a random model) never falls
    assert not any("no learning signal" in w or "reward hacking" in w for w in summary["health_warnings"])
    # best_lora/ is self-describing: generate works with it alone
    assert grpo(["generate", "--lora", str(best_dir), "--prompt", "What is 12+13?", "--max_tokens", "8"]) == 0
    capsys.readouterr()

    # A better best recorded earlier survives a resume whose evals are worse (the weights stay untouched) ...
    (best_dir / "grpo_best.json").write_text(json.dumps({**best, "accuracy": 1.01}))
    weights = (best_dir / "adapter_model.safetensors").read_bytes()
    resumed = run_training(demo_config(run_dir, max_steps=3, save_steps=2, eval_steps=1, eval_limit=4,
                                       reward_funcs=reward))
    assert resumed.status == "completed" and [s for s, _, _ in _eval_rows(run_dir)] == [1, 2, 3]
    assert json.loads((best_dir / "grpo_best.json").read_text())["accuracy"] == 1.01
    assert (best_dir / "adapter_model.safetensors").read_bytes() == weights
    assert json.loads((run_dir / "summary.json").read_text())["best"]["accuracy"] == 1.01
    # ... while a fresh run in the same folder starts its own best. Its last eval (step 2) is not its final step
    # (3): eval after training scores the final weights itself.
    capsys.readouterr()
    run_training(demo_config(run_dir, max_steps=3, save_steps=3, eval_steps=2, eval_limit=4, reward_funcs=reward,
                             resume="never", eval_after=True))
    assert json.loads((best_dir / "grpo_best.json").read_text())["accuracy"] <= 1.0
    out = capsys.readouterr().out
    assert "eval after GRPO: accuracy" in out and "(the eval at step" not in out


# --------------------------------------------------------------------------------------------
# Rollback on collapse (on_collapse: rollback)
# --------------------------------------------------------------------------------------------


def _checkpoint(output_dir, step: int) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(folder / "adapter_model.safetensors"))


def _args(output_dir, logging_steps: int = 1):
    from types import SimpleNamespace

    return SimpleNamespace(output_dir=str(output_dir), logging_steps=logging_steps)


def _on_log(callback, args, step, **logs) -> TrainerControl:
    control = TrainerControl()
    callback.on_log(args, TrainerState(global_step=step), control, logs=dict(logs))
    return control


@pytest.mark.parametrize("logs, rule", [({"loss": math.nan}, "non_finite"), ({"grad_norm": math.inf}, "non_finite"),
                                        ({"kl": math.nan}, "non_finite"), ({"kl": 5.0}, "kl")])
def test_a_collapse_rolls_back_to_the_newest_checkpoint_before_the_failing_log_without_saving(tmp_path, logs, rule):
    for step in (2, 4, 6):
        _checkpoint(tmp_path, step)
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text("{")  # broken: skipped
    callback = HealthCallback(HealthArguments(on_collapse="rollback", kl_ceiling=1.0), beta=0.04, rollbacks_left=1)
    # a log every 2 steps: the log at step 7 covers steps 6-7, so checkpoint-6 may already hold the collapse
    control = _on_log(callback, _args(tmp_path, logging_steps=2), 7, **{"loss": 0.1, **logs})
    assert control.should_training_stop and not control.should_save
    assert callback.rollback_to == tmp_path / "checkpoint-2" and callback.stop_rule == rule
    assert callback.stop_reason.startswith("Collapse at step 7: ")
    assert "rolling back to checkpoint-2" in callback.stop_reason


@pytest.mark.parametrize("case", ["on_collapse stop", "no rollbacks left", "no checkpoint before", "garbled rule"])
def test_no_rollback_where_it_must_not_happen_the_rule_stops_as_before(tmp_path, case):
    from grpo_pipeline.pipeline.run.metric_names import GARBLED_RATE

    _checkpoint(tmp_path, 5)
    settings = HealthArguments(on_collapse="stop" if case == "on_collapse stop" else "rollback", garbled_window=1)
    callback = HealthCallback(settings, beta=0.0, rollbacks_left=0 if case == "no rollbacks left" else 2)
    step = 5 if case == "no checkpoint before" else 9
    logs = {GARBLED_RATE: 0.9} if case == "garbled rule" else {"loss": math.nan}
    control = _on_log(callback, _args(tmp_path), step, **{"loss": 0.1, **logs})
    assert control.should_training_stop and control.should_save and callback.rollback_to is None
    assert callback.stop_reason.startswith(f"Stopped at step {step}")
    if case == "no checkpoint before":
        assert "no checkpoint from before this step to roll back to" in callback.stop_reason


def test_healthy_logs_never_roll_back(tmp_path):
    _checkpoint(tmp_path, 1)
    callback = HealthCallback(HealthArguments(on_collapse="rollback"), beta=0.04, rollbacks_left=2)
    for step in range(2, 12):
        assert not _on_log(callback, _args(tmp_path), step, loss=0.1, grad_norm=0.3, kl=0.05).should_training_stop
    assert callback.rollback_to is None and callback.stop_reason is None


def _kl_log():
    """A TrainerCallback keeping every logged (step, kl) in order, across the rebuilt trainers of a rollback."""
    from transformers import TrainerCallback

    class KlLog(TrainerCallback):
        seen: list = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "kl" in logs:
                self.seen.append((state.global_step, logs["kl"]))

    return KlLog()


@pytest.fixture(scope="module")
def nan_rollback_run(tmp_path_factory):
    """A real run whose step-3 gradients are NaN once, rolled back (to checkpoint-1, the learning rate halved) and
    completed: (folder, RunResult, every logged (step, kl)). beta 0.04 with a ceiling it never reaches, so kl is
    logged for the reference test below; read by two tests."""
    from grpo_pipeline.pipeline.train import run_training
    from train_helpers import demo_config, poison_gradients

    run_dir = tmp_path_factory.mktemp("nan_rollback") / "run"
    kl_log = _kl_log()
    cfg = demo_config(run_dir, max_steps=4, save_steps=1, on_collapse="rollback", rollback_lr_factor=0.5,
                      max_rollbacks=1, lr_scheduler_type="constant", beta=0.04, kl_ceiling=100.0,
                      reward_funcs=["train_helpers:digit_share_reward"])
    result = run_training(cfg, callbacks=[poison_gradients(at_step=3, times=1), kl_log])
    return run_dir, result, kl_log.seen


@pytest.mark.slow
def test_a_real_nan_collapse_rolls_back_halves_the_learning_rate_and_the_run_completes(nan_rollback_run):
    run_dir, result, _ = nan_rollback_run
    assert result.status == "completed" and result.exit_code == 0 and result.steps == 4
    summary = json.loads((run_dir / "summary.json").read_text())
    [rollback] = summary["rollbacks"]
    # step 3's gradients were computed with checkpoint-2's weights: the rollback goes to checkpoint-1
    assert rollback["rule"] == "non_finite" and rollback["from_step"] == 3 and rollback["to_step"] == 1
    assert rollback["learning_rate"] == pytest.approx(5e-4) and "grad_norm is nan" in rollback["reason"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in rows if r.get("event") == "rollback"] == [{"step": 1, "event": "rollback", **rollback}]
    lrs = {r["step"]: r["learning_rate"] for r in rows if "loss" in r}
    assert lrs[1] == pytest.approx(1e-3) and all(lrs[s] == pytest.approx(5e-4) for s in (2, 3, 4)), lrs
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]  # the collapsed steps' lines are gone
    assert all(math.isfinite(r["grad_norm"]) for r in rows if "loss" in r)
    assert (run_dir / "lora" / "adapter_model.safetensors").is_file()
    # the collapsed trajectory's checkpoint-2 was set aside, not left for a later --resume auto, and the
    # failing step saved nothing of its own
    [aside] = (run_dir / "previous").iterdir()
    assert aside.name.endswith("-rollback") and [p.name for p in aside.iterdir()] == ["checkpoint-2"]


@pytest.mark.slow
def test_a_real_kl_above_the_ceiling_rolls_back_before_the_drift_and_the_lower_rate_stays_under_it(tmp_path):
    """beta 0.04 on the tiny model, the learning rate warming up 0 -> 5e-3 -> 1e-2: step 1 changes nothing (kl 0 at
    step 2), step 2 moves the weights far (kl 0.15-0.17 at step 3 over seeds, the kl of checkpoint-2's weights).
    A ceiling of 0.05 fires at step 3; going back to checkpoint-2 would restore the very weights that drifted, so
    the run goes to checkpoint-1 and trains on at x0.001, where kl stays far under the ceiling."""
    from grpo_pipeline.pipeline.train import run_training
    from train_helpers import demo_config

    run_dir = tmp_path / "run"
    cfg = demo_config(run_dir, max_steps=5, save_steps=1, beta=0.04, kl_ceiling=0.05, kl_action="stop",
                      learning_rate=1e-2, lr_scheduler_type="constant_with_warmup", warmup_ratio=0.4,
                      on_collapse="rollback", rollback_lr_factor=0.001, max_rollbacks=1,
                      reward_funcs=["train_helpers:digit_share_reward"])
    result = run_training(cfg)
    assert result.status == "completed" and result.exit_code == 0 and result.steps == 5
    summary = json.loads((run_dir / "summary.json").read_text())
    [rollback] = summary["rollbacks"]
    assert rollback["rule"] == "kl" and rollback["from_step"] == 3 and rollback["to_step"] == 1
    assert "above kl_ceiling 0.05" in rollback["reason"] and rollback["learning_rate"] == pytest.approx(1e-5)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kls = {r["step"]: r["kl"] for r in rows if "loss" in r}
    assert sorted(kls) == [1, 2, 3, 4, 5] and all(kl <= 0.05 for kl in kls.values()), kls
    assert summary["health"]["stop_rule"] is None and summary["status"] == "completed"


def _replays_the_first_passes_kl(seen, last_step: int) -> None:
    """1-3, the collapse at 3, back to checkpoint-1, 2-last: the replayed step 2 logs the first pass's step-2 kl."""
    assert [step for step, _ in seen] == [1, 2, 3, *range(2, last_step + 1)]
    first, replayed = seen[1][1], seen[3][1]
    assert replayed == pytest.approx(first, rel=1e-4, abs=1e-7), seen


@pytest.mark.slow
def test_after_a_rollback_kl_is_measured_against_the_first_trainers_reference(nan_rollback_run):
    """Rebuilt on the live model, TRL's GRPOTrainer would copy the collapsed adapter as its "ref": the replayed
    step 2 must log the kl of the first pass's step 2 (a fresh LoRA: the base model is the reference)."""
    _, result, seen = nan_rollback_run
    assert result.status == "completed" and result.steps == 4
    _replays_the_first_passes_kl(seen, 4)


@pytest.mark.slow
def test_after_a_rollback_past_a_warm_up_kl_is_measured_against_the_warmed_reference(tmp_path):
    """After a format warm-up the reference is the warmed model: rebuilt on the live model, TRL's GRPOTrainer would
    raise that "ref" exists, or copy the collapsed adapter. One warm-up step makes the warmed model as well as
    four."""
    from grpo_pipeline.pipeline.train import run_training
    from train_helpers import demo_config, poison_gradients

    kl_log = _kl_log()
    cfg = demo_config(tmp_path / "run", max_steps=3, save_steps=1, beta=0.04, kl_ceiling=100.0,
                      on_collapse="rollback", max_rollbacks=1, sft_warmup_steps=1,
                      reward_funcs=["train_helpers:digit_share_reward"])
    result = run_training(cfg, callbacks=[poison_gradients(at_step=3, times=1), kl_log])
    assert result.status == "completed" and result.steps == 3
    _replays_the_first_passes_kl(kl_log.seen, 3)


@pytest.mark.slow
def test_a_collapse_after_max_rollbacks_stops_with_exit_3_and_a_checkpoint(tmp_path):
    from grpo_pipeline.pipeline.train import EXIT_HEALTH_STOP, run_training
    from train_helpers import demo_config, poison_gradients

    run_dir = tmp_path / "run"
    cfg = demo_config(run_dir, max_steps=5, save_steps=1, on_collapse="rollback", max_rollbacks=1,
                      reward_funcs=["train_helpers:digit_share_reward"])
    result = run_training(cfg, callbacks=[poison_gradients(at_step=3, times=2)])
    assert result.status == "stopped" and result.exit_code == EXIT_HEALTH_STOP and result.steps == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["rollbacks"]) == 1 and summary["health"]["stop_rule"] == "non_finite"
    assert (run_dir / "checkpoint-3" / "trainer_state.json").is_file()


# --------------------------------------------------------------------------------------------
# Reward up, held-out accuracy down (hacking_window, hacking_action)
# --------------------------------------------------------------------------------------------


def _hacking_run(accuracies, rewards, n=None, **settings) -> HealthCallback:
    """Logs 5 steps per eval: each step's reward is that interval's value, the eval lands on the 5th (over `n`
    problems when given, as the run's periodic eval logs eval/n)."""
    callback = HealthCallback(HealthArguments(**settings), beta=0.0)
    step = 0
    for accuracy, reward in zip(accuracies, rewards):
        for i in range(5):
            step += 1
            extra = {"eval/accuracy": accuracy, **({"eval/n": n} if n else {})} if i == 4 else {}
            _log(callback, step, loss=0.0, reward=reward, **extra)
    return callback


@pytest.mark.parametrize("n", [20, 100, 1000])
@pytest.mark.parametrize("start", [0.1, 0.5, 0.9])
def test_a_fall_of_held_out_accuracy_counts_only_past_its_sampling_noise(n, start):
    """Two standard errors of the difference of two proportions over n problems: just under it is noise (no
    warning), just past it a fall (a warning), at every accuracy level and eval size."""
    from grpo_pipeline.pipeline.health.rules import accuracy_noise

    def fires(end: float) -> bool:
        middle = (start + end) / 2
        return bool(_hacking_run([start, middle, end], [1.0, 1.5, 2.0], n=n, hacking_window=3).warnings)

    if not fires(0.0):  # too few problems to tell even a fall to 0 from chance (10% of 20 is 2 problems)
        assert accuracy_noise(start, 0.0, n, n) >= start
        return
    low, high = 0.0, start  # the largest end accuracy that still counts as a fall, by bisection on the rule itself
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if fires(mid) else (low, mid)
    drop = start - low
    allowed = accuracy_noise(start, low, n, n)
    assert drop == pytest.approx(allowed, abs=1e-6)  # the rule's threshold is exactly the noise allowance
    expected = 2 * math.sqrt(((start + low) / 2) * (1 - (start + low) / 2) * (2 / n))
    assert allowed == pytest.approx(expected, rel=1e-6)
    assert not fires(start - 0.9 * allowed) and fires(start - 1.1 * allowed)


def test_a_wobble_on_a_plateau_is_not_reward_hacking_but_a_real_fall_is():
    """The CPU demo's own figures (100 held-out problems): an honest run at its plateau, and a gamed reward."""
    plateau = _hacking_run([0.90, 0.89, 0.89], [3.70, 3.59, 3.83], n=100, hacking_window=3)
    assert plateau.warnings == []
    gamed = _hacking_run([0.14, 0.08, 0.02], [1.86, 2.10, 2.34], n=100, hacking_window=3)
    assert len(gamed.warnings) == 1 and "fell (14% -> 8% -> 2%)" in gamed.warnings[0]


def test_reward_rising_while_accuracy_falls_warns_naming_both_curves():
    callback = _hacking_run([0.8, 0.7, 0.6], [2.0, 2.5, 3.0], hacking_window=3)
    assert callback.stop_reason is None and len(callback.warnings) == 1
    warning = callback.warnings[0]
    assert warning.startswith("step 15:") and "reward hacking" in warning
    assert "rose (2 -> 2.5 -> 3)" in warning and "fell (80% -> 70% -> 60%)" in warning
    assert "steps 5, 10, 15" in warning


def test_hacking_action_stop_stops_with_a_checkpoint():
    callback = HealthCallback(HealthArguments(hacking_window=2, hacking_action="stop"), beta=0.0)
    _log(callback, 1, loss=0.0, reward=1.0, **{"eval/accuracy": 0.9})
    control = _log(callback, 2, loss=0.0, reward=2.0, **{"eval/accuracy": 0.5})
    assert control.should_training_stop and control.should_save and callback.stop_rule == "hacking"


@pytest.mark.parametrize("accuracies, rewards", [
    ([0.6, 0.7, 0.8], [2.0, 2.5, 3.0]),   # both rise: learning
    ([0.8, 0.7, 0.6], [3.0, 2.5, 2.0]),   # both fall: a bad run, not hacking
    ([0.8, 0.9, 0.7], [2.0, 2.5, 3.0]),   # accuracy rose in between: noise, not a trend
    ([0.8, 0.8, 0.8], [2.0, 2.5, 3.0]),   # accuracy flat
    ([0.8, 0.6], [2.0, 3.0]),             # fewer evals than the window
])
def test_no_hacking_warning_without_the_pattern(accuracies, rewards):
    callback = _hacking_run(accuracies, rewards, hacking_window=3)
    assert callback.warnings == [] and callback.stop_reason is None


# --------------------------------------------------------------------------------------------
# The rules' edges (each case a behaviour the mutation bench found unpinned)
# --------------------------------------------------------------------------------------------


def _args_without(output_dir=None, **fields):
    from types import SimpleNamespace

    return SimpleNamespace(**({"output_dir": str(output_dir)} if output_dir else {}), **fields)


@pytest.mark.parametrize("logging", [{}, {"logging_steps": None}, {"logging_steps": 0}, {"logging_steps": 1}])
def test_without_a_logging_interval_a_log_measures_the_weights_of_the_step_before(tmp_path, logging):
    for step in (3, 4):
        _checkpoint(tmp_path, step)
    callback = HealthCallback(HealthArguments(on_collapse="rollback"), beta=0.0, rollbacks_left=1)
    _on_log(callback, _args_without(tmp_path, **logging), 5, loss=math.nan)
    assert callback.rollback_to == tmp_path / "checkpoint-3"
    assert callback.stop_reason == "Collapse at step 5: loss is nan; rolling back to checkpoint-3."


def test_arguments_without_an_output_dir_stop_instead_of_rolling_back():
    callback = HealthCallback(HealthArguments(on_collapse="rollback"), beta=0.0, rollbacks_left=1)
    control = _on_log(callback, _args_without(logging_steps=1), 5, loss=math.nan)
    assert control.should_training_stop and control.should_save and callback.rollback_to is None
    assert callback.stop_reason.startswith("Stopped at step 5: loss is nan (NaN/inf")
    assert callback.stop_reason.endswith("; no checkpoint from before this step to roll back to.")


def test_a_callback_built_without_rollbacks_left_never_rolls_back_and_reports_no_stop_as_none(tmp_path):
    _checkpoint(tmp_path, 1)
    callback = HealthCallback(HealthArguments(on_collapse="rollback"), beta=0.0)
    assert callback.summary()["stop_rule"] is None and callback.summary()["stop_step"] is None
    _on_log(callback, _args(tmp_path), 5, loss=math.nan)
    assert callback.rollback_to is None and callback.stop_rule == "non_finite" and callback.stop_step == 5


def test_the_flat_reward_message_names_the_default_temperature_and_group_size():
    callback = HealthCallback(HealthArguments(flat_reward_window=1, flat_reward_action="warn"), beta=0.0)
    _log(callback, 1, **_flat_logs(1.0, {CORRECT: 1.0}, {CORRECT: 0.5}))
    assert "raise temperature (now 1) or num_generations (now 8)" in callback.warnings[0]


def test_the_flat_reward_window_slides_and_a_share_at_the_threshold_counts_as_flat():
    callback = HealthCallback(HealthArguments(flat_reward_window=2, flat_reward_threshold=0.9), beta=0.0)
    flat = _flat_logs(0.9, {FORMAT: 0.0}, {FORMAT: 0.0})
    _log(callback, 1, **_flat_logs(0.2, {FORMAT: 0.3}, {FORMAT: 0.1}))  # one step with signal, then two flat
    _log(callback, 2, **flat)
    assert callback.warnings == []
    _log(callback, 3, **flat)
    assert len(callback.warnings) == 1 and "90%-90% of the groups" in callback.warnings[0]


def test_the_flat_reward_message_names_clipped_completions_as_a_cause():
    callback = HealthCallback(HealthArguments(flat_reward_window=1), beta=0.0)
    _log(callback, 1, **_flat_logs(1.0, {FORMAT: 0.0}, {FORMAT: 0.0}, **{"completions/clipped_ratio": 0.8}))
    assert ("; 80% of completions hit max_completion_length: if they were on their way to </answer>, raise "
            "max_completion_length") in callback.warnings[0]


def test_flat_rewards_are_read_from_reward_keys_only():
    from grpo_pipeline.pipeline.health.signal import _reward_means_and_stds

    window = [{"rewards/a/mean": 1.0, "rewards/a/std": 0.0},
              {"rewards/b/mean": 0.0, "rewards/b/std": 0.0, "rewards/a/mean": 3.0, "rewards/a/std": 0.2,
               "sampling/importance_sampling_ratio/mean": 0.9, "rewards/a/none_frac": 0.0}]
    means, stds = _reward_means_and_stds(window)
    assert means == {"b": 0.0, "a": 2.0} and stds == {"b": 0.0, "a": 0.1}  # the latest log's rewards


def test_warnings_of_different_rules_do_not_silence_each_other():
    callback = HealthCallback(HealthArguments(garbled_window=1, garbled_action="warn"), beta=0.0)
    _log(callback, 1, loss=0.0, **{REPETITION_RATE_KEY: 0.99})
    _log(callback, 2, loss=0.0, **{GARBLED_RATE_KEY: 0.99})
    assert [w.split(":")[0] for w in callback.warnings] == ["step 1", "step 2"]


def test_current_beta_is_the_attached_trainers_even_when_something_else_changed_it():
    from types import SimpleNamespace

    trainer = SimpleNamespace(beta=0.04)
    callback = HealthCallback(HealthArguments(), beta=0.04).attach(trainer)
    trainer.beta = 0.2
    assert callback.current_beta() == 0.2


def test_a_log_event_without_logs_changes_nothing():
    callback = HealthCallback(HealthArguments(), beta=0.0)
    control = TrainerControl()
    assert callback.on_log(None, TrainerState(global_step=1), control, logs=None) is control
    assert not control.should_training_stop and callback.warnings == []


def test_adaptive_beta_records_the_step_of_each_change():
    from types import SimpleNamespace

    callback = HealthCallback(HealthArguments(adaptive_beta=True, kl_target=0.01), beta=0.04).attach(
        SimpleNamespace(beta=0.04))
    _log(callback, 7, loss=0.0, kl=1.0)
    assert [step for step, _ in callback.beta_history] == [7]


@pytest.mark.parametrize("accuracies, rewards, fires", [
    ([0.8, 0.8, 0.6], [1.0, 1.5, 2.0], True),    # a plateau, then a fall: never rose, so it counts
    ([0.8, 0.7, 0.6], [2.0, 2.0, 2.0], False),   # the reward did not rise
    ([0.8, 0.7, 0.6], [1.0, 2.0, 0.5], False),   # it rose, then fell below where it started
    ([0.5, 0.9, 0.8, 0.7], [1.0, 1.2, 1.5, 2.0], True),  # the window slides past an earlier rise
])
def test_the_hacking_pattern_edges(accuracies, rewards, fires):
    callback = _hacking_run(accuracies, rewards, hacking_window=3)
    assert bool(callback.warnings) is fires


def test_the_hacking_noise_allowance_uses_the_first_and_the_last_evals_sizes():
    """A fall from 50% over 1,000 problems to 44% over 1,000 is past chance, but not if the middle eval's size,
    20, were used for either end."""
    from grpo_pipeline.pipeline.health.rules import accuracy_noise

    assert 0.06 > accuracy_noise(0.5, 0.44, 1000, 1000) and 0.06 < accuracy_noise(0.5, 0.44, 20, 1000)
    callback = HealthCallback(HealthArguments(hacking_window=3), beta=0.0)
    for step, (accuracy, n) in enumerate([(0.5, 1000), (0.47, 20), (0.44, 1000)], start=1):
        _log(callback, step, loss=0.0, reward=float(step), **{"eval/accuracy": accuracy, "eval/n": n})
    assert len(callback.warnings) == 1


def test_unknown_eval_sizes_allow_no_noise():
    from grpo_pipeline.pipeline.health.rules import accuracy_noise

    assert accuracy_noise(0.9, 0.5, None, 100) == 0.0 == accuracy_noise(0.9, 0.5, 100, None)
    assert accuracy_noise(0.9, 0.5, 0, 0) == 0.0


def test_a_log_over_several_steps_rolls_back_before_all_the_weights_it_measured(tmp_path):
    """logging_steps 2: the log at step 7 measured the weights after steps 5 and 6, so checkpoint-5 is out too."""
    for step in (2, 5):
        _checkpoint(tmp_path, step)
    callback = HealthCallback(HealthArguments(on_collapse="rollback"), beta=0.0, rollbacks_left=1)
    _on_log(callback, _args(tmp_path, logging_steps=2), 7, loss=math.nan)
    assert callback.rollback_to == tmp_path / "checkpoint-2"
