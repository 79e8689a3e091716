"""The exact text of the reward contract's messages (rewards/contract.py): what a user reads when a reward breaks.

Pure Python, no model: `sample` (rewards/returned.py), `check_rewards`, `guard_reward` (signature errors, the
failing sample, async rewards, `hold`), the None-share warning, `reward_name` and the `--check` probe line."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from grpo_pipeline.rewards.contract import (RewardFailure, _accepts, check_rewards, guard_reward,
                              probe_rewards, reward_name)
from grpo_pipeline.rewards.returned import sample


def failure_of(func, **call) -> str:
    """The RewardFailure text a guarded `func` raises on `call` (awaited when async)."""
    with pytest.raises(RewardFailure) as err:
        out = guard_reward(func, warn=lambda m: None)(**call)
        if inspect.isawaitable(out):
            asyncio.run(out)
    return str(err.value)


# ---------------------------------------------------------------- sample

CUT80 = f"'{'x' * 37}...{'x' * 38}'"  # 80 characters of a long text: both ends kept (grpo_pipeline.env.text.excerpt)

def chat(*contents):
    return [{"role": "system", "content": contents[0]}] + [{"role": "user", "content": c} for c in contents[1:]]


LONG = "x" * 100  # repr 102 chars


@pytest.mark.parametrize("i, prompts, completions, kwargs, expected", [
    # chat prompts and completions: the last message's "content"
    (0, [chat("s", "first", "q0"), chat("s", "first", "q1")],
     [[{"role": "assistant", "content": "a0"}, {"role": "assistant", "content": "c0"}], [{"content": "c1"}]],
     {}, "prompt 'q0', completion 'c0'"),
    (1, [chat("s", "first", "q0"), chat("s", "first", "q1")],
     [[{"content": "x"}, {"content": "c0"}], [{"content": "y"}, {"content": "c1"}]], {}, "prompt 'q1', completion 'c1'"),
    # plain strings
    (1, ["p0", "p1"], ["c0", "c1"], {}, "prompt 'p1', completion 'c1'"),
    # lists that are not chats stay as they are
    (0, [["a", "b"]], [["c", "d"]], {}, "prompt ['a', 'b'], completion ['c', 'd']"),
    (0, [[]], [[]], {}, "prompt [], completion []"),
    # out of range / not indexable: None
    (3, ["p"], None, {}, "prompt None, completion None"),
    # 80 characters for prompt and completion (grpo_pipeline.env.text.excerpt: both ends kept)
    (0, [LONG], [LONG], {}, f"prompt {CUT80}, completion {CUT80}"),
    (0, [chat("s", LONG)], [[{"content": LONG}]], {}, f"prompt {CUT80}, completion {CUT80}"),
    # columns: list/tuple ones only, completion_ids left out, 40 characters each, joined by ", "
    (1, ["p0", "p1"], ["c0", "c1"],
     {"answer": ["4", "0"], "id": ("a", "b"), "completion_ids": [[1, 2], [3]], "flag": 5, "name": "abc",
      "trainer_state": SimpleNamespace(global_step=1), "note": [LONG, LONG]},
     f"prompt 'p1', completion 'c1', answer='0', id='b', note={chr(39)}{'x' * 17}...{'x' * 18}{chr(39)}"),
    (0, ["p0"], ["c0"], {"completion_ids": [[1]], "flag": 5}, "prompt 'p0', completion 'c0'"),
    (0, ["p0"], ["c0"], {"answer": []}, "prompt 'p0', completion 'c0', answer=None"),
])
def test_sample(i, prompts, completions, kwargs, expected):
    assert sample(i, prompts, completions, kwargs) == expected


# ---------------------------------------------------------------- check_rewards

class HasToList:
    def tolist(self):
        return [1.0, 2.0]

    def __repr__(self):
        return "HasToList()"


@pytest.mark.parametrize("output, n, expected", [
    ([1, 0.5, None], 3, [1.0, 0.5, None]),
    ((1, 2), 2, [1.0, 2.0]),
    (np.array([1.0, 0.0]), 2, [1.0, 0.0]),
    ([np.float32(0.5), np.int64(2)], 2, [0.5, 2.0]),
    ([], 0, []),
])
def test_check_rewards_accepts(output, n, expected):
    assert check_rewards("f", output, n) == expected


@pytest.mark.parametrize("output, n, message", [
    (1.0, 2, "returned 1.0 (a float), not a list of one number (or None) per completion; return e.g. [1.0, 0.0, ...] "
              "with 2 values."),
    (np.array([[1.0], [2.0]]), 2, "returned array([[1.],\n       [2.]]) (a ndarray), not a list of one number (or None) "
                                  "per completion; return e.g. [1.0, 0.0, ...] with 2 values."),
    (HasToList(), 2, "returned HasToList() (a HasToList), not a list of one number (or None) per completion; "
                     "return e.g. [1.0, 0.0, ...] with 2 values."),
    ([1.0], 2, "returned 1 values for 2 completions; return exactly one number (or None) per completion, in order."),
    ([1.0, "1"], 2, "returned '1' (a str) for completion 1; each value must be an int or float, or None when the "
                    "sample cannot be judged."),
    ([True], 1, "returned True (a bool) for completion 0; each value must be an int or float, or None when the "
                "sample cannot be judged."),
    ([1.0, float("nan")], 2, "returned nan for completion 1; rewards must be finite (return None for a sample that "
                             "cannot be judged)."),
    ([float("-inf")], 1, "returned -inf for completion 0; rewards must be finite (return None for a sample that "
                         "cannot be judged)."),
])
def test_check_rewards_refuses_with_exact_message(output, n, message):
    with pytest.raises(RewardFailure) as err:
        check_rewards("f", output, n)
    assert str(err.value) == f"reward function `f` {message}" and err.value.name == "f" and err.value.detail == message


# ---------------------------------------------------------------- reward_name

class Scorer:
    def __call__(self, prompts, completions, **kwargs):
        return [1.0] * len(completions)


def named(prompts, completions, **kwargs):
    return [1.0] * len(completions)


@pytest.mark.parametrize("func, name", [(named, "named"), (Scorer(), "Scorer"), (lambda **kw: 0, "<lambda>")])
def test_reward_name(func, name):
    assert reward_name(func) == name
    assert guard_reward(func).__name__ == name or not hasattr(func, "__name__")


# ---------------------------------------------------------------- _accepts

def only_prompts(prompts):
    return [1.0]


def only_completions(completions):
    return [1.0]


def no_kwargs(prompts, completions):
    return [1.0] * len(completions)


def with_answer(prompts, completions, answer):
    return [1.0] * len(completions)


@pytest.mark.parametrize("func, kwargs, accepted", [
    (named, {"answer": [1]}, True),
    (no_kwargs, {}, True),
    (no_kwargs, {"answer": [1]}, False),
    (with_answer, {"answer": [1]}, True),
    (with_answer, {}, False),
    (only_prompts, {}, False),
    (only_completions, {}, False),
    (max, {}, True),  # no signature to read (ValueError): let the call decide
])
def test_accepts(func, kwargs, accepted):
    assert _accepts(func, kwargs) is accepted


# ---------------------------------------------------------------- guard_reward: the failure messages

def raises_type_error(prompts, completions, **kwargs):
    return [len(None) for _ in completions]


def inverse_completion_length(prompts, completions, **kwargs):
    return [1.0 / len(c) for c in completions]


def inverse_prompt_length(prompts, completions, **kwargs):
    return [1.0 / len(p) for p in prompts]


def batch_only(prompts, completions, **kwargs):
    if len(completions) > 1:
        raise ValueError("batch too big")
    return [1.0] * len(completions)


def refused_signature(*args, **kwargs):
    raise KeyError("k")


refused_signature.__signature__ = inspect.Signature([])  # bind(prompts=...) fails, yet the raise is a KeyError


async def async_batch_error(prompts, completions, **kwargs):
    raise ValueError("async broke")


CALL = {"prompts": ["p0", "p1"], "completions": ["c0", ""], "answer": ["4", "0"], "id": ["i0", "i1"],
        "completion_ids": [[1], [2]]}


@pytest.mark.parametrize("func, call, message", [
    (only_prompts, CALL,
     "reward function `only_prompts` cannot be called the way TRL calls it (only_prompts() got an unexpected keyword "
     "argument 'completions'). Write it as `def fn(prompts, completions, **kwargs) -> list[float | None]`; kwargs "
     "carry answer, completion_ids, id (docs/rewards.md)."),
    (no_kwargs, {"prompts": ["p"], "completions": ["c"], "id": ["i"], "answer": ["a"]},
     "reward function `no_kwargs` cannot be called the way TRL calls it (no_kwargs() got an unexpected keyword "
     "argument 'id'). Write it as `def fn(prompts, completions, **kwargs) -> list[float | None]`; kwargs carry "
     "answer, id (docs/rewards.md)."),
    # a TypeError raised inside a well-formed reward is a raise, with its sample
    (raises_type_error, CALL,
     "reward function `raises_type_error` raised TypeError: object of type 'NoneType' has no len() on prompt 'p0', "
     "completion 'c0', answer='4', id='i0'"),
    # a non-TypeError from a function whose signature does not bind is still a raise
    (refused_signature, {"prompts": ["p0"], "completions": ["c0"]},
     "reward function `refused_signature` raised KeyError: 'k' on prompt 'p0', completion 'c0'"),
    # _first_failing calls each sample alone, with its own prompt and completion
    (inverse_completion_length, CALL,
     "reward function `inverse_completion_length` raised ZeroDivisionError: float division by zero on prompt 'p1', "
     "completion '', answer='0', id='i1'"),
    (inverse_prompt_length, {"prompts": ["p0", ""], "completions": ["c0", "c1"]},
     "reward function `inverse_prompt_length` raised ZeroDivisionError: float division by zero on prompt '', "
     "completion 'c1'"),
    # fails only on the batch: named by the batch and its first sample
    (batch_only, CALL,
     "reward function `batch_only` raised ValueError: batch too big on a batch of 2 completions (first: prompt 'p0', "
     "completion 'c0', answer='4', id='i0')"),
    # async rewards are not re-run per sample
    (async_batch_error, CALL,
     "reward function `async_batch_error` raised ValueError: async broke on a batch of 2 completions (first: prompt "
     "'p0', completion 'c0', answer='4', id='i0')"),
    (async_batch_error, {"prompts": None, "completions": ["c0", "c1"]},
     "reward function `async_batch_error` raised ValueError: async broke on a batch of 2 completions (first: prompt "
     "None, completion 'c0')"),
])
def test_failure_message(func, call, message):
    assert without_place(failure_of(func, **call), func) == message


def without_place(text: str, func) -> str:
    """A raise's message without its place, after checking the place: " (at FILE line N)", this file and a line
    of `func`'s own source (grpo_pipeline.rewards.contract.raised_at). Messages of values returned have no place."""
    if "raised" not in text:
        return text
    head, _, at = text.rpartition(f" (at {__file__} line ")
    assert head and at.endswith(")"), text
    lines, first = inspect.getsourcelines(func)
    assert first <= int(at[:-1]) < first + len(lines), text
    return head


