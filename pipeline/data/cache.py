"""Cache of prepared datasets, keyed by a fingerprint of everything that shapes them.

The key covers the source (hub name/config/split/revision, or a local file's or folder's files: path,
size, mtime and, for files up to 64 MiB, content hash), the tokenizer (name, vocab size, special
tokens, chat template), the data fields of the config, and this code's format version. A
second run with the same key loads the saved Arrow files and tokenizes nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from env.paths import cache_root, publish_once

# Bump when the prepared columns or the cleaning rules change, so old caches are not reused.
DATA_FORMAT_VERSION = 3
# Files up to this size are hashed for the fingerprint (GSM8K train as JSONL is ~4 MB).
CONTENT_HASH_MAX_BYTES = 64 * 1024 * 1024
REPORT_IN_CACHE = "report.json"
DATASET_IN_CACHE = "dataset"


def data_cache_root(data_cache_dir: Optional[str]) -> Path:
    """Where prepared datasets live: `data_cache_dir` from the config, else <cache root>/data."""
    if data_cache_dir:
        return Path(data_cache_dir).expanduser().resolve()
    return cache_root() / "data"


def file_sha256(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def local_file_identity(path: Path) -> dict[str, Any]:
    """Path, size and mtime of a data file, plus its content hash when it is small enough to read quickly."""
    path = path.resolve()
    stat = path.stat()
    identity: dict[str, Any] = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if stat.st_size <= CONTENT_HASH_MAX_BYTES:
        identity["sha256"] = file_sha256(path)
    return identity


def local_tree_identity(folder: Path) -> dict[str, Any]:
    """A folder's identity: every file under it (name order, hidden ones too) as `local_file_identity`, so
    editing, adding or removing any file changes the fingerprint."""
    folder = folder.resolve()
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {"path": str(folder),
            "files": [{**local_file_identity(p), "path": p.relative_to(folder).as_posix()} for p in files]}


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """What about a tokenizer changes token counts: name, vocab size, special tokens, chat template."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):  # some tokenizers keep a dict of named templates
        template = json.dumps(template, sort_keys=True, default=str)
    return {
        "name_or_path": str(getattr(tokenizer, "name_or_path", "")),
        "vocab_size": getattr(tokenizer, "vocab_size", None),
        "special_tokens": sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", [])),
        "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
    }


def fingerprint(source: dict[str, Any], tokenizer: dict[str, Any], data_fields: dict[str, Any]) -> str:
    """sha256 over the canonical JSON of the three identities and DATA_FORMAT_VERSION.

    >>> a = fingerprint({"kind": "sample"}, {"vocab_size": 10}, {"max_samples": None})
    >>> a == fingerprint({"kind": "sample"}, {"vocab_size": 10}, {"max_samples": 5})
    False
    >>> len(a)
    64
    """
    payload = {"version": DATA_FORMAT_VERSION, "source": source, "tokenizer": tokenizer, "data": data_fields}
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def entry_is_complete(entry: Path) -> bool:
    """True when a cache entry has both its dataset folder and its report."""
    return (entry / REPORT_IN_CACHE).is_file() and (entry / DATASET_IN_CACHE).is_dir()


def load_cached(entry: Path) -> Optional[tuple[Any, dict[str, Any]]]:
    """(dataset, report) from a complete cache entry, or None when there is none."""
    if not entry_is_complete(entry):
        return None
    report_path = entry / REPORT_IN_CACHE
    from datasets import load_from_disk

    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    return load_from_disk(str(entry / DATASET_IN_CACHE)), report


def save_cached(entry: Path, dataset: Any, report: dict[str, Any], seen=None) -> None:
    """Write the dataset and its report into a staging folder, then rename it into place in one step.

    A crash mid-write leaves only a staging folder, never an entry that looks complete. When two
    runs race, the first rename wins and the other's copy (identical by construction) is removed;
    a hand-damaged entry is replaced (see env.paths.publish_once). `seen`: what was at `entry` before the build
    (env.paths.snapshot); anything else found there at the end is left alone.
    """
    def write(staging: Path) -> None:
        dataset.save_to_disk(str(staging / DATASET_IN_CACHE))
        with open(staging / REPORT_IN_CACHE, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, ensure_ascii=False)

    publish_once(entry, write, is_complete=entry_is_complete, option="data_cache_dir", seen=seen)
