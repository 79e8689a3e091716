"""A reward call's deadline in the trainer's own process: SIGALRM around a synchronous call, in the main thread.

Cooperative, so it does not hold for every reward (math_verify's own alarm cancels it, a blocked event loop or a
hung thread is out of its reach, and off the main thread there is none): while reward_timeout is set, rewards run in
a process of their own that is killed at the deadline (rewards/worker.py). This alarm is what is left for the calls
that stay here: our health observer, and a call whose arguments cannot be pickled for the worker.
rewards/contract.py guard_reward turns RewardTimeout, from either, into a RewardFailure naming the reward (an async
reward that stays here is bounded by asyncio.wait_for instead).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Optional


class RewardTimeout(BaseException):
    """A reward call ran past its deadline (`reward_deadline`). A BaseException, so that a reward's own
    `except Exception:` cannot swallow it."""


@contextlib.contextmanager
def reward_deadline(seconds: Optional[float]):
    """Raise RewardTimeout inside the block after `seconds` (None or 0: no limit), through SIGALRM: a reward stuck
    in Python code or in a blocking call (sleep, a socket read) is interrupted. Only the main thread can take a
    signal: elsewhere (a notebook's worker thread) the block runs without a limit. An alarm someone else had set
    (a test runner's timeout) is put back afterwards with the time it has left."""
    if not seconds or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):  # noqa: ARG001 (the signal handler signature)
        raise RewardTimeout()

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expire)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # the outer alarm, with what is left of it (at once when it fell due meanwhile)
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))
