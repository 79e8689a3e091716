"""Cache of prepared datasets, keyed (env/kept.py `state_key`) by everything that shapes them: the source, the
tokenizer, the config's data fields, this code, and the library versions that build and save the Arrow files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.locations import cache_root
from grpo_pipeline.env.paths import json_text, publish_once
from grpo_pipeline.env.secret_fields import masked
import grpo_pipeline.pipeline.data  # the package's own code is part of the cache's identity (fingerprint)
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
    return Path(data_cache_dir).expanduser().resolve() if data_cache_dir else cache_root() / "data"


def local_file_identity(path: Path) -> dict[str, Any]:
    """Path, size and mtime of a data file, plus its content hash when it is small enough to read quickly."""
    path = path.resolve()
    stat = path.stat()
    identity: dict[str, Any] = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if stat.st_size <= CONTENT_HASH_MAX_BYTES:
        identity["sha256"] = file_sha256(path)
    return identity


def local_tree_identity(folder: Path) -> dict[str, Any]:
    """Every file under a folder (hidden ones too) as `local_file_identity`: any edit changes the fingerprint."""
    folder = folder.resolve()
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {"path": str(folder),
            "files": [{**local_file_identity(p), "path": p.relative_to(folder).as_posix()} for p in files]}


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """What about a tokenizer changes token counts (a local folder's files too: an edit keeps name and size)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):  # some tokenizers keep a dict of named templates
        template = json.dumps(template, sort_keys=True, default=str)
    name = str(getattr(tokenizer, "name_or_path", ""))
    folder = Path(name) if name and Path(name).is_dir() else None  # its own files: a model's weights are not
    return {
        "name_or_path": name,
        "vocab_size": getattr(tokenizer, "vocab_size", None),
        "special_tokens": sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", [])),
        "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
        "files": folder and [{**local_file_identity(p), "path": p.name} for p in sorted(folder.iterdir())
                             if p.is_file() and p.suffix not in WEIGHT_SUFFIXES],
    }


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")


def model_identity(model_name_or_path: str, model_source: str = "hf") -> dict[str, Any]:
    """The identity of a model's weights: a local or built-in folder with its files, else the hub id and source."""
    path = Path(resolve_model_path(model_name_or_path)).expanduser()
    if path.is_dir():
        return {"name": model_name_or_path, **local_tree_identity(path)}
    return {"name": model_name_or_path, "source": model_source}


def fingerprint(source: dict[str, Any], tokenizer: dict[str, Any], data_fields: dict[str, Any]) -> str:
    """`state_key` of the three identities, DATA_FORMAT_VERSION, pipeline/data/*.py and the library versions that
    build an entry (one saved by another pyarrow or datasets may not load the same).

    >>> fingerprint({"kind": "sample"}, {}, {"max_samples": None}) == fingerprint({"kind": "sample"}, {}, {})
    False
    """
    code = {"code_sha256": code_hash(grpo_pipeline.pipeline.data),
            "versions": versions("datasets", "pyarrow", "transformers", "tokenizers", "jinja2")}
    return state_key({"version": DATA_FORMAT_VERSION, "source": source, "tokenizer": tokenizer, "data": data_fields,
                      "code": code})


def entry_is_complete(entry: Path) -> bool:
    """True when a cache entry has both its dataset and its report."""
    return (entry / REPORT_IN_CACHE).is_file() and (entry / DATASET_IN_CACHE).is_dir()


def load_cached(entry: Path) -> Optional[tuple[Any, dict[str, Any]]]:
    """(dataset, report) from a complete cache entry, or None when there is none."""
    if not entry_is_complete(entry):
        return None
    from datasets import load_from_disk  # lazy: datasets imports torch

    return load_from_disk(str(entry / DATASET_IN_CACHE)), json.loads((entry / REPORT_IN_CACHE).read_text("utf-8"))


def save_cached(entry: Path, dataset: Any, report: dict[str, Any], seen=None) -> None:
    """Publish the dataset and its report in one rename (grpo_pipeline.env.paths.publish_once: a crash leaves no
    complete-looking entry; of two racing runs the first wins). `seen`: what was at `entry` before the build."""
    def write(staging: Path) -> None:
        dataset.save_to_disk(str(staging / DATASET_IN_CACHE))
        (staging / REPORT_IN_CACHE).write_text(json_text(masked(report)), encoding="utf-8")  # any file name in it

    publish_once(entry, write, is_complete=entry_is_complete, option="data_cache_dir", seen=seen)
