"""A tool for the tool-run bench (bench/overhead.py --tools), `subtract`; the run steers the random tiny model to call
it with tests/agent_helpers.py forced_text_bias (TRL's own `generation_kwargs.sequence_bias`)."""

from __future__ import annotations


def subtract(minuend: int, subtrahend: int) -> int:
    """Subtract one integer from another.

    Args:
        minuend: The integer to subtract from.
        subtrahend: The integer to take away.

    Returns:
        The difference.
    """
    return minuend - subtrahend
