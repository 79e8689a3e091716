"""Stale rollouts: the health rule that tells when a separate rollout engine (vLLM) samples from older weights
than the trainer's, from TRL's logged trainer-vs-sampler gap and the rollout probe (pipeline/health/rollout.py)."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from grpo_pipeline.pipeline.health.metrics import log_number
from grpo_pipeline.pipeline.run.metric_names import ROLLOUT_LOGP_GAP, ROLLOUT_WEIGHTS_STEP
from grpo_pipeline.pipeline.health.rollout import IMPORTANCE_SAMPLING_RATIO, SAMPLING_LOGP_DIFFERENCE

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
                if (value := log_number(logs.get(key))) is not None and math.isfinite(value)
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
        gap, held = log_number(logs.get(ROLLOUT_LOGP_GAP)), log_number(logs.get(ROLLOUT_WEIGHTS_STEP))
        if gap is None or held is None or not math.isfinite(held):
            return None
        if held < step and gap > ROLLOUT_GAP_FLOOR:
            return (f"the rollout engine holds step {int(held)}'s weights at step {step}: on the fixed probe its "
                    f"log-probabilities are nearest the trainer's at step {int(held)} and {gap:.3g} per token "
                    f"from the current adapter ({ROLLOUT_LOGP_GAP}, above {ROLLOUT_GAP_FLOOR}), so the rollouts "
                    "come from an older policy than the one being trained; " + STALE_CAUSES)
        return None
