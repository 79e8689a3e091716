"""The stale_rollout rule (pipeline/health/rules.py) and the rollout probe (pipeline/health/rollout.py).

The rule on made-up logs and the probe on hand-moved weights here; on a real engine, TRL's colocated vLLM on vLLM's
CPU build, in tests/test_vllm_engine.py (a following engine never fires over a run, one whose sync is off stops it).
The Unsloth engine (vLLM through load_lora + fast_generate) needs CUDA and is checked against the strict double.
"""

from __future__ import annotations

import math

import pytest
from transformers import TrainerControl, TrainerState

from grpo_pipeline.pipeline.config import HealthArguments
from grpo_pipeline.pipeline.run.metric_names import ROLLOUT_LOGP_GAP, ROLLOUT_WEIGHTS_STEP
from grpo_pipeline.pipeline.health.rollout import (
    IMPORTANCE_SAMPLING_RATIO,
    SAMPLING_LOGP_DIFFERENCE,
    RolloutProbe,
    trainer_logprobs,
)
from grpo_pipeline.pipeline.health.rules import HealthCallback
from grpo_pipeline.pipeline.health.rollout import ROLLOUT_GAP_FLOOR, STALE_LOGP_GAP, STALE_ROLLOUT_WINDOW


def _callback(action="stop"):
    return HealthCallback(HealthArguments(stale_rollout_action=action), beta=0.0)


def _feed(callback, logs_by_step):
    control = TrainerControl()
    for step, logs in enumerate(logs_by_step, start=1):
        callback.on_log(None, TrainerState(global_step=step), control, logs={"loss": 0.1, **logs})
        if callback.stop_reason:
            break
    return callback


# ------------------------------------------------------------------------------------------------ passive part


HEALTHY, STALE = 0.015, 0.201  # TRL #5312: sampling_logp_difference/mean before and after sleep mode broke sync
PASSIVE = [  # (metric, its values per logged step, fires at step)
    (SAMPLING_LOGP_DIFFERENCE, [HEALTHY] * 10, None),
    (SAMPLING_LOGP_DIFFERENCE, [STALE] * STALE_ROLLOUT_WINDOW, STALE_ROLLOUT_WINDOW),
    (SAMPLING_LOGP_DIFFERENCE, [HEALTHY, STALE, STALE, STALE], 4),
    (SAMPLING_LOGP_DIFFERENCE, [STALE, STALE, HEALTHY] * 3, None),  # never a whole window
    (SAMPLING_LOGP_DIFFERENCE, [STALE_LOGP_GAP] * 5, None),  # at the threshold: not above it
    (SAMPLING_LOGP_DIFFERENCE, [float("nan")] * 5, None),
    (IMPORTANCE_SAMPLING_RATIO, [1.0, 0.99, 1.01] * 3, None),
    (IMPORTANCE_SAMPLING_RATIO, [math.exp(STALE)] * STALE_ROLLOUT_WINDOW, STALE_ROLLOUT_WINDOW),
    (IMPORTANCE_SAMPLING_RATIO, [math.exp(-STALE)] * STALE_ROLLOUT_WINDOW, STALE_ROLLOUT_WINDOW),
    (IMPORTANCE_SAMPLING_RATIO, [0.0] * 5, None),  # TRL's value when no token was scored
]


@pytest.mark.parametrize("metric, values, fires_at", PASSIVE)
def test_the_passive_part_fires_when_trls_gap_stays_above_threshold_for_a_window(metric, values, fires_at):
    callback = _feed(_callback(), [{metric: v} for v in values])
    assert callback.stop_step == fires_at
    if fires_at:
        assert callback.stop_rule == "stale_rollout"
        assert metric in callback.stop_reason and f"{values[-1]:.3g}" in callback.stop_reason
        for words in ("adapter is not synced", "woke from sleep", "quantisation mismatch", "Fix:",
                      "stale_rollout_action: warn"):
            assert words in callback.stop_reason


def test_warn_only_warns():
    callback = _feed(_callback("warn"), [{SAMPLING_LOGP_DIFFERENCE: STALE}] * 5)
    assert callback.stop_reason is None and len(callback.warnings) == 1
    assert "sampling_logp_difference" in callback.warnings[0]


# ------------------------------------------------------------------------------------------------ active part


@pytest.mark.parametrize("held, gap, fires", [
    (0, 2 * ROLLOUT_GAP_FLOOR, True),  # on step 0's weights at step 1
    (1, 0.0, False),  # on the current weights
    (1, 2 * ROLLOUT_GAP_FLOOR, False),  # current weights, a numeric mismatch: the passive part's business
    (0, ROLLOUT_GAP_FLOOR / 2, False),  # older weights, but too close to tell apart from noise
    (float("nan"), 1.0, False),  # the engine gave no finite scores
])
def test_the_active_part_fires_for_an_engine_on_an_older_step(held, gap, fires):
    callback = _feed(_callback(), [{ROLLOUT_LOGP_GAP: gap, ROLLOUT_WEIGHTS_STEP: held}])
    assert (callback.stop_rule == "stale_rollout") is fires
    if fires:
        assert "holds step 0's weights at step 1" in callback.stop_reason and ROLLOUT_LOGP_GAP in callback.stop_reason


