"""A reward's own process: the deadline (reward_timeout) that holds for every reward a user can write. An alarm in
the trainer's process is cooperative (math_verify cancels it, a C call holding the GIL never lets its handler run, off
the main thread there is none); a process can always be killed. So while reward_timeout is set, each reward runs in a
worker forked on its first call, SIGKILLed with its process group past the deadline. What that changes for a reward:
docs/rewards.md "Its own process"; its cost: bench/overhead.py.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import io
import multiprocessing
import multiprocessing.util
import os
import pickle
import signal
import sys
import threading
import time
from typing import Any, Callable, Optional

from grpo_pipeline.env.text import shorten
from grpo_pipeline.rewards.deadline import RewardTimeout
from grpo_pipeline.rewards.returned import RewardFailure, check_rewards, raised_at, sample

# The trainer's own objects among a reward's keywords whose calls are recorded in the worker and replayed here.
_RECORDED = ("log_metric", "log_extra")
_STATE = "trainer_state"
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_live: set["_Process"] = set()  # every worker of this process: a new worker closes the others' pipe ends
_ended_cpu = 0.0  # CPU seconds of the workers stopped so far (workers_cpu_seconds)


class RewardRaised(Exception):
    """The reward raised in its worker: args are its type's name, its text, where (`raised_at`) and whether it is a
    TypeError (an exception object may not survive pickling)."""


class Settled(RewardFailure):
    """A RewardFailure the reward's worker settled (its output broke the contract, or the worker ended): passed on
    as it is, where a RewardFailure the reward itself raised is reported as its raise."""


class _Process:
    """One forked worker: the process and the parent's end of its pipe."""

    def __init__(self, func: Callable, name: str, is_async: bool):
        ctx = multiprocessing.get_context("fork")
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_serve, args=(func, name, is_async, child_conn, self.conn, os.getpid()),
                                name=f"grpo-reward-{name}", daemon=False)  # a reward may start its own processes
        self.proc.start()
        child_conn.close()
        with contextlib.suppress(OSError):  # its own group (the child sets it too: whoever runs first)
            os.setpgid(self.proc.pid, self.proc.pid)
        self.state_key: Any = None
        self.log_length = 0
        _live.add(self)

    def stop(self) -> str:
        """Kill the worker and everything it started; how it ended, for a message."""
        global _ended_cpu
        if self in _live:
            _ended_cpu += self.cpu_seconds()
        _live.discard(self)
        if self.proc.exitcode is None:
            for kill in (lambda: os.killpg(self.proc.pid, signal.SIGKILL), self.proc.kill):
                with contextlib.suppress(OSError, ValueError):
                    kill()
        self.proc.join(5)
        self.conn.close()
        code = self.proc.exitcode
        return (f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}")

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the live worker has used (Linux /proc; 0 elsewhere)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return 0.0


