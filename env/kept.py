"""Kept state: what the pipeline saves once and reuses later, keyed on the inputs it was computed from
(`state_key`, a sha256 of their canonical JSON). `reusable` is the one check every reuser makes; the table of kept
files is in docs/guardrails.md ("Kept state"). A checkpoint cannot be recomputed: a resume under other inputs is
refused instead (pipeline/run/resume.py, with `changed_inputs`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

KEY, INPUTS = "key", "inputs"


def canonical(inputs: Any) -> Any:
    """`inputs` as it reads back from JSON (tuples become lists, keys strings; anything else by its str), so a
    value compares equal to its own saved copy."""
    return json.loads(json.dumps(inputs, sort_keys=True, ensure_ascii=False, default=str))


def state_key(inputs: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of `inputs` (sorted keys, UTF-8): equal inputs, equal keys.

    >>> state_key({"a": 1, "b": (2, 3)}) == state_key({"b": [2, 3], "a": 1})
    True
    >>> state_key({"a": 1}) == state_key({"a": 1.5}), len(state_key({}))
    (False, 64)
    """
    blob = json.dumps(canonical(dict(inputs)), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    # surrogatepass: a non-UTF-8 file name (read through surrogate escapes) is keyed by its bytes, never refused
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def columns_key(names: Iterable[str], batches: Callable[[str], Iterable[list[Any]]]) -> str:
    """`state_key({name: column, ...})` computed in a stream: `batches(name)` yields the column's rows in order, in
    lists, so only one batch is in memory (the JSON of a list is its items' JSON joined by commas).

    >>> rows = {"b": [1, {"y": 2, "x": (3,)}, None], "a": ["é", "x"]}
    >>> chunks = lambda name: (rows[name][i:i + 2] for i in range(0, len(rows[name]), 2))
    >>> columns_key(rows, chunks) == state_key(rows), columns_key([], chunks) == state_key({})
    (True, True)
    """
    digest = hashlib.sha256(b"{")
    dump = lambda value: json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))  # noqa: E731
    for i, name in enumerate(sorted(str(name) for name in names)):
        digest.update(("," if i else "").encode() + dump(name).encode("utf-8", "surrogatepass") + b":[")
        first = True
        for batch in batches(name):
            if not batch:
                continue
            items = dump(canonical(list(batch)))[1:-1]  # "[a,b]" -> "a,b"
            digest.update(("" if first else ",").encode() + items.encode("utf-8", "surrogatepass"))
            first = False
        digest.update(b"]")
    digest.update(b"}")
    return digest.hexdigest()


def changed_inputs(recorded: Optional[Mapping[str, Any]], inputs: Mapping[str, Any]) -> list[str]:
    """The names of `inputs` whose value differs from `recorded` (absent on either side counts), in `inputs`' order
    then any only `recorded` has.

    >>> changed_inputs({"a": 1, "b": [1]}, {"a": 1, "b": (1,)}), changed_inputs({"a": 1, "c": 0}, {"a": 2})
    ([], ['a', 'c'])
    """
    old, new = canonical(dict(recorded or {})), canonical(dict(inputs))
    return [name for name in [*new, *(n for n in old if n not in new)] if old.get(name, ...) != new.get(name, ...)]


def record(inputs: Mapping[str, Any], **payload: Any) -> dict[str, Any]:
    """What a kept JSON file holds: its key, the inputs it was computed from, then its own content."""
    return {KEY: state_key(inputs), INPUTS: canonical(dict(inputs)), **payload}


def read_record(path: Path) -> Optional[dict[str, Any]]:
    """A kept JSON record, or None when it is missing, unreadable or not an object."""
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def reusable(path: Path, inputs: Mapping[str, Any], what: str, log: Callable[[str], None] = print,
             saved: Optional[dict[str, Any]] = None) -> Optional[dict[str, Any]]:
    """The kept record at `path` (or `saved`, already read from it) when its key is these `inputs`', else None, with
    one line saying what is recomputed and why (nothing kept: quietly)."""
    saved = saved if saved is not None else read_record(path)
    if saved is None:
        return None
    if saved.get(KEY) == state_key(inputs):
        return saved
    recorded = saved.get(INPUTS)
    changed = changed_inputs(recorded, inputs) if isinstance(recorded, dict) else []
    because = f"{', '.join(changed)} changed" if changed else "it was kept by an older version (no key)"
    log(f"{what}: not reusing {path} ({because} since it was written); computing it again")
    return None


def versions(*packages: str) -> dict[str, Optional[str]]:
    """The installed version of each package (None when it is not installed), from its metadata (no import).
    >>> versions("no-such-package-here")
    {'no-such-package-here': None}
    """
    found: dict[str, Optional[str]] = dict.fromkeys(packages)
    for name in packages:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def code_hash(*modules: Any) -> str:
    """sha256 over the `.py` files (name and bytes) of each module's package folder: the code that decides a kept
    result."""
    digest = hashlib.sha256()
    for module in modules:
        folder = Path(module.__file__).parent
        for path in sorted(folder.glob("*.py")):
            digest.update(os.fsencode(f"{folder.name}/{path.name}") + b"\0" + path.read_bytes())
    return digest.hexdigest()
