"""Cache of prepared datasets, keyed by a fingerprint of everything that shapes them.

The key covers the source (hub name/config/split/revision, or a local file's or folder's files: path,
size, mtime and, for files up to 64 MiB, content hash), the tokenizer (name, vocab size, special
tokens, chat template, and a local tokenizer folder's files), the data fields of the config, this code's
format version and source (pipeline/data/*.py), and the versions of the libraries that build and save the
Arrow files. A second run with the same key loads the saved Arrow files and tokenizes nothing. The key is
env/kept.py's `state_key`, as for every kept file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.locations import cache_root
from grpo_pipeline.env.paths import json_text, publish_once
from grpo_pipeline.env.secret_fields import masked
import grpo_pipeline.pipeline.data  # the package's own code is the cache's identity (data_code_identity)
from grpo_pipeline.env.kept import code_hash, file_sha256, state_key, versions
from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path

# Bump when the prepared columns or the cleaning rules change, so old caches are not reused.
DATA_FORMAT_VERSION = 4
# Files up to this size are hashed for the fingerprint (GSM8K train as JSONL is ~4 MB).
CONTENT_HASH_MAX_BYTES = 64 * 1024 * 1024
REPORT_IN_CACHE = "report.json"
DATASET_IN_CACHE = "dataset"


def data_cache_root(data_cache_dir: Optional[str]) -> Path:
    """Where prepared datasets live: `data_cache_dir` from the config, else <cache root>/data."""
    if data_cache_dir:
        return Path(data_cache_dir).expanduser().resolve()
    return cache_root() / "data"


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
    """What about a tokenizer changes token counts: name, vocab size, special tokens, chat template, and when it
    was loaded from a local folder, that folder's files (an edited tokenizer.json keeps its name and size)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):  # some tokenizers keep a dict of named templates
        template = json.dumps(template, sort_keys=True, default=str)
    name = str(getattr(tokenizer, "name_or_path", ""))
    return {
        "name_or_path": name,
        "vocab_size": getattr(tokenizer, "vocab_size", None),
        "special_tokens": sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", [])),
        "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
        "files": _tokenizer_files(Path(name)) if name and Path(name).is_dir() else None,
    }


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")


def _tokenizer_files(folder: Path) -> list[dict[str, Any]]:
    """A tokenizer folder's own files as `local_file_identity` (a model folder's weights are not the tokenizer's)."""
    return [{**local_file_identity(p), "path": p.name} for p in sorted(folder.iterdir())
            if p.is_file() and p.suffix not in WEIGHT_SUFFIXES]


def model_identity(model_name_or_path: str, model_source: str = "hf") -> dict[str, Any]:
    """What names the weights a model name loads: a built-in model's folder (its name carries its build key,
    pipeline/demo/model.py) or a local folder, with its files as `local_tree_identity`; a hub id and its
    source (hf | modelscope) otherwise."""
    path = Path(resolve_model_path(model_name_or_path)).expanduser()
    if path.is_dir():
        return {"name": model_name_or_path, **local_tree_identity(path)}
    return {"name": model_name_or_path, "source": model_source}


def data_code_identity() -> dict[str, Any]:
    """The code and libraries that build a cache entry: pipeline/data/*.py and the versions that load, clean,
    tokenize and save the rows (an entry saved by another pyarrow or datasets may not load the same)."""
    return {"code_sha256": code_hash(grpo_pipeline.pipeline.data),
            "versions": versions("datasets", "pyarrow", "transformers", "tokenizers", "jinja2")}


def fingerprint(source: dict[str, Any], tokenizer: dict[str, Any], data_fields: dict[str, Any]) -> str:
    """`state_key` of the three identities, the data code's identity and DATA_FORMAT_VERSION.

    >>> a = fingerprint({"kind": "sample"}, {"vocab_size": 10}, {"max_samples": None})
    >>> a == fingerprint({"kind": "sample"}, {"vocab_size": 10}, {"max_samples": 5})
    False
    >>> len(a)
    64
    """
    return state_key({"version": DATA_FORMAT_VERSION, "source": source, "tokenizer": tokenizer, "data": data_fields,
                      "code": data_code_identity()})


def entry_is_complete(entry: Path) -> bool:
    """True when a cache entry has both its dataset folder and its report."""
    return (entry / REPORT_IN_CACHE).is_file() and (entry / DATASET_IN_CACHE).is_dir()


def load_cached(entry: Path) -> Optional[tuple[Any, dict[str, Any]]]:
    """(dataset, report) from a complete cache entry, or None when there is none."""
    if not entry_is_complete(entry):
        return None
    report_path = entry / REPORT_IN_CACHE
    # lazy: datasets imports torch
    from datasets import load_from_disk

    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    return load_from_disk(str(entry / DATASET_IN_CACHE)), report


def save_cached(entry: Path, dataset: Any, report: dict[str, Any], seen=None) -> None:
    """Write the dataset and its report into a staging folder, then rename it into place in one step.

    A crash mid-write leaves only a staging folder, never an entry that looks complete. When two
    runs race, the first rename wins and the other's copy (identical by construction) is removed;
    a hand-damaged entry is replaced (see grpo_pipeline.env.paths.publish_once). `seen`: what was at `entry` before the build
    (grpo_pipeline.env.locations.snapshot); anything else found there at the end is left alone.
    """
    def write(staging: Path) -> None:
        dataset.save_to_disk(str(staging / DATASET_IN_CACHE))
        (staging / REPORT_IN_CACHE).write_text(json_text(masked(report)), encoding="utf-8")  # any file name in it

    publish_once(entry, write, is_complete=entry_is_complete, option="data_cache_dir", seen=seen)
