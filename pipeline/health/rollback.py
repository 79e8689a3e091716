"""Rollback on collapse (`on_collapse: rollback`): instead of stopping on NaN/inf or a kl_ceiling stop, go back
to the newest checkpoint saved before the failing log, lower the learning rate, and train on.

The pieces, each small:

- `healthy_checkpoint(output_dir, before_step)`: the newest complete checkpoint of a step before the window
  the failing log covers (so its weights predate the collapse); None when there is none.
- HealthCallback (pipeline/health/rules.py) asks for a rollback instead of a stop when `rollbacks_left` > 0
  and such a checkpoint exists: it sets `rollback_to` and stops the loop WITHOUT saving the broken state.
  Otherwise (no checkpoint yet, or `max_rollbacks` used up) the rule stops as before: exit 3, checkpoint kept.
- pipeline/train.py rebuilds the trainer and resumes from `rollback_to`; `LrScaleCallback` multiplies the
  restored optimizer's and scheduler's learning rate by `rollback_lr_factor ** rollbacks` (a checkpoint's
  optimizer.pt and scheduler.pt carry the old rate, so the rebuilt config's rate alone would be overwritten).
- `rollback_record(...)`: what metrics.jsonl (an `"event": "rollback"` line) and summary.json keep of each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from transformers import TrainerCallback

# The rules whose stop becomes a rollback with on_collapse: rollback.
COLLAPSE_RULES = ("non_finite", "kl")
ROLLBACK_EVENT = "rollback"


def healthy_checkpoint(output_dir: str | Path, before_step: int) -> Optional[Path]:
    """The newest complete checkpoint in `output_dir` whose step is below `before_step`, or None."""
    from pipeline.run.checkpoints import complete_checkpoints

    candidates = complete_checkpoints(output_dir, below_step=before_step)  # oldest first
    return candidates[-1] if candidates else None


class LrScaleCallback(TrainerCallback):
    """Multiplies the learning rate of the optimizer and scheduler (as restored from a checkpoint) by `scale`.

    transformers calls on_train_begin after `_load_optimizer_and_scheduler`, so the restored state is what
    gets scaled; a LambdaLR schedule (cosine, linear) then continues its shape from the lowered base rate.
    """

    def __init__(self, scale: float):
        self.scale = float(scale)

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        for group in getattr(optimizer, "param_groups", []):
            group["lr"] *= self.scale
            if "initial_lr" in group:
                group["initial_lr"] *= self.scale
        if lr_scheduler is not None and hasattr(lr_scheduler, "base_lrs"):
            lr_scheduler.base_lrs = [lr * self.scale for lr in lr_scheduler.base_lrs]
            lr_scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
        return control


def rollback_record(number: int, rule: str, from_step: int, checkpoint: Path, to_step: int, learning_rate: float,
                    reason: str) -> dict[str, Any]:
    """One rollback, as summary.json lists it and metrics.jsonl logs it (at `to_step`, where training resumes).

    >>> rollback_record(1, "non_finite", 7, Path("/run/checkpoint-4"), 4, 1e-4, "loss is nan")["checkpoint"]
    '/run/checkpoint-4'
    """
    return {"number": number, "rule": rule, "from_step": from_step, "checkpoint": str(checkpoint),
            "to_step": to_step, "learning_rate": learning_rate, "reason": reason}
