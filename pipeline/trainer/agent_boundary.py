"""The user-code boundary around every call into the user's agent code, as rewards/contract.py is around rewards.

TRL 1.15's GRPOTrainer (trl/trainer/grpo_trainer.py) calls `factory()`, `reset(**row)`, tools (`_tool_call_loop`),
`get_reward()` and `rollout_func(prompts, self)`; each goes through a wrapper made here, and a raise, or a value TRL
cannot take, is an AgentFailure naming the callable. A tool's raise is TRL's meaning (a failed call the model reads
as `{"error": ...}`), kept for every way out (a `sys.exit()` in a tool too). An AgentFailure is a RewardFailure: it
stops a training run as a failing reward does; before training it is exit 2. No torch.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Any, Callable, Optional, Sequence

from grpo_pipeline.env.text import excerpt, printable, shorten
from grpo_pipeline.rewards.contract import RewardFailure, SignalInterrupt, raised_at

DOCS = "docs/agents.md"
# What passes through unchanged, as at the reward boundary: a real signal and Python's own generator close.
_PASSES = (SignalInterrupt, GeneratorExit)
# GRPOTrainer reads these off an environment class and never offers them as tools.
ENVIRONMENT_HOOKS = ("reset", "get_reward")
ROLLOUT_KEYS = ("prompt_ids", "completion_ids", "logprobs")  # TRL's required keys (GRPOTrainer._generate)


class AgentFailure(RewardFailure):
    """User agent code raised or broke TRL's contract. `option` is the option that named it (tools,
    environment_factory, rollout_func), `name` the callable (`Counter.reset`), `detail` what happened and the fix."""

    def __init__(self, option: str, name: str, detail: str, spec: str = ""):
        super().__init__(name, detail)
        self.option = option
        self.args = (f"{_KIND[option]} `{name}`{f' ({spec})' if spec else ''} {detail}",)

    def __str__(self) -> str:
        return self.args[0]


_KIND = {"tools": "tool", "environment_factory": "environment", "rollout_func": "rollout_func"}


def _raised(err: BaseException, func: Any) -> str:
    return f"raised {type(err).__name__}: {shorten(printable(err), 300)}{raised_at(func, err)}"


def _guarded(func: Callable, on_error: Callable, check: Callable = lambda value, args, kwargs: value,
             passes: tuple = _PASSES, catches: type[BaseException] = BaseException) -> Callable:
    """`func`'s stand-in with its name, docstring, signature (__wrapped__) and sync/async kind, so that TRL and
    transformers' get_json_schema read it as they read `func`: a `catches` but not `passes` out of it is handed to
    `on_error(err, args, kwargs)` (which raises, or returns the result), and it returns `check(value, args,
    kwargs)` of what `func` returned."""
    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def guarded_async(*args, **kwargs):
            try:
                value = await func(*args, **kwargs)
            except passes:
                raise
            except catches as err:  # noqa: BLE001 - every way out of user code is named (asyncio.gather would
                return on_error(err, args, kwargs)  # return a BaseException as a "result")
            return check(value, args, kwargs)

        return guarded_async

    @functools.wraps(func)
    def guarded(*args, **kwargs):
        try:
            value = func(*args, **kwargs)
        except passes:
            raise
        except catches as err:  # noqa: BLE001 - as guarded_async
            return on_error(err, args, kwargs)
        return check(value, args, kwargs)

    return guarded


def _failure(option: str, name: str, func: Callable, spec: str = "", where: Callable = lambda kwargs: "") -> Callable:
    """`_guarded`'s `on_error` for user code named `name`: an AgentFailure saying what `func` raised."""
    def fail(err: BaseException, args: tuple, kwargs: dict) -> Any:
        raise AgentFailure(option, name, f"{_raised(err, func)}{where(kwargs)}", spec) from err

    return fail


# --- tools -----------------------------------------------------------------------------------------------------------

class ToolCallError(RuntimeError):
    """A tool's way out that TRL's loop does not catch as a failed call (a BaseException), or a result it cannot
    render: raised as an Exception so that TRL's `_tool_call_loop` hands it to the model as `{"error": ...}`."""


def _tool_result(label: str, value: Any) -> Any:
    if isinstance(value, list) and not all(isinstance(block, dict) for block in value):
        raise ToolCallError(f"tool {label} returned {excerpt(value, 80)} (a list): TRL reads a list as content blocks "
                            "([{'type': 'text', 'text': ...}]); return str(...) of it, or a string.")
    return value


