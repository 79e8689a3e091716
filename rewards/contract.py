"""The one reward contract, checked before the model loads and enforced around every call while training.
TRL's `GRPOTrainer._calculate_rewards` (TRL 1.15) calls `fn(prompts=..., completions=..., completion_ids=...,
**kwargs) -> list[float | None]`, one value per completion (its keywords: rewards/trl_source.py; what may come back:
rewards/returned.py). `--check` (pipeline/preflight.py) and the trainer use the same `guard_reward`. No torch here.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Optional

from grpo_pipeline.env.text import shorten
from grpo_pipeline.rewards.deadline import RewardTimeout, reward_deadline
from grpo_pipeline.rewards.returned import RewardFailure, check_rewards, raised_at, sample
from grpo_pipeline.rewards.trl_source import trl_rule
from grpo_pipeline.rewards.worker import RewardRaised, RewardWorker, Settled, can_fork


def reward_name(func: Any) -> str:
    """The name TRL logs a reward under (`rewards/<name>/mean`)."""
    return getattr(func, "__name__", None) or type(func).__name__


def is_async_reward(func: Any) -> bool:
    """Whether calling `func` returns a coroutine, read as TRL 1.15 reads it (trl.trainer.utils
    `is_async_callable`): through functools.partial, and on a callable instance's `__call__`."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(func.__call__)


def _first_failing(call: Callable, prompts: Any, completions: Any, kwargs: dict[str, Any]) -> Optional[int]:
    """The index of the first single completion on which `call(prompts, completions, kwargs)` raises too (None:
    it only fails on the batch, or a single call ran past the deadline)."""
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
    """A copy of the batch for one reward, so one that edits `completions` (or a column) in place cannot change what
    the next reward scores (TRL hands every reward the same lists); the trainer's own objects are passed as they are.

    >>> completions = [[{"role": "assistant", "content": "18"}]]
    >>> _, mine, _ = own_batch(None, completions, {})
    >>> mine[0][0]["content"] = "rewritten"; completions[0][0]["content"]
    '18'
    """
    # TRL's keywords that are the trainer's own objects, not the batch; and `environments`, the rollouts' live
    # environment instances (set under an `if` in _calculate_rewards, so not in the rule): a copy would score
    # another object than the one the rollout changed, and one holding a process or a socket cannot be copied
    trainer_objects = (*trl_rule()["trainer"], "environments")
    columns = {key: (value if key in trainer_objects else copy.deepcopy(value)) for key, value in kwargs.items()}
    return copy.deepcopy(prompts), copy.deepcopy(completions), columns


def _failure(func: Callable, name: str, worker: Optional[RewardWorker], err: BaseException, prompts: Any,
             completions: Any, kwargs: dict[str, Any]) -> RewardFailure:
    """What `func` raised (here, or in its worker: a RewardRaised) as one RewardFailure naming the sample it raised
    on, or how to write it when TRL's call does not fit its signature."""
    type_name, text, at, type_error = err.args if isinstance(err, RewardRaised) else (
        type(err).__name__, str(err), raised_at(func, err), isinstance(err, TypeError))
    if type_error and not _accepts(func, kwargs):
        withheld = [c for c in trl_rule()["not_columns"] if f"'{c}'" in text and c not in kwargs]
        why = (f" TRL never passes a dataset column named {', '.join(map(repr, withheld))} to a reward "
               "(GRPOTrainer._calculate_rewards leaves out prompt, completion and completion_ids): read "
               "`prompts` / `completions`, or rename the column." if withheld else "")
        return RewardFailure(name, f"cannot be called the way TRL calls it ({text}). Write it as "
                             "`def fn(prompts, completions, **kwargs) -> list[float | None]`; kwargs carry "
                             f"{', '.join(sorted(kwargs))} (docs/rewards.md).{why}")
    single = worker.single if worker is not None else (lambda p, c, kw: func(prompts=p, completions=c, **kw))
    index = _first_failing(single, prompts, completions, kwargs) if not is_async_reward(func) else None
    where = f" on {sample(index, prompts, completions, kwargs)}" if index is not None else (
        f" on a batch of {len(completions)} completions (first: {sample(0, prompts, completions, kwargs)})")
    return RewardFailure(name, f"raised {type_name}: {shorten(text, 300)}{where}{at}")