# ---------------------------------------------------------------- guard_reward: hold

def raises_key_error(prompts, completions, **kwargs):
    raise KeyError("boom")


async def async_raises_key_error(prompts, completions, **kwargs):
    raise KeyError("boom")


def returns_nan(prompts, completions, **kwargs):
    return [float("nan")] * len(completions)


async def async_good(prompts, completions, **kwargs):
    return [2.0] * len(completions)


@pytest.mark.parametrize("func, expected, failure", [
    (raises_key_error, [0.0, 0.0, 0.0],
     "reward function `raises_key_error` raised KeyError: 'boom' on prompt 'p0', completion 'c0'"),
    (async_raises_key_error, [0.0, 0.0, 0.0],
     "reward function `async_raises_key_error` raised KeyError: 'boom' on a batch of 3 completions (first: prompt "
     "'p0', completion 'c0')"),
    (returns_nan, [0.0, 0.0, 0.0],
     "reward function `returns_nan` returned nan for completion 0; rewards must be finite (return None for a sample "
     "that cannot be judged)."),
    (named, [1.0, 1.0, 1.0], None),
    (async_good, [2.0, 2.0, 2.0], None),
])
def test_hold_hands_the_failure_over_and_returns_zeros(func, expected, failure):
    held = []
    guarded = guard_reward(func, warn=lambda m: None, hold=held.append)
    assert guarded.__name__ == func.__name__
    assert inspect.iscoroutinefunction(guarded) == inspect.iscoroutinefunction(func)
    out = guarded(prompts=["p0", "p1", "p2"], completions=["c0", "c1", "c2"])
    if inspect.isawaitable(out):
        out = asyncio.run(out)
    assert out == expected
    assert [without_place(str(f), func) for f in held] == ([] if failure is None else [failure])
    assert all(isinstance(f, RewardFailure) for f in held)


