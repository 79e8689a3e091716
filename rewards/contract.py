"""The one reward contract, checked before the model loads and enforced around every call while training.

A reward function is called by TRL's `GRPOTrainer._calculate_rewards` (TRL 1.15) as

    fn(prompts=..., completions=..., completion_ids=..., **kwargs) -> list[float | None]

with one value per completion; kwargs carry the dataset's other columns (ours: `grpo_answer`, `grpo_id`, ...,
one entry per completion), `trainer_state`, `log_extra` and `log_metric` (docs/rewards.md); which exactly is
TRL's rule, read in one place (rewards/trl_source.py).

`check_rewards` (the values one call returned) is the contract: a list (or tuple, or 1-D array) of exactly one
int/float (numpy numbers included) or None per completion, every number finite. bools, strings, a scalar, a generator,
NaN and inf are refused. `guard_reward` wraps a function so that each call is checked by that contract, a
raise becomes a `RewardFailure` naming the function and the sample, and the share of None is logged
(`rewards/<name>/none_frac`) and warned about once. The same wrapper serves the pre-load probe
(pipeline/preflight.py) and the trainer (pipeline/trainer/build.py), so `--check` and the run agree.
No torch here.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import math
import numbers
import os
from collections.abc import Callable, Sequence
from typing import Any, Optional

from env.text import excerpt, printable, shorten
from rewards.deadline import RewardTimeout, reward_deadline
from rewards.worker import RewardRaised, RewardWorker, Unsendable, WorkerEnded
from rewards.trl_source import trl_rule


class RewardFailure(RuntimeError):
    """A reward function raised or broke the contract. `name` is the function, `message` says what and where."""

    def __init__(self, name: str, message: str):
        self.name, self.detail = name, message
        super().__init__(f"reward function `{name}` {message}")


def reward_name(func: Any) -> str:
    """The name TRL logs a reward under (`rewards/<name>/mean`)."""
    return getattr(func, "__name__", None) or type(func).__name__


def is_async_reward(func: Any) -> bool:
    """Whether calling `func` returns a coroutine, read as TRL 1.15 reads it (trl.trainer.utils
    `is_async_callable`): through functools.partial, and on a callable instance's `__call__`."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(func.__call__)


