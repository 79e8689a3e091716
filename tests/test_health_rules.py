"""The stop/adjust rules of HealthCallback, with real TrainerControl / TrainerState and a real tiny HF Trainer."""

from __future__ import annotations

import math

import pytest
from transformers import TrainerControl, TrainerState

from grpo_pipeline.pipeline.config import HealthArguments
from grpo_pipeline.pipeline.health.rules import HEALTH_TRAINING_ARGS, HealthCallback, next_beta
from grpo_pipeline.pipeline.run.metric_names import GARBLED_RATE, REPETITION_RATE


# --------------------------------------------------------------------------------------------
# HealthCallback rules, with real TrainerControl / TrainerState
# --------------------------------------------------------------------------------------------


def _callback(beta: float = 0.0, **health) -> HealthCallback:
    return HealthCallback(HealthArguments(**health), beta=beta)


def _log(callback: HealthCallback, step: int, **logs) -> TrainerControl:
    control = TrainerControl()
    state = TrainerState(global_step=step)
    result = callback.on_log(None, state, control, logs=dict(logs))
    assert result is control
    return control


@pytest.mark.parametrize("key,value", [("loss", math.nan), ("loss", math.inf), ("grad_norm", math.inf),
                                       ("grad_norm", math.nan), ("kl", math.nan)])
def test_non_finite_always_stops_and_saves(key, value):
    callback = _callback(beta=0.04, garbled_action="warn", kl_action="warn")
    logs = {"loss": 0.1, "grad_norm": 0.5, "kl": 0.01, key: value}
    assert not _log(callback, 4, loss=0.1, grad_norm=0.5).should_training_stop
    control = _log(callback, 5, **logs)
    assert control.should_training_stop and control.should_save
    assert callback.stop_rule == "non_finite" and callback.stop_step == 5
    assert f"{key} is {value}" in callback.stop_reason and "step 5" in callback.stop_reason


def test_finite_logs_do_not_stop():
    callback = _callback(beta=0.04)
    for step in range(1, 20):
        control = _log(callback, step, loss=-0.02, grad_norm=0.3, kl=0.05, **{GARBLED_RATE: 0.1, REPETITION_RATE: 0.2})
        assert not control.should_training_stop and not control.should_save
    assert callback.stop_reason is None and callback.warnings == []


def test_garbled_stops_only_when_the_window_average_exceeds_the_threshold():
    callback = _callback(garbled_threshold=0.3, garbled_window=3)
    assert not _log(callback, 1, loss=0.1, **{GARBLED_RATE: 0.9}).should_training_stop
    assert not _log(callback, 2, loss=0.1, **{GARBLED_RATE: 0.9}).should_training_stop  # window not full
    control = _log(callback, 3, loss=0.1, **{GARBLED_RATE: 0.9})
    assert control.should_training_stop and control.should_save
    assert callback.stop_rule == "garbled"
    assert "0.900" in callback.stop_reason and "0.3" in callback.stop_reason and "3 logged steps" in callback.stop_reason


def test_garbled_spike_below_window_average_does_not_stop():
    callback = _callback(garbled_threshold=0.3, garbled_window=3)
    for step, rate in enumerate([0.0, 0.0, 0.9, 0.0, 0.0, 0.29, 0.29, 0.29], start=1):
        assert not _log(callback, step, loss=0.1, **{GARBLED_RATE: rate}).should_training_stop
    assert callback.stop_reason is None


def test_warn_action_warns_without_stopping_and_rate_limits():
    callback = HealthCallback(HealthArguments(garbled_action="warn", garbled_window=1), beta=0.0, warn_every_steps=10)
    for step in range(1, 25):
        control = _log(callback, step, loss=0.1, **{GARBLED_RATE: 0.8})
        assert not control.should_training_stop and not control.should_save
    assert callback.stop_reason is None
    assert len(callback.warnings) == 3  # steps 1, 11, 21
    assert callback.warnings[0].startswith("step 1:") and "garbled" in callback.warnings[0]