# ---------------------------------------------------------------- the None share

def warning(name, share, step=""):
    return (f"reward `{name}` returned None for {share} of the batch{step}. TRL leaves those samples out of that reward "
            f"(its mean is over the rest, and they add 0 to the total); the share is logged as rewards/{name}/none_frac "
            "in metrics.jsonl. (Warned once.)")


@pytest.mark.parametrize("batches, state, logged, warned", [
    ([[None, 1.0, 2.0, 3.0]], SimpleNamespace(global_step=3), [0.25], [warning("f", "25%", " at step 4")]),
    ([[None]], SimpleNamespace(global_step=0), [1.0], [warning("f", "100%", " at step 1")]),
    ([[None, None, 1.0, 1.0]], None, [0.5], [warning("f", "50%")]),
    ([[None, 1.0]], SimpleNamespace(), [0.5], [warning("f", "50%")]),
    ([[1.0, 2.0], [1.0, 2.0]], SimpleNamespace(global_step=3), [0.0, 0.0], []),
    ([[1.0], [None, 1.0], [None, None]], SimpleNamespace(global_step=7), [0.0, 0.5, 1.0],
     [warning("f", "50%", " at step 8")]),
    ([[]], None, [0.0], []),
])
def test_none_share_logged_and_warned_once(batches, state, logged, warned):
    log, warnings, returned = [], [], iter(batches)

    def f(prompts, completions, **kwargs):
        return next(returned)

    guarded = guard_reward(f, warn=warnings.append)
    for values in batches:
        kwargs = {"log_metric": lambda k, v: log.append((k, v))}
        if state is not None:
            kwargs["trainer_state"] = state
        guarded(prompts=["p"] * len(values), completions=["c"] * len(values), **kwargs)
    assert log == [("rewards/f/none_frac", v) for v in logged]
    assert warnings == warned


