"""Rollout freshness: is the separate engine that samples the rollouts (vLLM) sampling from the weights being trained?

If the adapter sync silently fails, the loss moves while the rollouts come from an older policy. Two measures, read
by the stale-rollout rule (`StaleRollouts`): TRL's trainer-versus-sampler metrics (Unsloth's rl_replacements.py logs
the same keys), and `RolloutProbe`: a fixed text scored by the trainer and by the engine every `rollout_probe_steps`.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict, deque
from typing import Any, Callable, Protocol

from grpo_pipeline.pipeline.run.plots import as_number
from grpo_pipeline.pipeline.run.metric_names import ROLLOUT_LOGP_GAP, ROLLOUT_WEIGHTS_STEP
# TRL's keys (GRPOTrainer._generate_and_score_completions, trl 1.15): the per-token |trainer - sampler| log-prob
# gap over completion tokens, and the importance-sampling ratio exp(trainer - sampler).
SAMPLING_LOGP_DIFFERENCE = "sampling/sampling_logp_difference/mean"
IMPORTANCE_SAMPLING_RATIO = "sampling/importance_sampling_ratio/mean"

# The fixed probe: a short arithmetic exchange in the answer format the rewards expect. Any fixed text works (it is
# scored, never generated); it is short so that two forward passes cost little beside a step (bench/rollout_probe.py).
PROBE_PROMPT = "Q: 7 + 5?\nA:"
PROBE_CONTINUATION = " <answer>12</answer>"
UNSLOTH_HIDDEN_STATES = "UNSLOTH_RETURN_HIDDEN_STATES"
# Probe scores kept, newest last, to name the step an engine is on (the initial weights are always kept).
PROBE_HISTORY = 16


class RolloutEngine(Protocol):
    """What a backend's `rollout_engine` returns: the separate engine the rollouts come from."""

    def score(self, prompt_ids: list[int], continuation_ids: list[int]) -> list[float]:
        """Per-token log-probabilities (temperature 1) of `continuation_ids` after `prompt_ids`, once the current
        adapter has been sent to the engine the way the rollouts send it."""


def trainer_logprobs(model: Any, prompt_ids: list[int], continuation_ids: list[int], dropout: bool = True
                     ) -> list[float]:
    """The same log-probabilities from the trainer's model (its current adapter), without dropout: in eval mode
    when the model has any (`dropout`; switching modes walks every module, half the probe's cost on the demo)."""
    import torch  # lazy: the health rules import without torch

    ids = torch.tensor([list(prompt_ids) + list(continuation_ids)], device=model.device)
    was_training = model.training
    # Unsloth's GRPO forward hands back hidden states as `.logits` while UNSLOTH_RETURN_HIDDEN_STATES is "1"
    # (rl_replacements.py grpo_trainer__get_per_token_logps_and_entropies sets it around its own forwards); the
    # probe needs the logits, so it is "0" for this forward and put back after.
    hidden_states = os.environ.get(UNSLOTH_HIDDEN_STATES)
    os.environ[UNSLOTH_HIDDEN_STATES] = "0"
    if dropout:
        model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    finally:
        if dropout:
            model.train(was_training)
        if hidden_states is None:
            os.environ.pop(UNSLOTH_HIDDEN_STATES, None)
        else:
            os.environ[UNSLOTH_HIDDEN_STATES] = hidden_states
    chosen = torch.tensor(continuation_ids, device=logits.device)
    return torch.log_softmax(logits, dim=-1).gather(-1, chosen[:, None])[:, 0].tolist()


def mean_gap(a: list[float], b: list[float]) -> float:
    """Mean per-token |a - b|, the measure of TRL's sampling_logp_difference/mean.

    >>> mean_gap([-1.0, -2.0], [-1.5, -2.0])
    0.25
    """
    return sum(abs(x - y) for x, y in zip(a, b)) / max(1, len(a))


class RolloutProbe:
    """The active part: `measure(model, step)` returns the two health metrics for the step's log."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, every_steps: int):
        self.engine = engine
        self.every_steps = int(every_steps)
        self.prompt_ids = tokenizer(PROBE_PROMPT, add_special_tokens=False)["input_ids"]
        self.continuation_ids = tokenizer(PROBE_CONTINUATION, add_special_tokens=False)["input_ids"]
        self.history: OrderedDict[int, list[float]] = OrderedDict()  # step -> the trainer's probe scores
        self._dropout: bool | None = None  # whether the trainer's model has dropout (looked up once)

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def remember(self, model: Any, step: int) -> list[float]:
        """The trainer's scores at `step` (the weights after that many updates), kept to recognise them later."""
        if self._dropout is None:  # any module that drops out in training mode (LoRA's lora_dropout, the model's own)
            config = getattr(model, "config", None)
            self._dropout = (getattr(config, "attention_dropout", 0) or 0) > 0 or any(
                type(m).__name__.startswith("Dropout") and getattr(m, "p", 0) > 0 for m in model.modules())
        scores = trainer_logprobs(model, self.prompt_ids, self.continuation_ids, dropout=self._dropout)
        self.history[step] = scores
        while len(self.history) > PROBE_HISTORY:  # the oldest but the first (initial weights) goes
            del self.history[list(self.history)[1]]
        return scores

    def measure(self, model: Any, step: int) -> dict[str, float]:
        """{rollout_logp_gap, rollout_weights_step} at `step`: the engine's scores against the trainer's now, and
        the kept step whose trainer scores are nearest the engine's (the current one on a tie)."""
        now = self.remember(model, step)
        engine = self.engine.score(self.prompt_ids, self.continuation_ids)
        if not all(math.isfinite(x) for x in engine):
            return {ROLLOUT_LOGP_GAP: float("nan"), ROLLOUT_WEIGHTS_STEP: float("nan")}
        gaps = {kept: mean_gap(engine, scores) for kept, scores in self.history.items()}
        nearest = min(gaps, key=lambda kept: (gaps[kept], -kept))
        return {ROLLOUT_LOGP_GAP: mean_gap(engine, now), ROLLOUT_WEIGHTS_STEP: float(nearest)}


