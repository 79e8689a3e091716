"""The health observer: a reward function (`__name__ == "health"`, weight 0.0) that measures every generation batch.

It reports the monitors through TRL's `log_metric` and into a `HealthState` the callback reads when `log_metric` is
missing. It returns 0.0, not None: with None, TRL logs rewards/health/mean as NaN every step, a false alarm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_pipeline.pipeline.health.metrics import batch_health
from grpo_pipeline.pipeline.run.metric_names import BETA, OBSERVER_NAME
from grpo_pipeline.pipeline.health.tools import has_tool_turns, own_text, tool_metrics
from grpo_pipeline.rewards.completions import completion_text


@dataclass
class HealthState:
    """What the observer saw since the last log (`pending`: each metric's per-batch values), shared with the callback;
    `beta`: the trainer's current beta (the observer logs it)."""

    pending: dict[str, list[float]] = field(default_factory=dict)
    batches: int = 0
    beta: float | None = None

    def record(self, metrics: dict[str, float]) -> None:
        self.batches += 1
        for name, value in metrics.items():
            self.pending.setdefault(name, []).append(value)

    def flush(self) -> dict[str, float]:
        """Mean of each metric since the last flush (the same averaging TRL's log_metric does)."""
        means = {name: sum(v) / len(v) for name, v in self.pending.items() if v}
        self.pending = {}
        return means


def make_observer(state: HealthState, incomplete_ids: frozenset[int], tokenizer: Any = None,
                  max_tool_iterations: int | None = None) -> Callable[..., list[float]]:
    """The observer reward function. Without `completion_ids` (and for a multi-turn completion, measured on the
    model's own turns only: pipeline/health/tools.py) the completions are tokenized with `tokenizer`;
    `max_tool_iterations` (TRL's max_tool_calling_iterations) adds the share of rollouts that ended there.

    >>> state = HealthState()
    >>> observer = make_observer(state, frozenset({9}))
    >>> logged = {}
    >>> observer(completions=["<answer>4</answer>", "\\ufffd"], completion_ids=[[1, 2], [9]],
    ...          log_metric=lambda name, value: logged.__setitem__(name, value))
    [0.0, 0.0]
    >>> logged["health/garbled_rate"], logged["health/no_answer_rate"], state.batches
    (0.5, 0.5, 1)
    """

    def health(prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
               completion_ids: Sequence[Sequence[int]] | None = None,
               log_metric: Callable[[str, float], None] | None = None, **_: Any) -> list[float]:
        completions = list(completions or [])
        extra = tool_metrics(completions, max_tool_iterations)
        if has_tool_turns(completions):  # the model's own turns, not the tools' output
            completions, completion_ids = [own_text(c) for c in completions], None
        if completion_ids is None:
            if tokenizer is None:
                raise ValueError("the health observer got no completion_ids and has no tokenizer to rebuild them; "
                                 "build it with build_health(spec, tokenizer).")
            completion_ids = [tokenizer.encode(completion_text(c) or "", add_special_tokens=False)
                              for c in completions]
        metrics = {**batch_health(completions, [list(ids) for ids in completion_ids], incomplete_ids), **extra}
        if state.beta:  # only runs with a KL term (beta > 0) have a beta worth plotting
            metrics[BETA] = float(state.beta)
        state.record(metrics)
        if log_metric is not None:
            for name, value in metrics.items():
                log_metric(name, value)
        return [0.0] * len(completions)

    health.__name__ = OBSERVER_NAME
    health.__qualname__ = OBSERVER_NAME
    return health