class RewardWorker:
    """The process a reward runs in while reward_timeout is set, as the guard (rewards/contract.py) calls it; see the
    module docstring. One call at a time."""

    def __init__(self, func: Callable, name: str, is_async: bool, timeout: float, warn: Callable[[str], None]):
        self.func, self.name, self.is_async, self.timeout, self.warn = func, name, is_async, timeout, warn
        self.unsendable = False  # an argument could not be sent: warned once, the reward runs in the trainer's process
        self.lock = threading.Lock()
        self.process: Optional[_Process] = None
        self._holder: list[Optional[_Process]] = [None]  # what the finalizer stops, without holding self
        multiprocessing.util.Finalize(self, _stop_holder, args=(self._holder,), exitpriority=100)

    def batch(self, prompts: Any, completions: Any, kwargs: dict[str, Any]) -> Optional[list]:
        """The call's checked values, or None when it must run in the trainer's process instead. Raises
        RewardTimeout (the worker is killed), RewardRaised, or Settled."""
        status, value = self._call(prompts, completions, kwargs)
        if status == "unsendable":
            if not self.unsendable:
                self.unsendable = True
                self.warn(f"reward `{self.name}` gets {value[0]}, which cannot be sent to the reward's own process "
                          f"({shorten(value[1], 160)}); it runs in the trainer's process instead, where "
                          "reward_timeout holds only for a reward that lets an alarm through, in the main thread "
                          "(docs/rewards.md). Make it picklable, or set reward_timeout 0 to run every reward "
                          "there. (Warned once.)")
            return None
        if status == "ended":
            raise Settled(self.name, f"ended its own process ({value}) on a batch of {len(completions)} completions "
                          f"(first: {sample(0, prompts, completions, kwargs)}); while reward_timeout is set a reward "
                          "runs in a process of its own (docs/rewards.md): look for an os._exit(), a crash in a C "
                          "library, or the out-of-memory killer.")
        if status == "broke":
            raise Settled(self.name, value)
        return value

    def single(self, prompts: Any, completions: Any, kwargs: dict[str, Any]) -> Any:
        """One call on one sample, for the search of the failing one (a raise is what it looks for)."""
        if self.unsendable:
            return self.func(prompts=prompts, completions=completions, **kwargs)
        status, value = self._call(prompts, completions, kwargs)
        if status == "ended":
            raise RewardRaised("WorkerEnded", value, "", False)
        return value

    def _call(self, prompts: Any, completions: Any, kwargs: dict[str, Any]) -> tuple[str, Any]:
        """One call in the worker: ("ok", checked values), ("broke", what the contract says of the output),
        ("ended", how the worker ended: os._exit, a crash in a C library, the out-of-memory killer) or
        ("unsendable", (the argument that cannot be pickled, why); nothing sent). Raises RewardTimeout (the
        worker is killed) or RewardRaised."""
        recorded = {key: kwargs[key] for key in _RECORDED if callable(kwargs.get(key))}
        with self.lock:
            if self.process is None or not self.process.proc.is_alive():
                self._start()
            process = self.process
            sendable = {key: value for key, value in kwargs.items() if key not in recorded}
            with_state = hasattr(sendable.get(_STATE), "log_history")
            if with_state:
                sendable[_STATE] = _state_update(process, sendable[_STATE])
            try:
                payload = pickle.dumps((prompts, completions, sendable, list(recorded), with_state), protocol=_PROTOCOL)
            except Exception as err:  # noqa: BLE001 - anything pickling raises: name the argument
                process.state_key = None  # the update was not sent
                return "unsendable", _unsendable(prompts, completions, sendable, err)
            try:
                process.conn.send_bytes(payload)
                if not process.conn.poll(self.timeout):
                    self._stop()
                    raise RewardTimeout()
                reply, logs = pickle.loads(process.conn.recv_bytes())
            except (EOFError, OSError):
                return "ended", self._stop()
            except BaseException:  # a signal's raise (Ctrl-C) while waiting: the reply would come out of turn
                if self.process is not None:
                    self._stop()
                raise
        for key, args in logs:
            if key in recorded:
                recorded[key](*args)
            elif key in ("stdout", "stderr"):  # what the reward printed to a stream this process replaced
                getattr(sys, key).write(*args)
        if reply[0] == "raised":
            raise RewardRaised(*reply[1:])
        return reply

    def _start(self) -> None:
        self._stop()
        self.process = self._holder[0] = _Process(self.func, self.name, self.is_async)

    def _stop(self) -> str:
        process, self.process, self._holder[0] = self.process, None, None
        return process.stop() if process is not None else "not started"


def _stop_holder(holder: list) -> None:
    if holder and holder[0] is not None:
        holder[0].stop()
        holder[0] = None


def can_fork() -> bool:
    """Whether this platform forks (Linux, macOS): elsewhere (Windows) rewards stay in the trainer's process, under
    the alarm of rewards/deadline.py where there is one."""
    return "fork" in multiprocessing.get_all_start_methods()


def workers_cpu_seconds() -> float:
    """CPU seconds the reward workers of this process have used, live and stopped: bench/overhead.py adds them to
    the trainer's own, so that work moved into a worker is still counted."""
    return _ended_cpu + sum(process.cpu_seconds() for process in list(_live))


def _state_update(process: _Process, state: Any) -> tuple[type, dict[str, Any], list[Any], bool]:
    """`trainer_state` as what changed since the last call: its type, its fields but log_history, the log entries
    added, and whether they are all of them (a new worker, another state object, or a log that shrank)."""
    log = state.log_history
    fresh = process.state_key != (id(state), id(log)) or len(log) < process.log_length
    start = 0 if fresh else process.log_length
    process.state_key, process.log_length = (id(state), id(log)), len(log)
    fields = {key: value for key, value in vars(state).items() if key != "log_history"}
    return type(state), fields, log[start:], fresh


def _unsendable(prompts: Any, completions: Any, kwargs: dict[str, Any], err: BaseException) -> tuple[str, str]:
    for key, value in (("prompts", prompts), ("completions", completions), *kwargs.items()):
        try:
            pickle.dumps(value, protocol=_PROTOCOL)
        except Exception as own:  # noqa: BLE001
            return key, f"{type(own).__name__}: {own}"
    return "the batch", f"{type(err).__name__}: {err}"