def check_rewards(name: str, output: Any, n: int) -> list[Optional[float]]:
    """`output` as a list of n floats or None, or a RewardFailure that says what came back instead.

    >>> check_rewards("f", [1, 0.5, None], 3)
    [1.0, 0.5, None]
    >>> check_rewards("f", 1.0, 2)
    Traceback (most recent call last):
    ...
    rewards.contract.RewardFailure: reward function `f` returned 1.0 (a float), not a list of one number (or None) ...
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
    checked: list[Optional[float]] = []
    for i, value in enumerate(output):
        if value is None:
            checked.append(None)
            continue
        checked.append(_number(name, i, value))
    return checked


def _number(name: str, i: int, value: Any) -> float:
    """One returned value as a finite float: an int or float (numpy's and Fraction included, numbers.Real), never a
    bool, a Decimal, a complex or a tensor; one too large for a float (10**400) or not finite is refused."""
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


def _sample(i: int, prompts: Any, completions: Any, kwargs: dict[str, Any]) -> str:
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


def _first_failing(call: Callable, prompts: Any, completions: Any, kwargs: dict[str, Any]) -> Optional[int]:
    """The index of the first single completion on which the reward raises too (None: it only fails on the batch,
    or a single call ran past the deadline). `call(prompts, completions, kwargs)` makes one call."""
    for i in range(len(completions)):
        one = {k: ([v[i]] if isinstance(v, (list, tuple)) and len(v) == len(completions) else v)
               for k, v in kwargs.items()}
        try:
            call(*own_batch([prompts[i]], [completions[i]], one))
        except _NOT_A_REWARD_FAILURE:
            raise
        except RewardTimeout:  # each further sample could wait as long again
            return None
        except BaseException:  # noqa: BLE001 - we are looking for the sample that raises
            return i
    return None


def _accepts(func: Callable, kwargs: dict[str, Any]) -> bool:
    """Whether `func`'s signature takes TRL's call: prompts, completions and these keyword arguments."""
    try:
        inspect.signature(func).bind(prompts=None, completions=None, **kwargs)
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): let the call decide
        return True
    return True


class _NoneShare:
    """Logs each call's share of None as `rewards/<name>/none_frac`; warns once per function."""

    def __init__(self, name: str, warn: Callable[[str], None]):
        self.name, self.warn, self.warned = name, warn, False

    def record(self, values: list[Optional[float]], kwargs: dict[str, Any]) -> None:
        share = sum(v is None for v in values) / max(len(values), 1)
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric(f"rewards/{self.name}/none_frac", share)
        if share > 0 and not self.warned:
            self.warned = True
            state = kwargs.get("trainer_state")
            # global_step counts completed steps: the batch being scored belongs to the next one
            step = f" at step {state.global_step + 1}" if getattr(state, "global_step", None) is not None else ""
            self.warn(f"reward `{self.name}` returned None for {share:.0%} of the batch{step}. TRL leaves those "
                      "samples out of that reward (its mean is over the rest, and they add 0 to the total); the share "
                      f"is logged as rewards/{self.name}/none_frac in metrics.jsonl. (Warned once.)")


def _print_warning(message: str) -> None:
    from tqdm import tqdm  # above the progress bar, not into its line

    tqdm.write(f"[grpo] warning: {message}")


class SignalInterrupt(KeyboardInterrupt):
    """A KeyboardInterrupt that a real SIGINT/SIGTERM raised (pipeline/run/checkpoints.py installs the handlers
    that raise it): the user's impatient second Ctrl-C, which must abort the run wherever it lands."""


# What passes through a reward unchanged: a real signal (SignalInterrupt) and Python's own generator close. Every
# other way out, a KeyboardInterrupt that user code raised itself, SystemExit from a sys.exit(),
# asyncio.CancelledError and a library's own BaseException subclasses included, fails only that reward.
_NOT_A_REWARD_FAILURE = (SignalInterrupt, GeneratorExit)


def own_batch(prompts: Any, completions: Any, kwargs: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """A copy of the batch for one reward, so a reward that edits `completions` (or a column) in place cannot change
    what the next reward, or the health observer, scores. TRL hands every reward the same lists
    (GRPOTrainer._calculate_rewards). The trainer's own objects (`trainer_state`, `log_metric`, `log_extra`) are
    passed as they are.

    >>> completions = [[{"role": "assistant", "content": "18"}]]
    >>> _, mine, _ = own_batch(None, completions, {})
    >>> mine[0][0]["content"] = "rewritten"; completions[0][0]["content"]
    '18'
    """
    trainer_objects = trl_rule()["trainer"]  # TRL's keywords that are the trainer's own objects, not the batch
    columns = {key: (value if key in trainer_objects else copy.deepcopy(value)) for key, value in kwargs.items()}
    return copy.deepcopy(prompts), copy.deepcopy(completions), columns


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
    line = first_line
    frame = err.__traceback__
    while frame is not None:
        if os.path.abspath(frame.tb_frame.f_code.co_filename) == os.path.abspath(defined):
            line = frame.tb_lineno
        frame = frame.tb_next
    return f" (at {defined} line {line})"


class _Settled(RewardFailure):
    """A RewardFailure the reward's worker settled (its output broke the contract, or the worker ended): passed on
    as it is, where a RewardFailure the reward itself raised is reported as its raise."""


_HERE = object()  # the call runs in this process (no worker, or arguments that cannot be sent to it)


def _timed_out(name: str, seconds: Optional[float], n: int) -> RewardFailure:
    return RewardFailure(name, f"did not return within reward_timeout ({seconds:g} s) on a batch of {n} completions; "
                         "the run stopped there. Make it faster (a judge or a tool call needs its own timeout), or "
                         "raise reward_timeout (0 = no limit).")


def guard_reward(func: Callable, warn: Callable[[str], None] = _print_warning,
                 hold: Optional[Callable[[RewardFailure], None]] = None, timeout: Optional[float] = None,
                 own_process: bool = True) -> Callable:
    """`func` wrapped in the contract: same `__name__` (TRL's log key), each call's values checked by
    `check_rewards`, a raise turned into RewardFailure naming the sample, None's share logged and warned once.
    Every way out of a reward but the user's KeyboardInterrupt is a raise here (`sys.exit()` included), and each
    call gets its own copy of the batch (`own_batch`).

    With `hold`, a failure is handed to it and the call returns 0.0 for every completion instead of raising (values
    never used: they only let TRL's loop finish without its all-None warning).
    With `timeout` (seconds; the run's reward_timeout), a call that does not return in time is a RewardFailure:
    the trainer then raises it after TRL's reward loop, on every process together
    (pipeline/trainer/reward_failures.py), since a raise on one process inside the loop would leave the others
    waiting forever in the loop's gather. The deadline holds for every reward: each call runs in the reward's own
    worker process (rewards/worker.py), killed at the deadline and forked again for the next call. `own_process`
    False (our health observer, which the trainer's callbacks read) keeps the call in this process, under the
    cooperative alarm of rewards/deadline.py; so does a call whose arguments cannot be pickled (warned once).
    Without `timeout` (None or 0) every call runs here, without a limit.

    >>> guarded = guard_reward(lambda prompts, completions, **kw: [len(c) for c in completions])
    >>> guarded(prompts=["p", "p"], completions=["ab", "c"])
    [2.0, 1.0]
    """
    name = reward_name(func)
    nones = _NoneShare(name, warn)
    worker = RewardWorker(func, name) if timeout and own_process else None
    sent_here: list[str] = []  # the argument that could not be sent to the worker, once warned

    def finish(output: Any, prompts: Any, completions: Any, kwargs: dict[str, Any]) -> list[Optional[float]]:
        values = check_rewards(name, output, len(completions))
        nones.record(values, kwargs)
        return values

    def in_worker(prompts: Any, completions: Any, kwargs: dict[str, Any]) -> Any:
        """The call in the worker: its checked values, or _HERE when it must run in this process instead."""
        try:
            status, value = worker.call(prompts, completions, kwargs, timeout)
        except Unsendable as err:
            if not sent_here:
                sent_here.append(err.key)
                warn(f"reward `{name}` gets {err.key}, which cannot be sent to the reward's own process "
                     f"({shorten(err.why, 160)}); it runs in the trainer's process instead, where reward_timeout "
                     "holds only for a reward that lets an alarm through, in the main thread (docs/rewards.md). "
                     "Make it picklable, or set reward_timeout 0 to run every reward there. (Warned once.)")
            return _HERE
        except WorkerEnded as err:
            raise _Settled(name, f"ended its own process ({err}) on a batch of {len(completions)} completions "
                                f"(first: {_sample(0, prompts, completions, kwargs)}); while reward_timeout is set a "
                                "reward runs in a process of its own (docs/rewards.md): look for an os._exit(), a "
                                "crash in a C library, or the out-of-memory killer.") from None
        if status == "broke":
            raise _Settled(name, value)
        return value

    def one_by_one(prompts: Any, completions: Any, kwargs: dict[str, Any]) -> Any:
        """A call on one sample, for the search of the failing one: in the worker when the batch ran there."""
        if worker is not None and not sent_here:
            try:
                return worker.call(prompts, completions, kwargs, timeout)
            except WorkerEnded as err:
                raise RewardRaised("WorkerEnded", str(err), "", False) from None
        return func(prompts=prompts, completions=completions, **kwargs)

    def failure(err: BaseException, prompts: Any, completions: Any, kwargs: dict[str, Any]) -> RewardFailure:
        raised = err if isinstance(err, RewardRaised) else RewardRaised(type(err).__name__, str(err), "",
                                                                        isinstance(err, TypeError))
        if raised.type_error and not _accepts(func, kwargs):
            withheld = [c for c in trl_rule()["not_columns"] if f"'{c}'" in raised.text and c not in kwargs]
            why = (f" TRL never passes a dataset column named {', '.join(map(repr, withheld))} to a reward "
                   "(GRPOTrainer._calculate_rewards leaves out prompt, completion and completion_ids): read "
                   "`prompts` / `completions`, or rename the column." if withheld else "")
            return RewardFailure(name, f"cannot be called the way TRL calls it ({raised.text}). Write it as "
                                 "`def fn(prompts, completions, **kwargs) -> list[float | None]`; kwargs carry "
                                 f"{', '.join(sorted(kwargs))} (docs/rewards.md).{why}")
        index = (_first_failing(one_by_one, prompts, completions, kwargs)
                 if not is_async_reward(func) else None)
        where = f" on {_sample(index, prompts, completions, kwargs)}" if index is not None else (
            f" on a batch of {len(completions)} completions (first: {_sample(0, prompts, completions, kwargs)})")
        at = raised.at if isinstance(err, RewardRaised) else raised_at(func, err)
        return RewardFailure(name, f"raised {raised.type_name}: {shorten(raised.text, 300)}{where}{at}")

    if is_async_reward(func):  # TRL runs async rewards concurrently; keep them async
        @functools.wraps(func)
        async def guarded_async(prompts=None, completions=None, **kwargs):
            try:
                output = _HERE
                if worker is not None:  # waited for in a thread: the loop stays free for the other rewards
                    output = await asyncio.to_thread(in_worker, prompts, completions, kwargs)
                if output is _HERE:
                    mine_prompts, mine_completions, mine = own_batch(prompts, completions, kwargs)
                    output = await asyncio.wait_for(func(prompts=mine_prompts, completions=mine_completions,
                                                         **mine), timeout or None)
            except _NOT_A_REWARD_FAILURE:
                raise
            except (asyncio.TimeoutError, RewardTimeout):
                raise _timed_out(name, timeout, len(completions)) from None
            except _Settled:
                raise
            except BaseException as err:  # noqa: BLE001 - every failure becomes one named RewardFailure
                raise failure(err, prompts, completions, kwargs) from err
            return finish(output, prompts, completions, kwargs)

        return guarded_async if hold is None else _holding(guarded_async, hold)

    @functools.wraps(func)
    def guarded(prompts=None, completions=None, **kwargs):
        try:
            output = in_worker(prompts, completions, kwargs) if worker is not None else _HERE
            if output is _HERE:
                mine_prompts, mine_completions, mine = own_batch(prompts, completions, kwargs)
                with reward_deadline(timeout):
                    output = func(prompts=mine_prompts, completions=mine_completions, **mine)
        except _NOT_A_REWARD_FAILURE:
            raise
        except RewardTimeout:  # never retried sample by sample: each would wait as long again
            raise _timed_out(name, timeout, len(completions)) from None
        except _Settled:  # the worker's verdict on the output, or its end: already named
            raise
        except BaseException as err:  # noqa: BLE001 - every failure becomes one named RewardFailure
            raise failure(err, prompts, completions, kwargs) from err
        return finish(output, prompts, completions, kwargs)

    return guarded if hold is None else _holding(guarded, hold)


def _holding(guarded: Callable, hold: Callable[[RewardFailure], None]) -> Callable:
    """`guarded` that hands a RewardFailure to `hold` and returns 0.0 per completion instead of raising."""
    if inspect.iscoroutinefunction(guarded):
        @functools.wraps(guarded)
        async def held_async(prompts=None, completions=None, **kwargs):
            try:
                return await guarded(prompts=prompts, completions=completions, **kwargs)
            except RewardFailure as err:
                hold(err)
                return [0.0] * len(completions)

        return held_async

    @functools.wraps(guarded)
    def held(prompts=None, completions=None, **kwargs):
        try:
            return guarded(prompts=prompts, completions=completions, **kwargs)
        except RewardFailure as err:
            hold(err)
            return [0.0] * len(completions)

    return held


def call_reward(func: Callable, prompts: list[Any], completions: list[Any], kwargs: dict[str, Any],
                warn: Callable[[str], None] = lambda message: None,
                timeout: Optional[float] = None) -> list[Optional[float]]:
    """One call of `func` outside training, as the trainer makes it: by keyword, guarded (plain floats or None back,
    a RewardFailure naming the function and the sample otherwise), an async reward awaited."""
    output = guard_reward(func, warn=warn, timeout=timeout)(prompts=prompts, completions=completions, **kwargs)
    if inspect.isawaitable(output):
        output = asyncio.run(output)
    return output


def probe_rewards(funcs: Sequence[Callable], prompts: list[Any], completions: list[Any],
                  kwargs: dict[str, Any], timeout: Optional[float] = None) -> list[str]:
    """Call each function once (`call_reward`) on a batch in the run's real form; one line per function.

    Raises the first RewardFailure (a wrong signature is a raise too: TRL passes everything by keyword).
    """
    lines = []
    for func in funcs:
        output = call_reward(func, prompts, completions, kwargs, timeout=timeout)
        nones = sum(v is None for v in output)
        shown = ", ".join("None" if v is None else f"{v:g}" for v in output[:4])
        lines.append(f"{reward_name(func)}: [{shown}{', ...' if len(output) > 4 else ''}]"
                     + (f" ({nones} None)" if nones else ""))
    return lines
