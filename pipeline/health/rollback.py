"""Rollback on collapse (`on_collapse: rollback`): instead of stopping on NaN/inf or a kl_ceiling stop, go back
to the newest checkpoint saved before the failing log, lower the learning rate, and train on.

HealthCallback (rules.py) sets `rollback_to` and stops the loop without saving the broken state; with no such checkpoint, or `max_rollbacks` used up, it stops as before (exit 3). pipeline/train.py resumes
from it, `LrScaleCallback` scaling the restored learning rate by `rollback_lr_factor ** rollbacks`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from transformers import TrainerCallback

# The rules whose stop becomes a rollback with on_collapse: rollback.
COLLAPSE_RULES = ("non_finite", "kl")
ROLLBACK_EVENT = "rollback"
# The adapter name trl.GRPOTrainer.__init__ gives the frozen copy it measures kl against when it is handed a
# PeftModel with beta != 0 (its `model.add_adapter("ref", default_config)` branch).
REFERENCE_ADAPTER = "ref"


class LrScaleCallback(TrainerCallback):
    """Multiplies the learning rate of the optimizer and scheduler by `scale`: transformers calls on_train_begin
    after `_load_optimizer_and_scheduler`, so the restored rate (which the rebuilt config's would not change) is
    scaled, and a LambdaLR schedule continues its shape from the lowered base rate."""

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
def base_model_reference(model: Any) -> Iterator[None]:
    """Around building the trainer: kl is measured against the base model before any warm-up (adapters disabled), on
    both backends, as Unsloth does (unsloth/models/rl.py `patch_functions`: "use base model as reference, not
    SFT/LoRA model"). TRL's own trainer, handed a PeftModel with beta != 0, adds a "ref" copy of the current (warmed
    or collapsed) adapter: any "ref" goes before TRL builds (it would raise "Adapter with name 'ref' already
    exists") and the one TRL adds goes after."""
    _drop_reference_adapter(model)
    yield
    _drop_reference_adapter(model)


def _drop_reference_adapter(model: Any) -> None:
    configs = getattr(model, "peft_config", None)
    if isinstance(configs, dict) and REFERENCE_ADAPTER in configs:
        model.delete_adapter(REFERENCE_ADAPTER)


def kl_reference(trainer: Any) -> str:
    """Which reference a built GRPOTrainer measures kl against, decided as TRL 1.15's
    GRPOTrainer._generate_and_score_completions decides it (the Unsloth double models the same attributes)."""
    if not getattr(trainer, "beta", 0.0):
        return "none (beta 0)"
    if getattr(trainer, "ref_model", None) is not None:
        return "a separate reference model"
    configs = getattr(trainer.model, "peft_config", None)
    if isinstance(configs, dict) and REFERENCE_ADAPTER in configs:
        return f"the {REFERENCE_ADAPTER!r} adapter (a copy of the adapter the trainer was given)"
    return "the base model before any warm-up (adapters disabled)"
