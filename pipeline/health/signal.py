"""Learning signal: whether a reward gives GRPO anything to learn from, and when not, why and the fix, in words.

GRPO learns only from differences within a group (the `num_generations` completions of one prompt): a group whose
completions all get the same total reward trains on nothing (TRL logs their share as `frac_reward_zero_std`). A
reward with no spread over the batch is *flat*, and where it sits says why: at its minimum, a reward nobody earns;
at its maximum, nothing left to learn; elsewhere, rollouts too alike. Used by the reward dry run (`grpo rewards`)
and the flat-reward rule, so both name the same cause and fix.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, Optional

from grpo_pipeline.pipeline.health.metrics import finite_mean
from grpo_pipeline.pipeline.run.plots import as_number
from grpo_pipeline.pipeline.run.metric_names import OBSERVER_NAME
from grpo_pipeline.rewards.declared import declared_range, facts_of

# TRL's key for the share of groups whose total reward has zero spread (GRPOTrainer._generate_and_score_completions).
FLAT_GROUP_SHARE = "frac_reward_zero_std"
# A temperature below this makes a group's completions nearly identical.
LOW_TEMPERATURE = 0.5
# A clipped share from which "completions are cut before </answer>" is named as a cause.
CLIPPED_CAUSE = 0.5
# A reward of anyone else's: from 0, no known maximum.
_UNBOUNDED = (0.0, None)


def is_flat(std: Optional[float], scale: float = 1.0) -> bool:
    """A spread small enough to be no spread at all (relative to the reward's range).

    >>> is_flat(0.0), is_flat(1e-9), is_flat(0.2), is_flat(None)
    (True, True, False, False)
    """
    return std is not None and std <= 1e-6 + 1e-4 * abs(scale)


def _at(value: float, target: float, scale: float) -> bool:
    return abs(value - target) <= 1e-6 + 1e-3 * abs(scale)


def flat_reward_causes(flat: Mapping[str, float], *, temperature: float,
                       clipped_share: Optional[float] = None, completions_differ: bool = False) -> list[str]:
    """Why the rewards in `flat` (name -> the one value every completion got) are flat, with the fix: one
    sentence per cause, naming the rewards it covers. `completions_differ`: the total reward differs within the
    groups, so the rollouts are not alike: a reward flat between its bounds then does not tell them apart.

    >>> lines = flat_reward_causes({"xmlcount_reward_func": 0.0, "strict_format_reward_func": 0.0,
    ...                             "correctness_reward_func": 2.0}, temperature=1.0, clipped_share=0.9)
    >>> for line in lines:
    ...     print(line[:87])
    xmlcount_reward_func, strict_format_reward_func: 0 on every completion: the model never
    correctness_reward_func: at its maximum 2 on every completion: nothing is left to learn
    90% of completions hit max_completion_length: if they were on their way to </answer>, r
    """
    groups: dict[str, list[str]] = {}
    for name, mean in flat.items():
        facts = facts_of(name, logged=True)
        low, high = (facts and facts.range) or _UNBOUNDED
        scale = (high - low) if high is not None else 1.0
        if _at(mean, low, scale):
            kind = facts.kind if facts is not None and facts.kind != "other" else "zero"
            text = f"{low:g} on every completion: " + _ZERO_CAUSES[kind]
        elif high is not None and _at(mean, high, scale) and facts is not None and facts.learned_at_max:
            text = (f"at its maximum {high:g} on every completion: the form is learned, so it no longer separates "
                    "completions. Fix: none needed while another reward does")
        elif high is not None and _at(mean, high, scale):
            text = (f"at its maximum {high:g} on every completion: nothing is left to learn from it (the task is too "
                    "easy for this model, or the run has converged). Fix: raise the difficulty (harder problems), "
                    "or stop here")
        elif completions_differ:
            text = (f"{mean:.3g} on every completion, although the completions differ (the total reward separates "
                    "them): it adds no learning signal on these prompts. Fix: check its rule on a few completions "
                    "(`grpo rewards --json` lists them), or drop it from reward_funcs")
        else:
            text = (f"{mean:.3g} on every completion: the rollouts are too alike. Fix: raise temperature (now "
                    f"{temperature:g}; about 1.0 is usual for GRPO)")
        groups.setdefault(text, []).append(name)
    lines = [f"{', '.join(names)}: {text}" for text, names in groups.items()]
    at_zero = any(text.startswith("0 on") for text in groups)
    if at_zero and clipped_share is not None and clipped_share >= CLIPPED_CAUSE:
        lines.append(f"{clipped_share:.0%} of completions hit max_completion_length: if they were on their way to "
                     "</answer>, raise max_completion_length")
    return lines


_ZERO_CAUSES = {
    "format": ("the model never writes the <reasoning>/<answer> format. Fix: enable the SFT format warm-up "
               "(sft_warmup_steps, e.g. 100), or check system_prompt against the chat template (`grpo data` shows "
               "the prompt as rendered)"),
    "answer": ("no completion earns it (a wrong answer, or no <answer> block at all: see the format rewards). Fix: "
               "get the format right first (sft_warmup_steps), or use easier problems or a larger model"),
    "zero": "no completion earns it. Fix: check the reward function on a few completions",
}


def no_signal_causes(means: Mapping[str, float], stds: Mapping[str, Optional[float]], *, temperature: float,
                     num_generations: int, clipped_share: Optional[float] = None) -> list[str]:
    """The causes (with fixes) of groups without reward spread: those of the flat rewards, else the group-level one.

    `means` / `stds` are per reward over a batch (TRL's rewards/<name>/mean and /std).

    >>> no_signal_causes({"correctness_reward_func": 1.0}, {"correctness_reward_func": 0.9}, temperature=0.2,
    ...                  num_generations=4)[0].split(":")[0]
    'every reward varies between prompts, but not within a group'
    """
    flat = {}
    for name, mean in means.items():
        low, high = declared_range(name) or _UNBOUNDED
        if is_flat(stds.get(name), (high - low) if high is not None else 1.0):
            flat[name] = mean
    causes = flat_reward_causes(flat, temperature=temperature, clipped_share=clipped_share)
    if not causes:
        causes.append("every reward varies between prompts, but not within a group: each prompt's completions are "
                      "all right or all wrong alike. Fix: more diverse rollouts, raise temperature (now "
                      f"{temperature:g}) or num_generations (now {num_generations})")
    if temperature < LOW_TEMPERATURE and not any("raise temperature" in cause for cause in causes):
        causes.append(f"temperature {temperature:g} is low for GRPO: raise it to about 1.0")
    return causes


class FlatRewards:
    """The no-signal (flat_reward) rule: at least `threshold` of the groups without reward spread on each of the last
    `size` logged steps."""

    def __init__(self, size: int, threshold: float, temperature: float, num_generations: int) -> None:
        self.size, self.threshold = size, threshold
        self.temperature, self.num_generations = temperature, num_generations
        self._window: deque[dict[str, Any]] = deque(maxlen=size)

    def check(self, logs: dict[str, Any]) -> str | None:
        """Why the run has no learning signal (the rule's warning or stop), or None."""
        share = as_number(logs.get(FLAT_GROUP_SHARE))
        if share is None:
            return None
        self._window.append(dict(logs))
        window = list(self._window)
        if len(window) < self.size or any(as_number(w[FLAT_GROUP_SHARE]) < self.threshold for w in window):
            return None
        means, stds = _reward_means_and_stds(window)
        clipped = finite_mean([as_number(w.get("completions/clipped_ratio")) for w in window])
        causes = no_signal_causes(means, stds, temperature=self.temperature, num_generations=self.num_generations,
                                  clipped_share=clipped)
        shares = [as_number(w[FLAT_GROUP_SHARE]) for w in window]
        return (f"no learning signal: {min(shares):.0%}-{max(shares):.0%} of the groups had no reward spread "
                f"(frac_reward_zero_std) on each of the last {len(window)} logged steps, at or above "
                f"flat_reward_threshold {self.threshold:g}, so those groups train on nothing: "
                + "; ".join(causes))


def _reward_means_and_stds(window: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """Each reward's mean and spread (TRL's rewards/<name>/mean and /std) averaged over logged steps;
    the health observer (always 0) left out."""
    names = [key[len("rewards/"):-len("/mean")] for key in window[-1]
             if key.startswith("rewards/") and key.endswith("/mean")]
    names = [name for name in names if name != OBSERVER_NAME]
    means = {name: finite_mean([as_number(w.get(f"rewards/{name}/mean")) for w in window]) for name in names}
    stds = {name: finite_mean([as_number(w.get(f"rewards/{name}/std")) for w in window]) for name in names}
    return ({name: m for name, m in means.items() if m is not None},
            {name: s for name, s in stds.items() if s is not None})