def test_repetition_warns_by_default_and_can_stop():
    callback = _callback()
    assert not _log(callback, 1, loss=0.1, **{REPETITION_RATE: 0.95}).should_training_stop
    assert len(callback.warnings) == 1 and "repetition" in callback.warnings[0]
    stopper = _callback(repetition_action="stop")
    assert _log(stopper, 1, loss=0.1, **{REPETITION_RATE: 0.95}).should_training_stop
    assert stopper.stop_rule == "repetition"


def test_kl_ceiling_stops_when_beta_positive():
    callback = _callback(beta=0.04, kl_ceiling=1.0)
    assert not _log(callback, 1, loss=0.1, kl=0.9).should_training_stop
    control = _log(callback, 2, loss=0.1, kl=3.5)
    assert control.should_training_stop and control.should_save and callback.stop_rule == "kl"
    assert "kl 3.5" in callback.stop_reason and "kl_ceiling 1.0" in callback.stop_reason
    # beta = 0 has no KL term; a kl value (from elsewhere) is not acted on.
    assert not _log(_callback(beta=0.0, kl_ceiling=1.0), 1, loss=0.1, kl=3.5).should_training_stop
    warner = _callback(beta=0.04, kl_action="warn")
    assert not _log(warner, 1, loss=0.1, kl=3.5).should_training_stop and len(warner.warnings) == 1


def test_after_a_stop_later_logs_change_nothing():
    callback = _callback()
    _log(callback, 3, loss=math.nan)
    reason = callback.stop_reason
    _log(callback, 4, loss=math.inf, **{GARBLED_RATE: 1.0})
    assert callback.stop_reason == reason and callback.stop_step == 3


def test_eval_and_summary_logs_are_ignored():
    callback = _callback(garbled_window=1)
    assert not _log(callback, 3, eval_loss=math.nan).should_training_stop
    assert not _log(callback, 3, train_runtime=12.0, train_loss=math.nan).should_training_stop


class StandInTrainer:
    """Anything with a `beta` attribute: what the callback reads and sets on a GRPOTrainer."""

    def __init__(self, beta: float):
        self.beta = beta


def test_adaptive_beta_moves_toward_the_target_within_bounds():
    settings = {"adaptive_beta": True, "kl_target": 0.05, "beta_min": 0.01, "beta_max": 0.1, "kl_ceiling": 100.0}
    trainer = StandInTrainer(0.04)
    callback = _callback(beta=0.04, **settings).attach(trainer)
    callback.on_train_begin(None, TrainerState(), TrainerControl())

    logs = {"loss": 0.1, "kl": 1.0}
    callback.on_log(None, TrainerState(global_step=1), TrainerControl(), logs=logs)
    assert trainer.beta == pytest.approx(0.06) and logs["health/beta"] == pytest.approx(0.06)  # high KL: up
    for step in range(2, 10):
        _log(callback, step, loss=0.1, kl=1.0)
    assert trainer.beta == 0.1  # capped at beta_max

    _log(callback, 10, loss=0.1, kl=0.05)
    assert trainer.beta == 0.1  # inside the dead band: unchanged
    _log(callback, 11, loss=0.1, kl=0.001)
    assert trainer.beta == pytest.approx(0.1 / 1.5)  # low KL: down
    for step in range(12, 30):
        _log(callback, step, loss=0.1, kl=0.001)
    assert trainer.beta == 0.01  # floored at beta_min
    assert callback.summary()["final_beta"] == 0.01
    assert callback.state.beta == 0.01  # the observer logs the live value


def test_adaptive_beta_needs_an_attached_trainer():
    callback = _callback(beta=0.04, adaptive_beta=True)
    with pytest.raises(RuntimeError, match="attach"):
        callback.on_train_begin(None, TrainerState(), TrainerControl())


