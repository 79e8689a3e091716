"""Each built-in reward is declared once, where it is defined, with its facts: `@builtin_reward(...)` (verl's
`@register_adv_est` is the model). The registry, the health diagnosis of flat rewards, the plots' bands and
`grpo rewards` all read the facts from here.

>>> from grpo_pipeline.rewards import correctness_reward_func
>>> facts = facts_of("correctness_reward_func", logged=True)
>>> facts.name, facts.range, facts.kind, facts.reads_reference, facts.func is correctness_reward_func
('correctness', (0.0, 2.0), 'answer', True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Optional

Kind = Literal["format", "answer", "other"]


@dataclass(frozen=True)
class RewardFacts:
    """What the pipeline knows of a built-in reward without calling it."""

    name: str  # the recipe's short name: `reward_funcs: [correctness]`
    func: Callable[..., list]  # TRL logs it as rewards/<its __name__>/mean (`logged_name`)
    range: Optional[tuple[float, float]]  # the least and the most it gives one completion; None: not bounded here
    kind: Kind  # "format": judges the <reasoning>/<answer> form; "answer": the answer itself; "other"
    learned_at_max: bool  # at its maximum on every completion, the form it rewards is learned (not a ceiling)
    reads_reference: bool  # scores each completion against the row's reference answer (`grpo_answer`)

    @property
    def logged_name(self) -> str:
        return self.func.__name__


DECLARED: dict[str, RewardFacts] = {}  # by short name, in the order the reward modules define them


def builtin_reward(name: str, *, range: Optional[tuple[float, float]] = None, kind: Kind = "other",
                   learned_at_max: bool = False, reads_reference: bool = False) -> Callable:
    """Declare the decorated function a built-in reward named `name`, with its facts; the function is unchanged."""

    def declare(func: Callable[..., list]) -> Callable[..., list]:
        if name in DECLARED and DECLARED[name].func is not func:
            raise ValueError(f"two built-in rewards are named {name!r}")
        DECLARED[name] = RewardFacts(name, func, range, kind, learned_at_max, reads_reference)
        return func

    return declare


def facts_of(reward: str | Callable, logged: bool = False) -> Optional[RewardFacts]:
    """The facts of a built-in reward by a name a recipe may give it (its short name, or the notebook's function
    name) or by the function itself; with `logged`, only by the name TRL logs it under (rewards/<name>/mean, its
    function's __name__: a user's reward logged as `correctness` is not ours). None for anyone else's reward."""
    return next((facts for facts in DECLARED.values()
                 if reward == facts.logged_name or not logged and reward in (facts.func, facts.name)), None)


def declared_range(logged_name: str) -> Optional[tuple[float, float]]:
    """The range a built-in reward declares, by the name TRL logs it under; None for any other reward."""
    facts = facts_of(logged_name, logged=True)
    return facts.range if facts is not None else None
