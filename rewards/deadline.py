"""A reward call's deadline in the trainer's own process: SIGALRM around a synchronous call, in the main thread.

Cooperative (see rewards/worker.py for why that does not hold for every reward): what is left for the calls that
stay in the trainer's process, our health observer and a call whose arguments cannot be pickled for the worker.
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
    """Raise RewardTimeout inside the block after `seconds` (None or 0: no limit); off the main thread, no limit.
    An alarm someone else had set (a test runner's timeout) is put back afterwards with the time it has left."""
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