def test_next_beta_direction():
    assert next_beta(0.04, 1.0, 0.05, 0.001, 0.5) > 0.04
    assert next_beta(0.04, 0.0, 0.05, 0.001, 0.5) < 0.04
    assert next_beta(0.04, 0.06, 0.05, 0.001, 0.5) == 0.04
    assert next_beta(0.0011, 0.0, 0.05, 0.001, 0.5) == 0.001


def test_bad_action_is_a_config_error():
    from grpo_pipeline.pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="garbled_action"):
        _callback(garbled_action="halt")


def test_on_train_begin_turns_off_the_nan_filter(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    assert args.logging_nan_inf_filter  # HF default hides NaN losses
    _callback().on_train_begin(args, TrainerState(), TrainerControl())
    assert args.logging_nan_inf_filter is False
    assert HEALTH_TRAINING_ARGS == {"logging_nan_inf_filter": False}


# --------------------------------------------------------------------------------------------
# A real (tiny, non-GRPO) HF Trainer: the stop lands with a checkpoint of the failing step.
# --------------------------------------------------------------------------------------------


def test_nan_in_a_real_trainer_stops_and_keeps_the_checkpoint(tmp_path):
    import torch
    from transformers import Trainer, TrainingArguments

    class Tiny(torch.nn.Module):
        """Its 4th forward pass (step 4) sees a NaN input, so that step's loss and gradients are NaN."""

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(2))
            self.calls = 0

        def forward(self, x, labels=None):
            self.calls += 1
            if self.calls == 4:
                x = x * math.nan
            return {"loss": ((self.weight * x).sum() - 1.0) ** 2}

    data = [{"x": torch.tensor([0.1, 0.2])} for _ in range(20)]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1, max_steps=20,
                             logging_steps=1, save_steps=1000, report_to="none", use_cpu=True,
                             learning_rate=1e-3, max_grad_norm=1.0, save_only_model=True)
    callback = _callback()
    trainer = Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 4
    assert callback.stop_step == 4 and callback.stop_rule == "non_finite"
    assert (tmp_path / "checkpoint-4").is_dir()
    assert not any(p.name.startswith("checkpoint-") and p.name != "checkpoint-4" for p in tmp_path.iterdir())


# --------------------------------------------------------------------------------------------
# The rules' edges (what bench/mutants.py found unpinned): "above" means strictly above
# --------------------------------------------------------------------------------------------


def test_adaptive_beta_leaves_beta_alone_on_both_edges_of_the_band_and_moves_just_outside():
    from grpo_pipeline.pipeline.health.rules import BETA_STEP

    target = 0.05
    for kl in (target * BETA_STEP, target / BETA_STEP, target):
        assert next_beta(0.04, kl=kl, target=target, beta_min=0.001, beta_max=0.5) == 0.04, kl
    assert next_beta(0.04, kl=target * BETA_STEP * 1.01, target=target, beta_min=0.001, beta_max=0.5) > 0.04
    assert next_beta(0.04, kl=target / BETA_STEP * 0.99, target=target, beta_min=0.001, beta_max=0.5) < 0.04


@pytest.mark.parametrize(("rule", "settings", "key", "limit"), [
    ("kl", {"kl_ceiling": 0.5, "kl_action": "stop"}, "kl", 0.5),
    ("repetition", {"repetition_threshold": 0.6, "repetition_action": "stop"}, REPETITION_RATE, 0.6),
])
def test_a_rule_fires_only_strictly_above_its_limit_and_records_the_step(rule, settings, key, limit):
    callback = _callback(beta=0.04, **settings)
    assert not _log(callback, 3, loss=0.1, **{key: limit}).should_training_stop  # at the limit: fine
    control = _log(callback, 4, loss=0.1, **{key: limit + 0.01})
    assert control.should_training_stop and control.should_save
    assert callback.summary()["stop_rule"] == rule and callback.summary()["stop_step"] == 4
    assert set(callback.summary()) >= {"stop_reason", "stop_rule", "stop_step", "warnings", "final_beta",
                                       "beta_changes"}