def test_the_probe_names_the_step_whose_weights_the_engine_holds():
    """Without training: the weights are moved by hand between probes."""
    import torch

    from grpo_pipeline.pipeline.backends import plain
    from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer
    from train_helpers import demo_config

    cfg = demo_config("unused")
    model = plain.load_model("tiny-demo", cfg, for_training=False)
    tokenizer = load_tokenizer("tiny-demo")
    trainer = type("Trainer", (), {"model": model})()

    class Frozen:
        def __init__(self):
            self.weights = {k: v.clone() for k, v in model.state_dict().items()}

        def score(self, prompt_ids, continuation_ids):
            current = {k: v.clone() for k, v in model.state_dict().items()}
            model.load_state_dict(self.weights)
            try:
                return trainer_logprobs(model, prompt_ids, continuation_ids)
            finally:
                model.load_state_dict(current)

    following = RolloutProbe(type("Following", (), {"score": lambda self, p, c: trainer_logprobs(model, p, c)})(),
                             tokenizer, every_steps=1)
    frozen = RolloutProbe(Frozen(), tokenizer, every_steps=1)
    for probe in (following, frozen):
        probe.remember(trainer.model, 0)
    for step in (1, 2, 3):
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.02 * torch.randn_like(param))
        assert following.measure(model, step) == {ROLLOUT_LOGP_GAP: 0.0, ROLLOUT_WEIGHTS_STEP: float(step)}
        seen = frozen.measure(model, step)
        assert seen[ROLLOUT_WEIGHTS_STEP] == 0.0 and seen[ROLLOUT_LOGP_GAP] > ROLLOUT_GAP_FLOOR


# ------------------------------------------------------------------------------------------------ Unsloth's engine


@pytest.fixture
def unsloth_engine(monkeypatch, tmp_path):
    import tests.fake_unsloth as fake_unsloth
    from grpo_pipeline.pipeline.backends import unsloth as unsloth_backend
    from grpo_pipeline.pipeline.backends import unsloth_setup
    from tests.unsloth_helpers import make_cfg

    monkeypatch.setenv("UNSLOTH_VLLM_STANDBY", "1")
    monkeypatch.setattr(unsloth_setup, "_prepared", None)
    handle = fake_unsloth.install()
    cfg = make_cfg(output_dir=str(tmp_path / "run"))
    model, tokenizer = fake_unsloth.FastLanguageModel.from_pretrained(
        model_name="unsloth/Qwen2.5-1.5B-Instruct", fast_inference=True, max_lora_rank=32,
        gpu_memory_utilization=0.5, unsloth_vllm_standby=True)
    model = fake_unsloth.FastLanguageModel.get_peft_model(model, r=16, lora_alpha=32)
    trainer = type("Trainer", (), {"model": model})()
    yield unsloth_backend.rollout_engine(trainer, tokenizer, cfg), model, fake_unsloth, cfg
    handle.uninstall()


def test_unsloths_engine_is_sent_the_live_adapter_and_scored_through_prompt_logprobs(unsloth_engine):
    engine, model, fake, cfg = unsloth_engine
    model.vllm_engine.sleep(1)  # standby: the trainer leaves vLLM asleep between rollouts
    fake.STATE.calls.clear()
    scores = engine.score([11, 12, 13], [21, 22])
    (sent,) = fake.calls_named("unsloth_zoo.load_lora")
    assert sent.kwargs["load_tensors"] is True  # the rollouts' sync path: the adapter's current tensors
    (params,) = fake.calls_named("vllm.SamplingParams")
    assert params.kwargs == {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 1}
    (generate,) = fake.calls_named("model.fast_generate")
    assert generate.args[0] == [{"prompt_token_ids": [11, 12, 13, 21, 22]}] and not generate.kwargs["sleeping"]
    request = generate.kwargs["lora_request"]
    assert scores == [fake.fake_prompt_logprob(3, 21, request), fake.fake_prompt_logprob(4, 22, request)]
    names = [c.name for c in fake.record_calls()]
    assert names.index("vllm.LLM.wake_up") < names.index("model.fast_generate") < names.index("vllm.LLM.sleep")
    assert model.vllm_engine.is_sleeping()  # back to sleep, as the trainer left it


def test_without_a_vllm_engine_there_is_nothing_to_probe(monkeypatch, tmp_path):
    import tests.fake_unsloth as fake_unsloth
    from grpo_pipeline.pipeline.backends import unsloth as unsloth_backend
    from tests.unsloth_helpers import make_cfg

    handle = fake_unsloth.install()
    try:
        model, tokenizer = fake_unsloth.FastLanguageModel.from_pretrained(
            model_name="unsloth/Qwen2.5-1.5B-Instruct", fast_inference=False)
        trainer = type("Trainer", (), {"model": fake_unsloth.FastLanguageModel.get_peft_model(model, r=16)})()
        cfg = make_cfg(output_dir=str(tmp_path), fast_inference=False)
        assert unsloth_backend.rollout_engine(trainer, tokenizer, cfg) is None
    finally:
        handle.uninstall()


def test_the_trainer_side_scores_logits_even_inside_unsloths_hidden_states_mode(monkeypatch):
    """Unsloth's GRPO forward returns hidden states as .logits while UNSLOTH_RETURN_HIDDEN_STATES=1."""
    import os

    seen = []

    class Model:
        device, training = "cpu", True

        def __call__(self, input_ids):
            import torch

            seen.append(os.environ.get("UNSLOTH_RETURN_HIDDEN_STATES"))
            return type("Out", (), {"logits": torch.zeros(1, input_ids.shape[1], 8)})()

    monkeypatch.setenv("UNSLOTH_RETURN_HIDDEN_STATES", "1")
    scores = trainer_logprobs(Model(), [1, 2], [3], dropout=False)
    assert seen == ["0"] and os.environ["UNSLOTH_RETURN_HIDDEN_STATES"] == "1"
    assert scores == [pytest.approx(-math.log(8))]