def test_guard_warns_at_the_next_step_through_the_wrapper():
    warnings = []
    guarded = guard_reward(lambda prompts, completions, **kw: [None] + [1.0] * (len(completions) - 1),
                           warn=warnings.append)
    for step in (5, 6):
        guarded(prompts=["p"] * 4, completions=["c"] * 4, trainer_state=SimpleNamespace(global_step=step))
    assert warnings == [warning("<lambda>", "25%", " at step 6")]


# ---------------------------------------------------------------- probe_rewards (the --check line)

def returning(values, name):
    def reward(prompts, completions, **kwargs):
        assert prompts == [f"p{i}" for i in range(len(completions))]  # prompts are passed
        return values
    reward.__name__ = name
    return reward


def returning_async(values, name):
    async def reward(prompts, completions, **kwargs):
        assert prompts is not None
        return values
    reward.__name__ = name
    return reward


@pytest.mark.parametrize("make", [returning, returning_async])
@pytest.mark.parametrize("values, line", [
    ([1, 0, 1, 0], "r: [1, 0, 1, 0]"),
    ([1, 0, 1, 0, 1], "r: [1, 0, 1, 0, ...]"),
    ([0.5, None, 2, None, None, 1.25], "r: [0.5, None, 2, None, ...] (3 None)"),
    ([None, 1.0, 0.0], "r: [None, 1, 0] (1 None)"),
    ([1.0, 2.0, 3.0, 4.0, None], "r: [1, 2, 3, 4, ...] (1 None)"),
    ([None], "r: [None] (1 None)"),
    ([0.125], "r: [0.125]"),
])
def test_probe_line(make, values, line, capsys):
    n = len(values)
    lines = probe_rewards([make(values, "r")], [f"p{i}" for i in range(n)], ["c"] * n, {"answer": ["a"] * n})
    assert lines == [line]
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""  # the probe does not print the None warning


def test_probe_one_line_per_function_and_raises_the_first_failure():
    assert probe_rewards([named, Scorer()], ["p0", "p1"], ["c0", "c1"], {}) == ["named: [1, 1]", "Scorer: [1, 1]"]
    with pytest.raises(RewardFailure, match=r"^reward function `raises_key_error` raised KeyError"):
        probe_rewards([named, raises_key_error, returns_nan], ["p0"], ["c0"], {})


def test_a_raising_plug_in_reward_is_named_with_its_file_and_line(tmp_path, monkeypatch):
    """A `module:function` reward in the working folder (rewards/user_code.py loads it): its message names the
    function, its file and the line that raised."""
    from grpo_pipeline.rewards import get_reward_funcs

    (tmp_path / "my_plugin_rewards.py").write_text(
        "def picky(prompts, completions, **kwargs):\n"
        "    scores = []\n"
        "    for c in completions:\n"
        "        scores.append(1.0 / (len(c) - 2))\n"
        "    return scores\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    (func,) = get_reward_funcs(["my_plugin_rewards:picky"])
    text = failure_of(func, prompts=["p0", "p1"], completions=["ab", "cd"])
    assert text.startswith("reward function `picky` raised ZeroDivisionError: float division by zero")
    assert text.endswith(f"(at {tmp_path / 'my_plugin_rewards.py'} line 4)")
