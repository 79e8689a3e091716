"""Health sees a tool run's turns: the garbled and repetition measures score the model's own turns, not a tool's
output; the share of rollouts that ended at max_tool_calling_iterations is logged; a rule warns when no rollout has
called a tool after first_tool_call_steps logged steps."""

from __future__ import annotations

import pytest
from transformers import TrainerControl, TrainerState

from grpo_pipeline.pipeline.config import HealthArguments
from grpo_pipeline.pipeline.run.metric_names import GARBLED_RATE, REPETITION_RATE
from grpo_pipeline.pipeline.health.metrics import HealthState, make_observer
from grpo_pipeline.pipeline.health.rules import HealthCallback
from grpo_pipeline.pipeline.health.tools import MAX_ITERATIONS_SHARE, TOOL_CALL_FREQUENCY

CALL = {"role": "assistant", "content": "I will look it up.", "tool_calls": [{"type": "function", "function": {
    "name": "lookup", "arguments": {"key": "k"}}}]}
NOISY_TOOL = {"role": "tool", "name": "lookup", "content": "\ufffd\ufffd " + "row row row row " * 40}
ANSWER = {"role": "assistant", "content": "<reasoning>It says 5.</reasoning>\n<answer>5</answer>"}


@pytest.fixture
def observe(qwen_tokenizer):
    """observe(completions, max_iterations=None) -> what the health observer logs for them, with the session's real
    Qwen2.5 tokenizer (read only: it encodes)."""
    return lambda completions, max_iterations=None: _observe(qwen_tokenizer, completions, max_iterations)


def _observe(tokenizer, completions, max_iterations):
    logged = {}
    observer = make_observer(HealthState(), frozenset(), tokenizer, max_iterations)
    everything = ["".join(str(m["content"]) for m in c) if isinstance(c, list) else c for c in completions]
    observer(completions=completions, completion_ids=[tokenizer.encode(t) for t in everything],
             log_metric=lambda name, value: logged.__setitem__(name, value))
    return logged


def test_garbled_and_repetition_score_the_models_own_turns_not_the_tools_output(observe):
    logged = observe([[CALL, NOISY_TOOL, ANSWER]] * 2)
    assert logged[GARBLED_RATE] == 0.0 and logged[REPETITION_RATE] < 0.1
    # the same text written by the model itself is caught
    own = {"role": "assistant", "content": NOISY_TOOL["content"]}
    logged = observe([[CALL, NOISY_TOOL, own]] * 2)
    assert logged[GARBLED_RATE] == 1.0 and logged[REPETITION_RATE] > 0.5


def test_the_share_of_rollouts_ended_at_max_tool_calling_iterations_is_logged(observe):
    ended, answered = [CALL, NOISY_TOOL, CALL], [CALL, NOISY_TOOL, ANSWER]
    assert observe([ended, answered, ended, answered], max_iterations=1)[MAX_ITERATIONS_SHARE] == 0.5
    assert observe([ended, answered], max_iterations=2)[MAX_ITERATIONS_SHARE] == 0.0
    assert MAX_ITERATIONS_SHARE not in observe([ended, answered])  # unset: TRL loops until no call is left


def test_a_warning_when_no_rollout_has_called_a_tool_after_n_steps():
    callback = HealthCallback(HealthArguments(first_tool_call_steps=3), beta=0.0)
    for step in range(1, 6):
        control = callback.on_log(None, TrainerState(global_step=step), TrainerControl(),
                                  logs={"loss": 0.1, TOOL_CALL_FREQUENCY: 0.0})
        assert not control.should_training_stop
    assert len(callback.warnings) == 1 and callback.warnings[0].startswith("step 3: no rollout has called a tool")
    assert "sft_warmup_steps" in callback.warnings[0]
    called = HealthCallback(HealthArguments(first_tool_call_steps=3), beta=0.0)
    for step, frequency in enumerate([0.0, 0.5, 0.0, 0.0], start=1):
        called.on_log(None, TrainerState(global_step=step), TrainerControl(),
                      logs={"loss": 0.1, TOOL_CALL_FREQUENCY: frequency})
    untooled = HealthCallback(HealthArguments(first_tool_call_steps=1), beta=0.0)
    untooled.on_log(None, TrainerState(global_step=1), TrainerControl(), logs={"loss": 0.1})
    assert called.warnings == [] and untooled.warnings == []