def guard_reward(func: Callable, warn: Callable[[str], None] = _print_warning,
                 hold: Optional[Callable[[RewardFailure], None]] = None, timeout: Optional[float] = None,
                 own_process: bool = True) -> Callable:
    """`func` under the contract, same `__name__`: values checked (`check_rewards`) on its own copy of the batch,
    every way out but a real signal a RewardFailure naming the sample, None's share logged and warned once. `hold`
    takes a failure and 0.0 is returned per completion (pipeline/trainer/trl_internals.py raises it after TRL's
    loop). `timeout`: each call in a worker process (rewards/worker.py), or under deadline.py's alarm without
    `own_process` (our health observer, which the trainer's callbacks read).

    >>> guarded = guard_reward(lambda prompts, completions, **kw: [len(c) for c in completions])
    >>> guarded(prompts=["p", "p"], completions=["ab", "c"])
    [2.0, 1.0]
    """
    name = reward_name(func)
    warned = False
    worker = RewardWorker(func, name, is_async_reward(func), timeout, warn) if timeout and own_process and can_fork() \
        else None

    def checked(output: Any, completions: Any, kwargs: dict[str, Any]) -> list[Optional[float]]:
        nonlocal warned
        try:
            values = check_rewards(name, output, len(completions))
        except RewardFailure as err:
            return held(err, completions)
        share = sum(v is None for v in values) / max(len(values), 1)
        if callable(kwargs.get("log_metric")):
            kwargs["log_metric"](f"rewards/{name}/none_frac", share)
        if share > 0 and not warned:
            warned = True
            state = kwargs.get("trainer_state")
            # global_step counts completed steps: the batch being scored belongs to the next one
            step = f" at step {state.global_step + 1}" if getattr(state, "global_step", None) is not None else ""
            warn(f"reward `{name}` returned None for {share:.0%} of the batch{step}. TRL leaves those samples out of "
                 "that reward (its mean is over the rest, and they add 0 to the total); the share is logged as "
                 f"rewards/{name}/none_frac in metrics.jsonl. (Warned once.)")
        return values

    def settled(err: BaseException, timeouts: tuple, prompts: Any, completions: Any,
                kwargs: dict[str, Any]) -> list[float]:
        """A raise out of the call: a real signal passes; anything else is one RewardFailure (past the deadline, never
        retried sample by sample: each would wait as long again)."""
        if isinstance(err, _NOT_A_REWARD_FAILURE):
            raise err
        if isinstance(err, timeouts):
            failure = RewardFailure(name, f"did not return within reward_timeout ({timeout:g} s) on a batch of "
                                    f"{len(completions)} completions; the run stopped there. Make it faster (a judge "
                                    "or a tool call needs its own timeout), or raise reward_timeout (0 = no limit).")
            failure.__suppress_context__ = True
        elif isinstance(err, Settled):
            failure = err
        else:
            failure = _failure(func, name, worker, err, prompts, completions, kwargs)
            failure.__cause__ = err
        return held(failure, completions)

    def held(err: RewardFailure, completions: Any) -> list[float]:
        """Without `hold`, `err` raised; with it, handed over and 0.0 returned per completion."""
        if hold is None:
            raise err
        hold(err)
        return [0.0] * len(completions)

    if is_async_reward(func):  # TRL runs async rewards concurrently; keep them async
        @functools.wraps(func)
        async def guarded_async(prompts=None, completions=None, **kwargs):
            try:  # the worker is waited for in a thread: the loop stays free for the other async rewards
                output = await asyncio.to_thread(worker.batch, prompts, completions, kwargs) if worker else None
                if output is None:
                    mine_prompts, mine_completions, mine = own_batch(prompts, completions, kwargs)
                    output = await asyncio.wait_for(func(prompts=mine_prompts, completions=mine_completions,
                                                         **mine), timeout or None)
            except BaseException as err:  # noqa: BLE001 - every way out is settled
                return settled(err, (asyncio.TimeoutError, RewardTimeout), prompts, completions, kwargs)
            return checked(output, completions, kwargs)

        return guarded_async

    @functools.wraps(func)
    def guarded(prompts=None, completions=None, **kwargs):
        try:
            output = worker.batch(prompts, completions, kwargs) if worker is not None else None
            if output is None:
                mine_prompts, mine_completions, mine = own_batch(prompts, completions, kwargs)
                with reward_deadline(timeout):
                    output = func(prompts=mine_prompts, completions=mine_completions, **mine)
        except BaseException as err:  # noqa: BLE001 - every way out is settled
            return settled(err, (RewardTimeout,), prompts, completions, kwargs)
        return checked(output, completions, kwargs)

    return guarded


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
    """Call each function once (`call_reward`) on a batch in the run's real form; one line per function. Raises
    the first RewardFailure."""
    lines = []
    for func in funcs:
        output = call_reward(func, prompts, completions, kwargs, timeout=timeout)
        nones = sum(v is None for v in output)
        shown = ", ".join("None" if v is None else f"{v:g}" for v in output[:4])
        lines.append(f"{reward_name(func)}: [{shown}{', ...' if len(output) > 4 else ''}]"
                     + (f" ({nones} None)" if nones else ""))
    return lines
