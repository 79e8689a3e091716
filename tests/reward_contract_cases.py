"""Reward functions with every behaviour the reward contract (rewards/contract.py) must accept or refuse.

Not a test module; importable as plug-ins, e.g. `reward_funcs: [reward_contract_cases:returns_nan]`.
Each takes TRL's call (`prompts`, `completions`, **kwargs) unless its name says otherwise.
"""

from __future__ import annotations

import math

import numpy as np


def _n(completions) -> int:
    return len(completions)


def good(prompts, completions, **kwargs):
    return [1.0] * _n(completions)


def raises(prompts, completions, **kwargs):
    raise KeyError("final")


def raises_on_empty(prompts, completions, **kwargs):
    return [1.0 / len(c[0]["content"]) for c in completions]  # ZeroDivisionError on the empty completion


def wrong_arity(completions):
    return [0.0] * len(completions)


def no_kwargs(prompts, completions):
    return [0.0] * len(completions)


def returns_scalar(prompts, completions, **kwargs):
    return 1.0


def returns_none(prompts, completions, **kwargs):
    return None


def returns_tuple(prompts, completions, **kwargs):
    return tuple([0.5] * _n(completions))


def returns_generator(prompts, completions, **kwargs):
    return (0.5 for _ in completions)


def returns_too_few(prompts, completions, **kwargs):
    return [0.5] * (_n(completions) - 1)


def returns_strings(prompts, completions, **kwargs):
    return ["1.0"] * _n(completions)


def returns_string(prompts, completions, **kwargs):
    return "1.0"


def returns_nan(prompts, completions, **kwargs):
    return [math.nan] + [0.0] * (_n(completions) - 1)


def returns_inf(prompts, completions, **kwargs):
    return [0.0] * (_n(completions) - 1) + [math.inf]


def returns_none_mix(prompts, completions, **kwargs):
    return [None if i % 2 else 1.0 for i in range(_n(completions))]


def returns_all_none(prompts, completions, **kwargs):
    return [None] * _n(completions)


def returns_numpy_floats(prompts, completions, **kwargs):
    return [np.float32(0.5), np.float64(1.0), np.int64(2)] * (_n(completions) // 3) + [np.float64(0)] * (
        _n(completions) % 3)


def returns_numpy_array(prompts, completions, **kwargs):
    return np.ones(_n(completions))


def returns_bools(prompts, completions, **kwargs):
    return [True] * _n(completions)


def returns_dict(prompts, completions, **kwargs):
    return {i: 1.0 for i in range(_n(completions))}


def uses_answer_and_state(prompts, completions, answer, trainer_state, completion_ids, **kwargs):
    """Reads the dataset column and TRL's extras as a real reward would."""
    assert len(answer) == len(completions) == len(completion_ids)
    assert trainer_state.global_step >= 0
    return [float(a in c[0]["content"]) for a, c in zip(answer, completions)]


async def async_good(prompts, completions, **kwargs):
    return [0.25] * _n(completions)


RAISE_AT_STEP = 2
RAISE = lambda: KeyError("final")  # noqa: E731 - what raises_at_step raises; the tests set other ways out


def raises_at_step(prompts, completions, trainer_state, **kwargs):
    """Fine until step RAISE_AT_STEP (1-based, the step being computed), then RAISE()."""
    if trainer_state.global_step + 1 >= RAISE_AT_STEP:
        raise RAISE()
    return [float(len(c[0]["content"]) % 3) for c in completions]