def _serve(func: Callable, name: str, is_async: bool, conn: Any, parent_end: Any, parent_pid: int) -> None:
    """The worker's loop: one request, one reply, until the parent's end closes (or the parent is gone)."""
    # First, the inherited objects go to the permanent generation: the child's collector then leaves them (and the
    # parent's memory pages under them) alone. Frozen here, in the child, not around the fork in the parent, whose
    # own gc.freeze() (a user's, or a server's before forking) a parent-side unfreeze would undo.
    gc.freeze()
    parent_end.close()
    for other in list(_live):  # the pipes of the workers forked before: theirs, not ours to hold open
        other.conn.close()
    _live.clear()
    with contextlib.suppress(OSError):  # its own group: a kill at the deadline takes what the reward started too
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it ends the worker
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    threading.Thread(target=_follow_parent, args=(parent_pid,), daemon=True).start()
    asyncio.events._set_running_loop(None)  # forked from a thread that was running TRL's loop, maybe
    loop = asyncio.new_event_loop() if is_async else None  # one loop for every call, as TRL keeps one
    # A print reaches the terminal straight from here; a stream the trainer's process replaced (a notebook's, a
    # test's capture) lives in that process only: what the reward prints to it is sent back and written there.
    relayed = {key: io.StringIO() for key in ("stdout", "stderr")
               if getattr(sys, key) is not getattr(sys, f"__{key}__")}
    for key, buffer in relayed.items():
        setattr(sys, key, buffer)
    state: Any = None
    while True:
        try:
            prompts, completions, kwargs, recorded, with_state = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)
        logs: list[tuple[str, tuple]] = []
        kwargs.update({key: _recorder(key, logs) for key in recorded})
        if with_state:
            kwargs[_STATE] = state = _apply(state, *kwargs[_STATE])
        try:
            output = func(prompts=prompts, completions=completions, **kwargs)
            if loop is not None:
                output = loop.run_until_complete(output)
            reply: tuple = ("ok", check_rewards(name, output, len(completions)))
        except RewardFailure as failure:
            reply = ("broke", failure.detail)
        except BaseException as err:  # noqa: BLE001 - every way out of the reward is reported, none ends the worker
            reply = _raised(func, err)
        for stream in (sys.stdout, sys.stderr):  # what the reward printed, before a kill could lose it
            with contextlib.suppress(Exception):
                stream.flush()
        for key, buffer in relayed.items():
            if buffer.tell():
                logs.append((key, (buffer.getvalue(),)))
                buffer.seek(0)
                buffer.truncate()
        try:
            data = pickle.dumps((reply, logs), protocol=_PROTOCOL)
        except Exception:  # noqa: BLE001 - a logged value that does not pickle: the reply without the logs
            data = pickle.dumps((reply, []), protocol=_PROTOCOL)
        try:
            conn.send_bytes(data)
        except OSError:
            os._exit(0)


def _raised(func: Callable, err: BaseException) -> tuple:
    try:
        text = str(err)
    except Exception:  # noqa: BLE001 - a __str__ that raises
        text = f"<{type(err).__name__} that cannot be printed>"
    if isinstance(err, RuntimeError) and "Cannot re-initialize CUDA in forked subprocess" in text:
        text += (" (while reward_timeout is set a reward runs in a process of its own, forked from the trainer's, "
                 "which cannot start CUDA again: set reward_timeout 0 to run it in the trainer's process)")
    try:
        at = raised_at(func, err)
    except Exception:  # noqa: BLE001
        at = ""
    return ("raised", type(err).__name__, text, at, isinstance(err, TypeError))


def _recorder(key: str, logs: list) -> Callable:
    def record(*args: Any) -> None:
        logs.append((key, args))

    record.__name__ = key
    return record


def _apply(state: Any, cls: type, fields: dict[str, Any], new_entries: list[Any], fresh: bool) -> Any:
    if fresh or state is None or type(state) is not cls:
        state = cls.__new__(cls)
        state.__dict__.update(fields)
        state.log_history = list(new_entries)
        return state
    state.__dict__.update(fields)
    state.log_history.extend(new_entries)
    return state


def _follow_parent(parent_pid: int) -> None:
    """End the worker (and what it started) once the trainer's process is gone, hung reward or not."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            try:
                if os.getpgid(0) == os.getpid():  # only its own group, never the one it was started in
                    os.killpg(0, signal.SIGKILL)
            finally:
                os._exit(0)


def stop_workers() -> None:
    """Stop every reward worker of this process; a run calls it when its training ends, since a worker holds the
    trainer's memory and open files (a pipe's write end kept open keeps its reader from ever seeing the end)."""
    for process in list(_live):
        process.stop()


# Registered after multiprocessing's own exit hook (imported above), so it runs first: that hook joins the workers.
atexit.register(stop_workers)