def build_probe(steps: int, tokenizer: Any, rollout_engine: Callable[[], Any]) -> RolloutProbe | None:
    """The run's probe, every `steps` (rollout_probe_steps) steps: on whenever `rollout_engine()` (the backend's)
    reports a separate rollout engine and steps > 0."""
    if steps <= 0:
        return None
    engine = rollout_engine()
    return None if engine is None else RolloutProbe(engine, tokenizer, steps)


# Stale rollouts, passive part: TRL's per-token |trainer - sampler| log-prob gap (sampling_logp_difference/mean; for
# the importance-sampling ratio, |log ratio|). A healthy vLLM engine shows about 0.015 and one that woke from sleep
# with old weights 0.201 (TRL #5312); 0.1 sits between them, above bf16 kernel noise, below a stale engine's gap.
STALE_LOGP_GAP = 0.1
# ... on each of this many consecutive logged steps: one noisy batch (a rare token scored far apart) must not fire.
STALE_ROLLOUT_WINDOW = 3
# Active part (the probe): an engine is on older weights when its probe scores are nearest an older step's AND
# farther than this from the current adapter's. Half the passive threshold: the probe is a fixed, teacher-forced
# text (no sampling noise), so a correct engine's gap is kernel and dtype noise only (~0.015 in bf16, 0 on CPU).
ROLLOUT_GAP_FLOOR = 0.05
STALE_CAUSES = ("likely causes: the adapter is not synced to the rollout engine (LoRA updates never reach vLLM), the "
                "engine woke from sleep with old weights (standby / sleep mode), or a dtype or quantisation mismatch "
                "between the trainer and the engine. Fix: check that every rollout sends the current adapter "
                "(Unsloth: model.load_lora(..., load_tensors=True) before fast_generate), try vllm_standby: false, "
                "and give the trainer and the engine the same dtype; health/rollout_logp_gap "
                "(rollout_probe_steps) tells a stale engine (it matches an older step) from a numeric mismatch")


class StaleRollouts:
    """The rule's memory of the last STALE_ROLLOUT_WINDOW logged gaps, and its check of each training log."""

    def __init__(self) -> None:
        self.window: deque[tuple[str, float]] = deque(maxlen=STALE_ROLLOUT_WINDOW)

    def check(self, logs: dict[str, Any], step: int) -> str | None:
        """Why the rollouts look stale (the rule's warning or stop), or None."""
        gaps = [(key, abs(value) if key == SAMPLING_LOGP_DIFFERENCE else abs(math.log(value)), value)
                for key in (SAMPLING_LOGP_DIFFERENCE, IMPORTANCE_SAMPLING_RATIO)
                if (value := as_number(logs.get(key))) is not None and math.isfinite(value)
                and (key == SAMPLING_LOGP_DIFFERENCE or value > 0)]
        if gaps:
            key, gap, value = max(gaps, key=lambda g: g[1])
            self.window.append((key, value) if gap > STALE_LOGP_GAP else ("", value))
            if len(self.window) == STALE_ROLLOUT_WINDOW and all(k for k, _ in self.window):
                return (f"rollouts may be sampled from stale weights: TRL's {key} was "
                        f"{', '.join(f'{v:.3g}' for _, v in self.window)} on the last "
                        f"{STALE_ROLLOUT_WINDOW} logged steps, a per-token log-prob gap above {STALE_LOGP_GAP} "
                        f"between the trainer and the rollout engine (a healthy engine shows about 0.015); "
                        + STALE_CAUSES)
        gap, held = as_number(logs.get(ROLLOUT_LOGP_GAP)), as_number(logs.get(ROLLOUT_WEIGHTS_STEP))
        if gap is None or held is None or not math.isfinite(held):
            return None
        if held < step and gap > ROLLOUT_GAP_FLOOR:
            return (f"the rollout engine holds step {int(held)}'s weights at step {step}: on the fixed probe its "
                    f"log-probabilities are nearest the trainer's at step {int(held)} and {gap:.3g} per token "
                    f"from the current adapter ({ROLLOUT_LOGP_GAP}, above {ROLLOUT_GAP_FLOOR}), so the rollouts "
                    "come from an older policy than the one being trained; " + STALE_CAUSES)
        return None
