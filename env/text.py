"""Values as text for messages: bounded (a YAML alias bomb's whole `repr` once made an 11 MB error), printable on
any stream, secrets masked.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterator
from typing import Any, Optional

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
    """`repr(value)`, at most about `limit` characters long, built without the whole repr of a large value
    (reprlib cuts strings, lists and mappings while it walks them).

    >>> excerpt("tpu"), excerpt([1, 2]), len(excerpt("x" * 10**7)) <= 200, len(excerpt([[0] * 10**6] * 10**3)) <= 200
    ("'tpu'", '[1, 2]', True, True)
    """
    cutter = reprlib.Repr()
    cutter.maxstring = cutter.maxother = cutter.maxlong = limit
    cutter.maxlist = cutter.maxtuple = cutter.maxset = cutter.maxfrozenset = cutter.maxdeque = 12
    cutter.maxdict, cutter.maxarray, cutter.maxlevel = 12, 12, 4
    try:
        return shorten(printable(cutter.repr(value)), limit)
    except Exception:  # noqa: BLE001 - a value whose repr raises is still named, by its type
        return f"<{type(value).__name__} object>"


def printable(value: Any) -> str:
    r"""Any value as text that every stream and file takes, never raising (the crash handler's way): `str(value)`
    (its repr, else its type, when that raises), a surrogate escape of a non-UTF-8 file name as \xNN, every
    remembered secret masked (env/secret_fields.py).

    >>> class Bad:
    ...     def __str__(self): raise RuntimeError("no")
    ...     def __repr__(self): raise RuntimeError("no")
    >>> printable("caf\udce9"), printable(Bad())
    ('caf\\xe9', '<Bad object>')
    """
    from grpo_pipeline.env.secret_fields import redact

    for render in (str, repr, lambda v: f"<{type(v).__name__} object>", lambda v: "<an unprintable object>"):
        try:
            text = render(value)  # str() and repr() return a str or raise
            break
        except Exception:  # noqa: BLE001 - any failure of a user's __str__ falls through to the next form
            continue
    try:  # a non-UTF-8 name's bytes back, each shown as \xNN
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate of another kind: as \udcNN
        raw = text.encode("utf-8", "backslashreplace")
    return redact(raw.decode("utf-8", "backslashreplace"))


def say(text: Any, stream: Any = None) -> None:
    """Print one line (`printable`) to `stream` (stderr) whatever its encoding: under an ASCII or Latin-1 locale a
    character it cannot encode is written as an escape (\\uNNNN) rather than raising."""
    import sys

    stream = stream if stream is not None else sys.stderr
    text = printable(text)
    try:
        print(text, file=stream, flush=True)
    except UnicodeEncodeError:
        print(text.encode("ascii", "backslashreplace").decode("ascii"), file=stream, flush=True)


def exception_chain(err: Optional[BaseException]) -> Iterator[BaseException]:
    """`err`, then what it was raised from or during (`__cause__`, else `__context__`), each once (a loop ends).

    >>> try:
    ...     try:
    ...         raise KeyError("inner")
    ...     except KeyError as inner:
    ...         raise ValueError("outer") from inner
    ... except ValueError as outer:
    ...     [type(e).__name__ for e in exception_chain(outer)]
    ['ValueError', 'KeyError']
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__

