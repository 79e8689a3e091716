"""The methods of TRL's GRPOTrainer (and of transformers' Trainer under it) that this project replaces: all of them
here, installed once on each trainer build_trainer makes (pipeline/trainer/build.py), each with why.

| method | from | why it is replaced | the replacement's logic |
|---|---|---|---|
| `create_model_card` | Trainer | the card (output_dir/README.md) names the base model and data we trained on | trainer/build.py `ModelCard` |
| `compute_loss` | GRPOTrainer | a batch whose completions were all cut (`mask_truncated_completions`) is a step with no gradient, not a crash | `with_gradient` below |
| `_calculate_rewards` | GRPOTrainer | a reward failing on one process stops every process right after the gather, naming it | trainer/reward_failures.py |
| `_save_checkpoint` | Trainer | each checkpoint-N/ appears whole (staged, then renamed) with its grpo_shape.json; `_get_output_dir` is redirected for that one call | run/checkpoints.py `stage_checkpoint_saves` |
| `_load_from_checkpoint` | Trainer | a checkpoint holding a second adapter (ref/) restores the trained one too | run/resume.py `load_every_adapter` |
| `_load_optimizer_and_scheduler` | Trainer | a resume with a larger max_steps trains at the rebuilt schedule's rate | run/resume.py `follow_the_rebuilt_schedule` |

Instance attributes, not a subclass: trl.GRPOTrainer is whatever class the backend left there (Unsloth's patched
one), known only when the trainer is built. `REPLACED` is the list; tests/test_trl_internals.py holds it against
the installed TRL (each is still a method of GRPOTrainer) and against a built trainer (each is installed). TRL's
vLLM generation internals are pipeline/backends/vllm_engine.py's (`colocated_engine`); a run without vLLM imports TRL's
trainer with vLLM hidden (pipeline/config/trl_fields.py `grpo_trainer_module`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from grpo_pipeline.pipeline.run.checkpoints import stage_checkpoint_saves
from grpo_pipeline.pipeline.run.resume import follow_the_rebuilt_schedule, load_every_adapter
from grpo_pipeline.pipeline.trainer.reward_failures import raise_reward_failures_after_the_gather

REPLACED = ("create_model_card", "compute_loss", "_calculate_rewards", "_save_checkpoint", "_load_from_checkpoint",
            "_load_optimizer_and_scheduler")


def replace_trl_internals(trainer, card: Any, latch: Any, checkpoint_key: Any, dataset: Any) -> None:
    """Install the replacements of `REPLACED` on `trainer` (the table above says why each)."""
    replacements = {
        "create_model_card": functools.partial(card.write, trainer),
        "compute_loss": with_gradient(trainer.compute_loss),
        "_calculate_rewards": raise_reward_failures_after_the_gather(trainer, latch),
        "_save_checkpoint": stage_checkpoint_saves(trainer, checkpoint_key, dataset),
        "_load_from_checkpoint": load_every_adapter(trainer),
        "_load_optimizer_and_scheduler": follow_the_rebuilt_schedule(trainer),
    }
    assert tuple(replacements) == REPLACED
    for name, replacement in replacements.items():
        setattr(trainer, name, replacement)


def with_gradient(compute_loss: Callable) -> Callable:
    """`compute_loss`, whose loss always has a gradient: with `mask_truncated_completions: true` and every completion
    cut (common early on), TRL's loss is a constant and `loss.backward()` raised "element 0 of tensors does not
    require grad"; tied to a trainable parameter by a zero factor, it backpropagates zeros."""

    def loss_with_gradient(model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if model.training and hasattr(loss, "requires_grad") and not loss.requires_grad:
            anchor = next((p for p in model.parameters() if p.requires_grad), None)
            if anchor is not None:
                loss = loss + 0.0 * anchor.sum()
        return loss

    return loss_with_gradient
