"""Environments that break TRL's contract each in one way, named by the agent check's tests
(`environment_factory: agent_boundary_cases:ResetNumber`). Not a test module."""

from __future__ import annotations

import asyncio


class InitRaises:
    def __init__(self):
        raise OSError("no sandbox")

    def reset(self, **kwargs) -> None:
        return None


class ResetNumber:
    def reset(self, **kwargs):
        return 7


class RewardNaN:
    def reset(self, **kwargs) -> None:
        return None

    def get_reward(self) -> float:
        return float("nan")


class AsyncRewardRaises:
    def reset(self, **kwargs) -> None:
        return None

    async def get_reward(self) -> float:
        await asyncio.sleep(0)
        return 1 / 0
