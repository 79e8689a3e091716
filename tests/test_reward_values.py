"""The reward boundary holds for every value and every wait (issue 48, class 5): whatever a reward returns is read
inside the guard (rewards/contract.py check_rewards) and is either a finite float (or None) or a named
RewardFailure, never another exception; a reward that does not return within reward_timeout is a RewardFailure
naming it (reward_deadline)."""

import asyncio
import math
import time
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_pipeline.rewards.contract import RewardFailure, call_reward, guard_reward


def returned(value):
    """What the guard makes of a reward returning `value` for a batch of one completion."""
    def reward(prompts, completions, **kwargs):
        return value
    reward.__name__ = "my_reward"
    return call_reward(reward, ["p"], ["c"], {})


def judged(value):
    """("ok", floats) or ("refused", message); any other exception escapes and fails the test."""
    try:
        return "ok", returned(value)
    except RewardFailure as err:
        assert "reward function `my_reward`" in str(err)
        return "refused", str(err)


def numpy_scalars():
    """A scalar of every numpy dtype there is (numbers, bool, complex, datetime, str, bytes, void, object)."""
    for code in sorted(set(np.typecodes["All"])):
        dtype = np.dtype(code)
        yield pytest.param(np.zeros(1, dtype=dtype)[0], id=f"numpy-{dtype.name}")


@pytest.mark.parametrize("value", list(numpy_scalars()))
def test_a_numpy_scalar_of_every_dtype_is_a_float_or_a_named_failure(value):
    kind, result = judged([value])
    real = np.issubdtype(np.asarray(value).dtype, np.integer) or np.issubdtype(np.asarray(value).dtype, np.floating)
    assert kind == ("ok" if real else "refused"), result
    if kind == "ok":
        assert result == [float(value)]


def _torch_values():
    import torch

    return [
        pytest.param(torch.zeros(1, device="meta"), "a Tensor on device meta that cannot be read", id="meta-1d"),
        pytest.param([torch.tensor(1.0, device="meta")], "(a Tensor on device meta)", id="meta-in-list"),
        pytest.param([torch.tensor(1.0)], "(a Tensor on device cpu)", id="0d-tensor-in-list"),
        pytest.param(torch.tensor([1 + 2j]), "(a complex)", id="complex-tensor"),
        pytest.param(torch.tensor([True]), "(a bool)", id="bool-tensor"),
    ]


@pytest.mark.parametrize("value, says", [
    pytest.param([10**400], "which is no float (OverflowError", id="huge-int"),
    pytest.param([-10**400], "which is no float (OverflowError", id="huge-negative-int"),
    pytest.param([Fraction(10**400, 3)], "which is no float (OverflowError", id="huge-fraction"),
    pytest.param([Decimal("1.5")], "(a Decimal)", id="decimal"),
    pytest.param([Decimal("NaN")], "(a Decimal)", id="decimal-nan"),
    pytest.param([np.longdouble("1e4000")], "rewards must be finite", id="longdouble-past-float"),
    pytest.param([float("inf")], "rewards must be finite", id="inf"),
    pytest.param([1j], "(a complex)", id="complex"),
    pytest.param(np.array([[1.0]]), "not a list of one number", id="2d-array"),
    *_torch_values(),
])
def test_a_value_no_float_can_hold_is_a_named_failure(value, says):
    kind, message = judged(value)
    assert kind == "refused" and says in message, message


@pytest.mark.parametrize("value, expected", [
    ([Fraction(1, 4)], [0.25]), ([np.float16(0.5)], [0.5]), ([np.uint64(2**63)], [float(2**63)]),
    ([None], [None]), (np.array([2], dtype=np.int8), [2.0]),
])
def test_numbers_a_float_holds_are_taken(value, expected):
    assert returned(value) == expected


@settings(max_examples=60, deadline=None)
@given(st.integers() | st.fractions() | st.floats(allow_nan=True, allow_infinity=True))
def test_any_real_number_is_its_float_or_a_named_failure(number):
    kind, result = judged([number])
    try:
        fits = math.isfinite(float(number))
    except OverflowError:
        fits = False
    assert kind == ("ok" if fits else "refused"), result


def test_a_reward_that_hangs_is_stopped_at_reward_timeout_even_if_it_catches_exceptions():
    def stuck(prompts, completions, **kwargs):
        try:
            time.sleep(30)
        except Exception:  # noqa: BLE001 - a reward's own catch-all must not swallow the deadline
            pass
        return [1.0]

    start = time.monotonic()
    with pytest.raises(RewardFailure, match=r"`stuck` did not return within reward_timeout \(0.3 s\)"):
        guard_reward(stuck, timeout=0.3)(prompts=["p"], completions=["c"])
    assert time.monotonic() - start < 5


def test_an_async_reward_that_hangs_is_stopped_at_reward_timeout():
    async def stuck_async(prompts, completions, **kwargs):
        await asyncio.sleep(30)
        return [1.0]

    with pytest.raises(RewardFailure, match="did not return within reward_timeout"):
        asyncio.run(guard_reward(stuck_async, timeout=0.3)(prompts=["p"], completions=["c"]))


def test_a_reward_within_its_timeout_returns_and_leaves_no_alarm_but_the_one_there_before():
    import signal

    assert guard_reward(lambda prompts, completions, **kw: [1.0], timeout=5)(prompts=["p"], completions=["c"]) == [1.0]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    previous = signal.signal(signal.SIGALRM, signal.SIG_IGN)
    try:
        signal.setitimer(signal.ITIMER_REAL, 100)  # a test runner's own timeout, say
        guard_reward(lambda prompts, completions, **kw: [1.0], timeout=5)(prompts=["p"], completions=["c"])
        assert 90 < signal.getitimer(signal.ITIMER_REAL)[0] <= 100
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_IGN
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
