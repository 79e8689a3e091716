"""A reward that fails on one process stops every process, with the failing one's message.

TRL 1.15's `GRPOTrainer._calculate_rewards` calls each reward, then `gather`s all processes' rewards: a failure raised
on one process left the others blocked in that gather (NCCL: 30 minutes). So a failure is held (rewards/contract.py
`guard_reward(hold=...)`, the call returns 0.0), and `raise_agreed`, right after the gather, agrees across processes
(one all_reduce) and raises on all of them with the failing process's message.
"""

from __future__ import annotations

from typing import Callable, Optional

from grpo_pipeline.rewards.contract import RewardFailure


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
    """`trainer._calculate_rewards`, raising the failures `latch` held right after it returns (installed by
    pipeline/trainer/trl_internals.py)."""
    calculate = type(trainer)._calculate_rewards

    def calculate_then_raise(*args, **kwargs):
        rewards = calculate(trainer, *args, **kwargs)
        latch.raise_agreed()
        return rewards

    return calculate_then_raise
