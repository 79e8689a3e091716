"""Rollback on collapse (`on_collapse: rollback`): instead of stopping on NaN/inf or a kl_ceiling stop, go back
to the newest checkpoint saved before the failing log, lower the learning rate, and train on.

The pieces, each small:

- `healthy_checkpoint(output_dir, before_step)`: the newest complete checkpoint of a step before the first
  weights the failing log measured (a step's loss, kl and gradients are computed before its update, so a log at
  step s over L steps measured the weights of steps s-L .. s-1; HealthCallback._checkpoint_before); None when
  there is none.
- HealthCallback (pipeline/health/rules.py) asks for a rollback instead of a stop when `rollbacks_left` > 0
  and such a checkpoint exists: it sets `rollback_to` and stops the loop WITHOUT saving the broken state.
  Otherwise (no checkpoint yet, or `max_rollbacks` used up) the rule stops as before: exit 3, checkpoint kept.
- pipeline/train.py rebuilds the trainer and resumes from `rollback_to`; `LrScaleCallback` multiplies the
  restored optimizer's and scheduler's learning rate by `rollback_lr_factor ** rollbacks` (a checkpoint's
  optimizer.pt and scheduler.pt carry the old rate, so the rebuilt config's rate alone would be overwritten).
- `rollback_record(...)`: what metrics.jsonl (an `"event": "rollback"` line) and summary.json keep of each.
- `kept_reference(model, beta)`: the rebuilt trainer measures kl against the same reference as the first one.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Optional

from transformers import TrainerCallback

# The rules whose stop becomes a rollback with on_collapse: rollback.
COLLAPSE_RULES = ("non_finite", "kl")
ROLLBACK_EVENT = "rollback"
# The adapter name trl.GRPOTrainer.__init__ gives the frozen copy it measures kl against when it is handed a
# PeftModel with beta != 0 (its `model.add_adapter("ref", default_config)` branch).
REFERENCE_ADAPTER = "ref"


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


@contextlib.contextmanager
def kept_reference(model: Any, beta: float) -> Iterator[None]:
    """Around building the trainer again after a rollback: keep the reference the first trainer measured kl against.

    Handed a PeftModel with beta != 0, trl.GRPOTrainer.__init__ adds a "ref" adapter copied from the current
    "default" one. The first trainer got either a plain model and a peft_config (no "ref" adapter: kl is measured
    against the base model, adapters disabled) or the warm-up's PeftModel (a "ref" copy of the warmed adapter).
    Rebuilt on the live, collapsed model, TRL would copy the COLLAPSED weights as the reference (kl then measures
    the distance from the collapse), or, with a "ref" already there, raise "Adapter with name 'ref' already
    exists". So: set an existing reference's weights aside, let TRL build, then put them back, or drop the
    reference TRL added where the first trainer had none.
    """
    configs = getattr(model, "peft_config", None)
    if not beta or not isinstance(configs, dict):
        yield
        return
    marker = f".{REFERENCE_ADAPTER}."
    kept = None
    if REFERENCE_ADAPTER in configs:
        kept = {name: param.detach().clone() for name, param in model.named_parameters() if marker in name}
        model.delete_adapter(REFERENCE_ADAPTER)
    yield
    if REFERENCE_ADAPTER not in model.peft_config:
        return
    if kept is None:
        model.delete_adapter(REFERENCE_ADAPTER)
        return
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if marker in name:
                param.copy_(kept[name])
