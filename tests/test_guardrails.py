"""Guardrails that act on a run without learning signal: the flat-reward rule (with real TrainerControl /
TrainerState, then a real tiny CPU run), the reward dry run, eval during training with the best adapter
kept, reward-up-accuracy-down, and rollback on collapse."""

from __future__ import annotations

import json
import math

import pytest
from transformers import TrainerControl, TrainerState

from pipeline.config import HealthArguments
from pipeline.health.rules import HealthCallback
from pipeline.health.signal import FLAT_GROUP_SHARE, flat_reward_cause, no_signal_causes
from rewards.registry import FORMAT_REWARD_NAMES, REWARD_RANGES

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
    cause = flat_reward_cause(name, mean, temperature=1.0, clipped_share=0.8)
    assert cause.startswith(name) and "Fix:" in cause
    if where == "min":
        assert "max_completion_length" in cause  # 80% clipped is named as a cause
        expected = "sft_warmup_steps" if name in FORMAT_REWARD_NAMES else "easier problems"
        assert expected in cause
    elif where == "max":
        assert "maximum" in cause and "difficulty" in cause
    else:
        assert "raise temperature (now 1;" in cause


def test_a_plugin_reward_flat_at_zero_is_named_without_guessing_its_range():
    cause = flat_reward_cause("my_reward", 0.0, temperature=1.0)
    assert cause.startswith("my_reward is 0 on every completion") and "Fix:" in cause


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
    assert f"{FORMAT} is 0 on every completion" in reason and "sft_warmup_steps" in reason
    assert f"{CORRECT} is at its maximum 2" in reason and "difficulty" in reason
    assert "health is" not in reason  # the observer always scores 0 and is not a reward
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
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="flat_reward_action"):
        HealthCallback(HealthArguments(flat_reward_action="halt"), beta=0.0)


# --------------------------------------------------------------------------------------------
# Real tiny CPU runs
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_run_whose_format_reward_is_never_hit_stops_with_exit_3_and_a_checkpoint(tmp_path):
    """The random tiny model never writes <answer>: strict_format is 0 on every completion, every group is flat."""
    from pipeline.train import EXIT_HEALTH_STOP, run_training
    from train_helpers import demo_config

    run_dir = tmp_path / "run"
    cfg = demo_config(run_dir, max_steps=6, save_steps=100, reward_funcs=["strict_format"],
                      flat_reward_window=2, flat_reward_action="stop")
    result = run_training(cfg)
    assert result.status == "stopped" and result.exit_code == EXIT_HEALTH_STOP and result.steps == 2
    assert (run_dir / "checkpoint-2" / "trainer_state.json").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["health"]["stop_rule"] == "flat_reward"
    assert "strict_format_reward_func is 0 on every completion" in summary["stop_reason"]
