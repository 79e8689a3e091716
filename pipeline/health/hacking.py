"""Reward hacking: the health rule that tells when the training reward rises while held-out accuracy falls by
more than chance (with eval_steps)."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from grpo_pipeline.pipeline.health.metrics import finite_mean, log_number
from grpo_pipeline.pipeline.run.metric_names import EVAL_ACCURACY, EVAL_N


def accuracy_noise(first: float, last: float, n_first: float | None, n_last: float | None) -> float:
    """How far two held-out accuracies may differ by chance alone: two standard errors of the difference of two
    pooled proportions; unknown sizes allow nothing.

    >>> round(accuracy_noise(0.90, 0.89, 100, 100), 3), round(accuracy_noise(0.14, 0.02, 100, 100), 3)
    (0.087, 0.077)
    >>> accuracy_noise(0.9, 0.5, None, 100)
    0.0
    """
    if not n_first or not n_last:
        return 0.0
    pooled = (first * n_first + last * n_last) / (n_first + n_last)
    return 2.0 * math.sqrt(pooled * (1.0 - pooled) * (1.0 / n_first + 1.0 / n_last))


class RewardHacking:
    """The rule's memory: the training rewards logged since the last eval, and the last `window` evals."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._rewards_since_eval: list[float] = []
        self._evals: deque[tuple[int, float, float | None, float | None]] = deque(maxlen=window)

    def check(self, logs: dict[str, Any], step: int) -> str | None:
        """Why the policy may be gaming the rewards (the rule's warning or stop), or None."""
        reward = log_number(logs.get("reward"))
        if reward is not None and math.isfinite(reward):
            self._rewards_since_eval.append(reward)
        accuracy = log_number(logs.get(EVAL_ACCURACY))
        if accuracy is None:
            return None
        self._evals.append((step, accuracy, finite_mean(self._rewards_since_eval), log_number(logs.get(EVAL_N))))
        self._rewards_since_eval = []
        window = self.window
        if len(self._evals) < window or any(r is None for _, _, r, _ in self._evals):
            return None
        steps, accuracies, rewards, sizes = zip(*self._evals)
        falling = (accuracies[0] - accuracies[-1] > accuracy_noise(accuracies[0], accuracies[-1], sizes[0], sizes[-1])
                   and all(b <= a for a, b in zip(accuracies, accuracies[1:])))
        if rewards[-1] > rewards[0] and falling:
            return (f"the training reward rose ({' -> '.join(f'{r:.3g}' for r in rewards)}) while held-out "
                    f"accuracy fell ({' -> '.join(f'{a:.0%}' for a in accuracies)}) over the last {window} evals "
                    f"(steps {', '.join(map(str, steps))}): the policy may be gaming the rewards (reward "
                    "hacking). Look at its completions (log_completions: true) and tighten the rewards; "
                    "best_lora/ keeps the adapter of the best held-out accuracy")
        return None