def test_a_repeated_warning_is_silenced_for_warn_every_steps_then_said_again():
    callback = _callback(beta=0.04, kl_ceiling=0.5, kl_action="warn")
    for step in range(1, 42):
        _log(callback, step, loss=0.1, kl=0.9)
    assert [w.split(":")[0] for w in callback.summary()["warnings"]] == ["step 1", "step 21", "step 41"]
    every_step = HealthCallback(HealthArguments(kl_ceiling=0.5, kl_action="warn"), beta=0.04, warn_every_steps=1)
    for step in range(1, 4):
        _log(every_step, step, loss=0.1, kl=0.9)
    assert len(every_step.warnings) == 3


@pytest.mark.parametrize("key", ["loss", "grad_norm", "kl", GARBLED_RATE, REPETITION_RATE])
def test_any_one_training_metric_makes_a_log_a_training_log_that_the_rules_read(key):
    logs = {key: 0.0}
    _callback(beta=0.04).on_log(None, TrainerState(global_step=8), TrainerControl(), logs=logs)
    assert logs["health/beta"] == 0.04  # read as a training log (beta is logged only on those)
    if key in ("loss", "grad_norm", "kl"):
        callback = _callback(beta=0.04, kl_action="warn")
        assert _log(callback, 7, **{key: math.nan}).should_training_stop and callback.stop_rule == "non_finite"
    eval_logs = {"eval_loss": math.nan, "train_runtime": 1.0}  # evaluation and end-of-training logs: not read
    callback = _callback(beta=0.04)
    assert not callback.on_log(None, TrainerState(global_step=9), TrainerControl(), logs=eval_logs).should_training_stop
    assert eval_logs == {"eval_loss": eval_logs["eval_loss"], "train_runtime": 1.0} and callback.stop_reason is None


def test_a_positive_beta_is_logged_with_every_training_log_and_a_zero_one_is_not():
    logs = {"loss": 0.1}
    _callback(beta=0.04).on_log(None, TrainerState(global_step=1), TrainerControl(), logs=logs)
    assert logs["health/beta"] == 0.04
    logs = {"loss": 0.1}
    _callback(beta=0.0).on_log(None, TrainerState(global_step=1), TrainerControl(), logs=logs)
    assert "health/beta" not in logs


@pytest.mark.parametrize("value", [True, False, "0.9", None, "high"])
def test_a_boolean_or_unreadable_metric_is_not_a_number_for_the_rules(value):
    callback = _callback(beta=0.04, kl_ceiling=0.5, kl_action="stop", repetition_threshold=0.6,
                         repetition_action="stop")
    control = _log(callback, 3, loss=0.1, kl=value, **{REPETITION_RATE: value})
    expect_stop = value == "0.9"  # a numeric string is read as the number it spells
    assert control.should_training_stop is expect_stop, value


def test_attaching_something_without_beta_is_refused_naming_it():
    with pytest.raises(TypeError, match="object has no `beta` attribute; attach a GRPOTrainer"):
        _callback().attach(object())


# --------------------------------------------------------------------------------------------
# The state the callback shares with the observer reward, and its settings checks
# --------------------------------------------------------------------------------------------


def test_the_callback_uses_the_state_it_is_given_and_puts_the_observers_metrics_into_the_log():
    from grpo_pipeline.pipeline.health.metrics import HealthState

    state = HealthState()
    callback = HealthCallback(HealthArguments(), beta=0.04, state=state)
    assert callback.state is state and state.beta == 0.04  # the observer logs the trainer's beta from here
    state.record({GARBLED_RATE: 0.2, REPETITION_RATE: 0.1})
    state.record({GARBLED_RATE: 0.4, REPETITION_RATE: 0.3})
    logs = {"loss": 0.5, REPETITION_RATE: 0.9}
    callback.on_log(None, TrainerState(global_step=3), TrainerControl(), logs=logs)
    assert logs[GARBLED_RATE] == pytest.approx(0.3)  # the mean since the last log, flushed into it ...
    assert logs[REPETITION_RATE] == 0.9  # ... without overwriting what TRL logged itself
    assert state.pending == {}