def guard_tool(tool: Callable, label: str) -> Callable:
    """A tool (function or bound environment method) at the boundary: an Exception is TRL's failed call as it is;
    any other way out, and a list result that is not content blocks, becomes one (ToolCallError naming `label`)."""
    def failed_call(err: BaseException, args: tuple, kwargs: dict) -> Any:
        raise ToolCallError(f"tool {label} {_raised(err, tool)}") from err

    return _guarded(tool, failed_call, lambda value, args, kwargs: _tool_result(label, value),
                    passes=(Exception, *_PASSES))


# --- environments ----------------------------------------------------------------------------------------------------

def environment_tools(cls: type) -> list[str]:
    """The methods TRL offers as tools: the public functions of the class but reset and get_reward."""
    return [name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if name not in ENVIRONMENT_HOOKS and not name.startswith("_")]


def _reset_value(name: str, value: Any, kwargs: dict[str, Any], spec: str = "") -> Any:
    if value is None or isinstance(value, str) or (isinstance(value, list)
                                                   and all(isinstance(block, dict) for block in value)):
        return value
    raise AgentFailure("environment_factory", name, f"returned {excerpt(value, 120)} (a {type(value).__name__}) "
                       f"for the row with columns {', '.join(sorted(map(str, kwargs))) or 'none'}; TRL appends what "
                       "reset returns to the prompt, so return None, a string, or a list of content blocks "
                       f"({DOCS}).", spec)


def reward_value(name: str, value: Any, spec: str = "") -> Optional[float]:
    """One get_reward value by the reward contract (rewards/contract.py): an int or float (numpy's too), finite, or
    None; a bool, a string, NaN or inf is an AgentFailure naming `name`.

    >>> reward_value("Counter.get_reward", 2)
    2.0
    >>> reward_value("Counter.get_reward", float("nan"))
    Traceback (most recent call last):
    ...
    grpo_pipeline.pipeline.trainer.agent_boundary.AgentFailure: environment `Counter.get_reward` returned nan; ...
    """
    if value is None:
        return None
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not isinstance(value, numbers.Real):
        raise AgentFailure("environment_factory", name, f"returned {excerpt(value, 120)} (a {type(value).__name__}); "
                           "get_reward is a reward (TRL's, weight 1): return one int or float, or None when the "
                           f"rollout cannot be judged ({DOCS}).", spec)
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError) as err:
        raise AgentFailure("environment_factory", name, f"returned {excerpt(value, 60)}, which is no float "
                           f"({type(err).__name__}: {err}); rewards must be finite floats.", spec) from None
    if not math.isfinite(number):
        raise AgentFailure("environment_factory", name, f"returned {excerpt(value)}; rewards must be finite (return "
                           "None for a rollout that cannot be judged).", spec)
    return number


def guard_environment(instance: Any, spec: str) -> Any:
    """`instance` with its `reset`, `get_reward` and tool methods at the boundary: each set on the instance (an
    attribute shadows the class's function for every `getattr(instance, name)`, which is how TRL reaches them), the
    class left as it is (TRL matches rewards by `type(instance)` and reads tools off the class)."""
    label = type(instance).__name__
    for name in environment_tools(type(instance)):
        _set(instance, name, guard_tool(getattr(instance, name), f"{label}.{name} ({spec})"))
    reset = getattr(instance, "reset", None)
    if callable(reset):
        where = f"{label}.reset"
        _set(instance, "reset", _guarded(reset, _failure("environment_factory", where, reset, spec, _row),
                                         lambda value, args, kwargs: _reset_value(where, value, kwargs, spec)))
    get_reward = getattr(instance, "get_reward", None)
    if callable(get_reward):
        scored = f"{label}.get_reward"
        _set(instance, "get_reward", _guarded(get_reward, _failure("environment_factory", scored, get_reward, spec),
                                              lambda value, args, kwargs: reward_value(scored, value, spec)))
    return instance


def _row(kwargs: dict[str, Any]) -> str:
    shown = ", ".join(f"{key}={excerpt(value, 40)}" for key, value in list(kwargs.items())[:6])
    return f", called with the row {{{shown}}}" if shown else ""


def _set(instance: Any, name: str, value: Callable) -> None:
    try:
        object.__setattr__(instance, name, value)
    except (AttributeError, TypeError):  # __slots__ without __dict__: its calls reach TRL unguarded (docs/agents.md)
        pass


def guard_factory(factory: Callable, spec: str) -> Callable:
    """`factory` at the boundary: a raise is an AgentFailure naming it; what it builds is guarded
    (`guard_environment`)."""
    name = getattr(factory, "__name__", None) or type(factory).__name__

    def build() -> Any:
        try:
            instance = factory()
        except _PASSES:
            raise
        except BaseException as err:  # noqa: BLE001 - every way out of user code becomes one named AgentFailure
            raise AgentFailure("environment_factory", f"{name}()", f"{_raised(err, factory)} ({spec}; TRL builds "
                               "each environment with no arguments: state comes from reset(**row))") from err
        return guard_environment(instance, spec)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = getattr(factory, "__doc__", None)
    return build


