"""The slow path: symbolic equality of two LaTeX answers through math-verify (sympy underneath, imported lazily:
~0.6 s), for what normalize.py cannot settle: "\\frac{\\sqrt{3}}{2}" vs "\\sqrt{3}/2". Safe inside a training step:
math-verify's own time limits (signal.alarm; off the main thread the check is skipped, False, warned once) and a
budget per batch (`time_budget`). Inputs are wrapped as "$...$" and parsed with LatexExtractionConfig only: without
the anchors math-verify's lenient extraction reads "2x" as 2, turning wrong answers into right ones.
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
    """Limit the symbolic checks started inside the block to about `seconds` in total (one already running may
    overrun it by PARSE_TIMEOUT_S + VERIFY_TIMEOUT_S).

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

    >>> symbolic_equal("\\\\frac{\\\\sqrt{3}}{2}", "\\\\sqrt{3}/2"), symbolic_equal("2x", "2")
    (True, False)
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
    """math-verify's parse of one answer, cached: a reference repeats for every generation of a prompt."""
    from math_verify import LatexExtractionConfig, parse
    from math_verify.errors import TimeoutException

    try:
        return tuple(parse(f"${latex}$", extraction_config=[LatexExtractionConfig()],
                           parsing_timeout=PARSE_TIMEOUT_S))
    except (Exception, TimeoutException):
        return ()