def test_attaching_a_trainer_shares_its_beta_with_the_observer_state():
    from types import SimpleNamespace

    from grpo_pipeline.pipeline.health.metrics import HealthState

    state = HealthState()
    callback = HealthCallback(HealthArguments(), beta=0.04, state=state).attach(SimpleNamespace(beta=0.1))
    assert callback.beta == 0.1 and state.beta == 0.1


@pytest.mark.parametrize("name", ["garbled_window", "flat_reward_window", "hacking_window"])
def test_a_window_below_one_is_refused_naming_its_field(name):
    from grpo_pipeline.pipeline.config import ConfigError

    with pytest.raises(ConfigError) as err:
        HealthCallback(HealthArguments(**{name: 0}), beta=0.0)
    assert err.value.field == name and "got 0; use a positive number of logged steps" in str(err.value)


def test_adaptive_beta_ignores_a_log_without_kl():
    from types import SimpleNamespace

    trainer = SimpleNamespace(beta=0.04)
    callback = HealthCallback(HealthArguments(adaptive_beta=True), beta=0.04).attach(trainer)
    for step in range(1, 4):
        assert not _log(callback, step, loss=0.1).should_training_stop
    assert trainer.beta == 0.04 and callback.beta_history == []


def test_arguments_without_the_nan_filter_are_left_as_they_are():
    from types import SimpleNamespace

    args = SimpleNamespace(output_dir="unused")
    _callback().on_train_begin(args, TrainerState(), TrainerControl())
    assert not hasattr(args, "logging_nan_inf_filter")


@pytest.mark.parametrize("on_collapse, done, left", [("rollback", 0, 3), ("rollback", 2, 1), ("stop", 0, 0)])
def test_the_run_builds_its_health_rules_from_the_config(qwen_tokenizer, on_collapse, done, left):
    from grpo_pipeline.pipeline.config import PipelineConfig
    from grpo_pipeline.pipeline.health.rules import build_health

    cfg = PipelineConfig().replace(temperature=0.7, num_generations=6, beta=0.05, on_collapse=on_collapse,
                                   max_rollbacks=3)
    observer, callback = build_health(cfg, qwen_tokenizer, rollbacks_done=done)
    assert observer.__name__ == "health" and callback.settings is cfg.health
    assert (callback.temperature, callback.num_generations, callback.beta) == (0.7, 6, 0.05)
    assert callback.rollbacks_left == left and callback.state.beta == 0.05
    observer(completions=["<answer>4</answer>"], completion_ids=[[19, 20]], log_metric=lambda *a: None)
    assert callback.state.batches == 1  # the observer and the callback share one state


def test_a_run_that_has_not_rolled_back_yet_has_every_rollback_left(qwen_tokenizer):
    from grpo_pipeline.pipeline.config import PipelineConfig
    from grpo_pipeline.pipeline.health.rules import build_health

    cfg = PipelineConfig().replace(on_collapse="rollback", max_rollbacks=2)
    assert build_health(cfg, qwen_tokenizer)[1].rollbacks_left == 2


def test_the_runs_observer_measures_completions_given_without_their_token_ids(qwen_tokenizer):
    """A caller that passes only the texts (no completion_ids) is measured in the run's own tokens."""
    from grpo_pipeline.pipeline.config import PipelineConfig
    from grpo_pipeline.pipeline.health.rules import build_health

    observer, callback = build_health(PipelineConfig(), qwen_tokenizer)
    metrics = {}
    text = "<answer>4</answer> " * 3
    assert observer(completions=[text], log_metric=metrics.__setitem__) == [0.0]
    assert callback.state.batches == 1
    assert metrics["health/completion_length"] == len(qwen_tokenizer.encode(text, add_special_tokens=False))
