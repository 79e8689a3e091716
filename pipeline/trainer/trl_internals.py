"""The methods of TRL's GRPOTrainer (and of transformers' Trainer under it) that this project replaces: all of them
here, installed once on each trainer build_trainer makes (pipeline/trainer/build.py), each with why.

| method | from | why it is replaced | the replacement's logic |
|---|---|---|---|
| `create_model_card` | Trainer | the card (output_dir/README.md) names the base model and data we trained on | trainer/build.py `ModelCard` |
| `compute_loss` | GRPOTrainer | a batch whose completions were all cut (`mask_truncated_completions`) is a step with no gradient, not a crash | `with_gradient` below |
| `_calculate_rewards` | GRPOTrainer | a reward failing on one process stops every process right after the gather, naming it | `RewardFailureLatch` below |
| `_save_checkpoint` | Trainer | each checkpoint-N/ appears whole (staged, then renamed) with its grpo_shape.json; `_get_output_dir` is redirected for that one call | run/checkpoints.py `stage_checkpoint_saves` |
| `_load_from_checkpoint` | Trainer | a checkpoint holding a second adapter (ref/) restores the trained one too | run/resume.py `load_every_adapter` |
| `_load_optimizer_and_scheduler` | Trainer | a resume with a larger max_steps trains at the rebuilt schedule's rate | run/resume.py `follow_the_rebuilt_schedule` |

Instance attributes, not a subclass: trl.GRPOTrainer is whatever class the backend left there (Unsloth's patched
one), known only when the trainer is built. `REPLACED` is the list; tests/test_trl_internals.py holds it against
the installed TRL (each is still a method of GRPOTrainer) and against a built trainer (each is installed). TRL's
vLLM generation internals are pipeline/backends/vllm_engine.py's (`colocated_engine`); a run without vLLM imports TRL's
trainer with vLLM hidden (pipeline/config/trl_fields.py `grpo_trainer_module`).

A reward that fails on one process stops every process, with the failing one's message: TRL 1.15's
`GRPOTrainer._calculate_rewards` calls each reward, then `gather`s all processes' rewards, so a failure raised on one
process left the others blocked in that gather (NCCL: 30 minutes). A failure is held (rewards/contract.py
`guard_reward(hold=...)`, the call returns 0.0), and `raise_agreed`, right after the gather, agrees across processes
(one all_reduce) and raises on all of them with the failing process's message.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from grpo_pipeline.pipeline.run.checkpoints import stage_checkpoint_saves
from grpo_pipeline.pipeline.run.resume import follow_the_rebuilt_schedule, load_every_adapter
from grpo_pipeline.rewards.contract import RewardFailure

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


class RewardFailureLatch:
    """The first RewardFailure of a batch on this process, raised by `raise_agreed` on every process."""

    def __init__(self) -> None:
        self.failure: Optional[RewardFailure] = None

    def hold(self, failure: RewardFailure) -> None:
        if self.failure is None:
            self.failure = failure

    def raise_agreed(self) -> None:
        failure, self.failure = self.failure, None
        # lazy: torch loads only once a model is needed
        import torch
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
            flag = torch.tensor([dist.get_rank() + 1 if failure else 0], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the highest failing process, or 0
            failing = int(flag.item()) - 1
            if failing < 0:
                return
            payload = [(failure.name, failure.detail) if failure else None]
            dist.broadcast_object_list(payload, src=failing, device=device)
            name, detail = payload[0]
            failure = RewardFailure(name, f"{detail} (on process {failing} of {dist.get_world_size()})")
        if failure is not None:
            raise failure


def raise_reward_failures_after_the_gather(trainer, latch: RewardFailureLatch) -> Callable:
    """`trainer._calculate_rewards`, raising the failures `latch` held right after it returns."""
    calculate = type(trainer)._calculate_rewards

    def calculate_then_raise(*args, **kwargs):
        rewards = calculate(trainer, *args, **kwargs)
        latch.raise_agreed()
        return rewards

    return calculate_then_raise
