"""Bounded excerpts of user values for messages: the one helper every message that quotes a value uses.

A message once printed the `repr` of a whole value: a YAML alias bomb made an 11 MB error. `excerpt` quotes a
value as `repr` does, cut to `limit` characters, and never builds the whole `repr` of a large container
(reprlib cuts strings, lists and mappings while it walks them). `shorten` cuts a text, keeping both ends.
"""

from __future__ import annotations

import reprlib
from typing import Any

EXCERPT_LIMIT = 200


def shorten(text: str, limit: int = EXCERPT_LIMIT) -> str:
    """`text` if it fits in `limit` characters, else its start and end around a note of what was left out.

    >>> shorten("abc"), shorten("x" * 50, 30)
    ('abc', 'xxxxxx … 39 characters … xxxxx')
    """
    if len(text) <= limit:
        return text
    keep = max(limit - len(f" … {len(text)} characters … "), 2)  # the note's length, at most that long
    head = keep - keep // 2
    return f"{text[:head]} … {len(text) - keep} characters … {text[len(text) - keep // 2:]}"


def excerpt(value: Any, limit: int = EXCERPT_LIMIT) -> str:
    """`repr(value)`, at most about `limit` characters long, built without the whole repr of a large value.

    >>> excerpt("tpu"), excerpt([1, 2]), len(excerpt("x" * 10**7)) <= 200, len(excerpt([[0] * 10**6] * 10**3)) <= 200
    ("'tpu'", '[1, 2]', True, True)
    """
    cutter = reprlib.Repr()
    cutter.maxstring = cutter.maxother = cutter.maxlong = limit
    cutter.maxlist = cutter.maxtuple = cutter.maxset = cutter.maxfrozenset = cutter.maxdeque = 12
    cutter.maxdict, cutter.maxarray, cutter.maxlevel = 12, 12, 4
    return shorten(cutter.repr(value), limit)
