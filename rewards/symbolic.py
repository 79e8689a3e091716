"""The slow path: symbolic equality of two LaTeX answers through math-verify.

Only answers the fast numeric reader (normalize.py) could not settle come here, e.g.
"\\frac{\\sqrt{3}}{2}" vs "\\sqrt{3}/2" or "(x+1)^2" vs "x^2+2x+1". We do not hand-write a
LaTeX parser; math-verify (sympy underneath) is the well-kept one.

Four things make it safe to call inside a training step:

- Lazy import: math_verify pulls in sympy (~0.6 s), so `import rewards` stays fast and
  runs that never see a symbolic answer never pay for it.
- Time limits: math-verify's own `parsing_timeout` / `timeout_seconds` (signal.alarm, whole
  seconds, so 1 s is the smallest limit). Worst case per completion is about 2 s: one
  parse of the prediction and one sympy comparison (the reference's parse is cached).
- Threads: signal.alarm works only in the main thread, and math-verify raises there
  otherwise. Running sympy without a limit could hang a worker forever ("10^{10^{10^{10}}}"
  is short), so off the main thread we skip the symbolic check: it returns False and logs
  one warning. TRL calls reward functions from the main thread, so training is unaffected.
- A budget per batch (`time_budget`) and a verdict cache: a policy that keeps inventing
  exotic expressions would otherwise add up to ~2 s per completion per step. Once a batch's
  budget is spent, new pairs score False (counted in `skipped_over_budget`, one warning per
  process); pairs already decided are answered from the cache at no cost. A pair skipped
  for time is not cached, so a later batch with budget left still decides it.

Inputs are wrapped as "$...$" and parsed with LatexExtractionConfig only. Without the
anchors math-verify's lenient extraction reads "2x" as 2 and "3\\sqrt{2}" as 3, which would
turn wrong answers into right ones.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

# Longer inputs are not final answers and could make sympy slow even under the limit.
MAX_SYMBOLIC_CHARS = 300
PARSE_TIMEOUT_S = 1
VERIFY_TIMEOUT_S = 1

_warned_off_main_thread = False
_warned_over_budget = False
_deadline: float | None = None  # time.monotonic() after which new pairs are not checked
skipped_over_budget = 0  # pairs scored False because the batch's budget was spent


class _OutOfTime(Exception):
    """Raised inside the cached verdict so that lru_cache does not store the skip."""


@contextlib.contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Limit the symbolic checks started inside the block to about `seconds` in total.

    The budget is checked before each new check; one check already running may overrun it by
    its own limits (at most PARSE_TIMEOUT_S + VERIFY_TIMEOUT_S).

    >>> with time_budget(0.0):
    ...     symbolic_equal("\\sqrt{9}", "3")   # budget already spent: not checked
    False
    >>> symbolic_equal("\\sqrt{9}", "3")
    True
    """
    global _deadline
    previous = _deadline
    _deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _deadline = previous


def symbolic_equal(pred: str, ref: str) -> bool:
    """True when math-verify proves `pred` equals `ref`; False on any doubt, error or timeout.

    >>> symbolic_equal("\\\\frac{\\\\sqrt{3}}{2}", "\\\\sqrt{3}/2")
    True
    >>> symbolic_equal("2x", "2")
    False
    """
    global _warned_off_main_thread, _warned_over_budget, skipped_over_budget
    if not pred or not ref or len(pred) > MAX_SYMBOLIC_CHARS or len(ref) > MAX_SYMBOLIC_CHARS:
        return False
    if threading.current_thread() is not threading.main_thread():
        if not _warned_off_main_thread:
            _warned_off_main_thread = True
            logger.warning("rewards: symbolic (math-verify) answer checks are skipped off the main thread, "
                           "because its time limit uses signal.alarm; such answers score as not matching.")
        return False
    try:
        return _verdict(pred, ref)
    except _OutOfTime:
        skipped_over_budget += 1
        if not _warned_over_budget:
            _warned_over_budget = True
            logger.warning("rewards: the batch's time budget for symbolic (math-verify) answer checks is spent; "
                           "further new expressions in this batch score as not matching.")
        return False


@functools.lru_cache(maxsize=8192)
def _verdict(pred: str, ref: str) -> bool:
    """math-verify's verdict on one pair, cached: a policy repeats its own exotic answers."""
    if _deadline is not None and time.monotonic() > _deadline:
        raise _OutOfTime
    from math_verify import verify
    from math_verify.errors import TimeoutException

    gold, target = _parse(ref), _parse(pred)
    if not gold or not target:
        return False
    try:
        return bool(verify(list(gold), list(target), timeout_seconds=VERIFY_TIMEOUT_S))
    except (Exception, TimeoutException):  # math-verify already swallows most; be sure
        return False


@functools.lru_cache(maxsize=4096)
def _parse(latex: str) -> tuple[Any, ...]:
    """math-verify's parse of one answer, cached: the reference repeats for every generation
    of a prompt, and a policy repeats its own answers."""
    from math_verify import LatexExtractionConfig, parse
    from math_verify.errors import TimeoutException

    try:
        return tuple(parse(f"${latex}$", extraction_config=[LatexExtractionConfig()],
                           parsing_timeout=PARSE_TIMEOUT_S))
    except (Exception, TimeoutException):
        return ()
