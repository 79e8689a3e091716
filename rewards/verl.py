"""Our rewards in verl's custom reward shape, for a run handed over to verl (docs/scale-out.md).

verl's reward manager (`custom_reward_function.path=rewards/verl.py custom_reward_function.name=compute_score`)
calls `compute_score` once per completion and takes the float it returns: here the weighted sum of our rewards
on a batch of one, by default DEFAULT_REWARDS weighted 1.0 (4.0 at most), or `extra_info={"reward_funcs": [...],
"reward_weights": [...]}` per row, or `reward_kwargs` in verl's config. A None (unjudgeable reference) counts 0.0:
verl has no "left out of the mean". It imports no verl and no torch: verl loads this file by path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, Optional

if __package__ in (None, ""):  # loaded by path (verl's importlib spec_from_file_location): find our packages
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from grpo_pipeline.rewards.registry import DEFAULT_REWARDS, check_reward_weights, get_reward_funcs  # noqa: E402


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None,
                  reward_funcs: Optional[Sequence[str]] = None, reward_weights: Optional[Sequence[float]] = None,
                  **kwargs: Any) -> float:
    """The weighted sum of our rewards for one completion `solution_str` against the reference `ground_truth`.

    >>> compute_score("openai/gsm8k", "<reasoning>\\n6 x 7\\n</reasoning>\\n<answer>\\n42\\n</answer>\\n", "42")
    4.0
    """
    extra = extra_info if isinstance(extra_info, dict) else {}
    names = list(reward_funcs or extra.get("reward_funcs") or DEFAULT_REWARDS)
    weights = check_reward_weights(names, reward_weights or extra.get("reward_weights"))
    total = 0.0
    for func, weight in zip(get_reward_funcs(names), weights, strict=True):
        value = func(prompts=[extra.get("question", "")], completions=[solution_str or ""],
                     answer=[None if ground_truth is None else str(ground_truth)])[0]
        total += weight * float(value or 0.0)
    return total
