"""What one reward call returned or raised, read for the contract (rewards/contract.py), apart from the guard so
that a reward's own process (rewards/worker.py) judges its call by the same rules. No torch here.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
import traceback
from typing import Any, Optional

from grpo_pipeline.env.text import excerpt, printable, shorten


class RewardFailure(RuntimeError):
    """A reward function raised or broke the contract. `name` is the function, `message` says what and where."""

    def __init__(self, name: str, message: str):
        self.name, self.detail = name, message
        super().__init__(f"reward function `{name}` {message}")


def sample(i: int, prompts: Any, completions: Any, kwargs: dict[str, Any]) -> str:
    """One completion with its prompt's last message and its dataset columns, for an error message."""
    def item(values: Any) -> Any:
        try:
            return values[i]
        except (TypeError, IndexError, KeyError):
            return None

    prompt = item(prompts)
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content")
    completion = item(completions)
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        completion = completion[-1].get("content")
    columns = {key: item(value) for key, value in kwargs.items()
               if isinstance(value, (list, tuple)) and key != "completion_ids"}
    return f"prompt {excerpt(prompt, 80)}, completion {excerpt(completion, 80)}" + (
        f", {', '.join(f'{k}={excerpt(v, 40)}' for k, v in columns.items())}" if columns else "")


def check_rewards(name: str, output: Any, n: int) -> list[Optional[float]]:
    """`output` as a list of n floats or None, or a RewardFailure that says what came back instead.

    >>> check_rewards("f", [1, 0.5, None], 3)
    [1.0, 0.5, None]
    """
    try:
        return _checked(name, output, n)
    except RewardFailure:
        raise
    except Exception as err:  # noqa: BLE001 - a value that cannot even be read (a meta tensor, a broken __len__)
        raise RewardFailure(name, f"returned {_kind(output)} that cannot be read as numbers ({type(err).__name__}: "
                            f"{shorten(printable(err), 200)}); return a list of plain floats (or None), one per "
                            "completion.") from None


def _kind(value: Any) -> str:
    """What a value is, for a message: its type, and a tensor's device."""
    device = getattr(value, "device", None) if type(value).__module__.startswith("torch") else None
    return f"a {type(value).__name__}" + (f" on device {printable(device)}" if device is not None else "")


def _checked(name: str, output: Any, n: int) -> list[Optional[float]]:
    if getattr(output, "ndim", None) == 1 and hasattr(output, "tolist"):  # a 1-D numpy array or torch tensor
        output = output.tolist()
    if not isinstance(output, (list, tuple)):
        raise RewardFailure(name, f"returned {excerpt(output, 120)} (a {type(output).__name__}), not a list of one "
                            f"number (or None) per completion; return e.g. [1.0, 0.0, ...] with {n} values.")
    if len(output) != n:
        raise RewardFailure(name, f"returned {len(output)} values for {n} completions; return exactly one "
                            "number (or None) per completion, in order.")
    return [None if value is None else _number(name, i, value) for i, value in enumerate(output)]


def _number(name: str, i: int, value: Any) -> float:
    """One returned value as a finite float: a numbers.Real (numpy's included), never a bool, a Decimal, a complex
    or a tensor, nor one too large for a float (10**400) or not finite."""
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not isinstance(value, numbers.Real):
        raise RewardFailure(name, f"returned {excerpt(value, 120)} ({_kind(value)}) for completion {i}; each value "
                            "must be an int or float, or None when the sample cannot be judged.")
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError) as err:
        raise RewardFailure(name, f"returned {excerpt(value, 60)} for completion {i}, which is no float "
                            f"({type(err).__name__}: {err}); rewards must be finite floats.") from None
    if not math.isfinite(number):
        raise RewardFailure(name, f"returned {excerpt(value)} for completion {i}; rewards must be finite "
                            "(return None for a sample that cannot be judged).")
    return number


def _code_of(func: Any) -> Any:
    """The function whose code a reward runs: through functools.partial and decorators (__wrapped__), and a
    callable instance's __call__."""
    while isinstance(func, functools.partial):
        func = func.func
    func = inspect.unwrap(func)
    if not (inspect.isfunction(func) or inspect.ismethod(func)):
        func = getattr(type(func), "__call__", func)
    return func


def raised_at(func: Any, err: BaseException) -> str:
    """Where a reward's raise happened, for its message: " (at FILE line N)", the deepest line of the traceback in
    the reward's own file (else where the reward is defined); "" when neither is known (a builtin)."""
    code = _code_of(func)
    try:
        defined = inspect.getsourcefile(code)
        first_line = inspect.getsourcelines(code)[1]
    except (TypeError, OSError):
        return ""
    if defined is None:
        return ""
    lines = [n for frame, n in traceback.walk_tb(err.__traceback__)
             if os.path.abspath(frame.f_code.co_filename) == os.path.abspath(defined)]
    return f" (at {defined} line {lines[-1] if lines else first_line})"
