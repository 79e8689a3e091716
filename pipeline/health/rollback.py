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
- `base_model_reference(model)`: every trainer, the rebuilt one too, measures kl against the base model.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Optional

from transformers import TrainerCallback

from grpo_pipeline.pipeline.run.checkpoints import complete_checkpoints  # (run/ sits below health/: the one reading of a checkpoint)

# The rules whose stop becomes a rollback with on_collapse: rollback.
COLLAPSE_RULES = ("non_finite", "kl")
ROLLBACK_EVENT = "rollback"
# The adapter name trl.GRPOTrainer.__init__ gives the frozen copy it measures kl against when it is handed a
# PeftModel with beta != 0 (its `model.add_adapter("ref", default_config)` branch).
REFERENCE_ADAPTER = "ref"


def healthy_checkpoint(output_dir: str | Path, before_step: int) -> Optional[Path]:
    """The newest complete checkpoint in `output_dir` whose step is below `before_step`, or None."""
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
def base_model_reference(model: Any) -> Iterator[None]:
    """Around building the trainer (the first time and again after a rollback): kl is measured against the base model
    as loaded, before any format warm-up (adapters disabled), on both backends.

    That is the reference Unsloth's patched trainer measures against: it comments out TRL's ref-adapter block
    (unsloth/models/rl.py: `_patch_trl_rl_trainers_impl`, its TRL >= 1.4 branch, and `patch_functions`, "use base
    model as reference, not SFT/LoRA model"), so TRL's GRPOTrainer._generate_and_score_completions falls back to
    `use_adapter(model, adapter_name=None)`, the adapters disabled. TRL's own trainer, handed a PeftModel with
    beta != 0 (the warm-up's, or the live model after a rollback), instead adds a "ref" adapter copied from the
    current one in __init__ (`model.add_adapter("ref", default_config)`): the warmed or, after a rollback, the
    collapsed adapter. So any "ref" adapter goes before TRL builds (TRL would raise "Adapter with name 'ref'
    already exists") and the one TRL adds goes after: one reference, which neither a warm-up nor a rollback moves,
    and checkpoints hold no ref/ adapter. Without a warm-up nothing changes: TRL gets a peft_config, adds no "ref",
    and the fresh adapter starts at the base model. A no-op for a model without adapters (Unsloth's double).
    """
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