# --- rollout_func ----------------------------------------------------------------------------------------------------

def _ids(name: str, key: str, values: Any, n: int, kind: Callable[[Any], bool], what: str) -> None:
    if not isinstance(values, (list, tuple)):
        raise AgentFailure("rollout_func", name, f"returned {key}={excerpt(values, 80)} (a {type(values).__name__}); "
                           f"TRL reads one {what} per prompt: a list of {n}.")
    if len(values) != n:
        raise AgentFailure("rollout_func", name, f"returned {len(values)} {key} for {n} prompts; TRL hands it one "
                           "prompt per rollout (each already repeated num_generations times) and reads one entry per "
                           "prompt, in order.")
    for i, item in enumerate(values):
        if not (isinstance(item, (list, tuple)) and all(kind(v) for v in item)):
            raise AgentFailure("rollout_func", name, f"returned {key}[{i}]={excerpt(item, 80)}; each must be a "
                               f"{what}.")


def _is_token(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_logprob(value: Any) -> bool:  # None and NaN are TRL's meaning: neutralised in the importance-sampling ratio
    return value is None or (isinstance(value, numbers.Real) and not isinstance(value, bool))


def check_rollout(name: str, output: Any, n: int) -> Any:
    """`output` of a rollout_func given `n` prompts, by TRL's contract (GRPOTrainer._generate and the code after
    it), or an AgentFailure naming `name` and what came back instead."""
    if not isinstance(output, dict):
        raise AgentFailure("rollout_func", name, f"returned {excerpt(output, 120)} (a {type(output).__name__}), not a "
                           f"dict; return {{{', '.join(repr(k) + ': [...]' for k in ROLLOUT_KEYS)}}}, one entry per "
                           "prompt, and any other key a reward should read.")
    missing = [key for key in ROLLOUT_KEYS if key not in output]
    if missing:
        raise AgentFailure("rollout_func", name, f"returned the keys {', '.join(map(repr, output)) or 'none'}, "
                           f"without {', '.join(map(repr, missing))}; TRL needs {', '.join(ROLLOUT_KEYS)} ({DOCS}).")
    _ids(name, "prompt_ids", output["prompt_ids"], n, _is_token, "list of token ids (ints)")
    _ids(name, "completion_ids", output["completion_ids"], n, _is_token, "list of token ids (ints)")
    logprobs = output["logprobs"]
    if logprobs is not None:
        _ids(name, "logprobs", logprobs, n, _is_logprob, "list of floats (None or NaN where unknown)")
        for i, (ids, probs) in enumerate(zip(output["completion_ids"], logprobs)):
            if len(ids) != len(probs):
                raise AgentFailure("rollout_func", name, f"returned {len(probs)} logprobs for the {len(ids)} tokens "
                                   f"of completion {i}; give one per completion token (or logprobs: None).")
    for key, values in output.items():
        if key not in ROLLOUT_KEYS and isinstance(values, list) and len(values) != n:
            raise AgentFailure("rollout_func", name, f"returned {len(values)} values of {key!r} for {n} prompts; TRL "
                               "hands an extra list to the rewards one value per prompt, so give exactly that (or a "
                               "single value that is not a list, for every prompt).")
    return output


def guard_rollout_func(func: Callable, spec: str) -> Callable:
    """`rollout_func(prompts, trainer)` at the boundary: a raise or an output TRL cannot read is an AgentFailure."""
    name = getattr(func, "__name__", None) or type(func).__name__

    def checked(output: Any, args: tuple, kwargs: dict) -> Any:
        prompts = args[0] if args else kwargs.get("prompts")
        try:
            return check_rollout(name, output, len(prompts) if isinstance(prompts, Sequence) else 0)
        except AgentFailure as err:
            raise AgentFailure("rollout_func", name, err.detail, spec) from None

    return _guarded(func, _failure("rollout_func", name, func, spec), checked)


def hold_failures(func: Callable, hold: Callable[[RewardFailure], None]) -> Callable:
    """A reward function TRL made of an environment's get_reward, with its AgentFailure handed to `hold` (the
    run's RewardFailureLatch, raised after TRL's reward gather on every process together) and zeros returned."""
    def held(err: BaseException, args: tuple, kwargs: dict) -> list[float]:
        hold(err)
        return [0.0] * len(kwargs.get("completions") or kwargs.get("environments") or [])

    return _guarded(func, held, catches=RewardFailure)
