"""Files the project ships: the real Qwen2.5 tokenizer (with Qwen2.5-Instruct's chat template, tools included), for
tests, benchmarks and `grpo data` offline. Its tokenizer.json (11 MB) is committed xz-compressed (1.4 MB) and unpacked
once into the cache: a folder of only vocab.json + merges.txt does not load through AutoTokenizer. Every tokenizer
folder is read through `read_tokenizer`: once per process while its files stay the same.
"""

from __future__ import annotations

import copy
import hashlib
import lzma
import os
import shutil
from pathlib import Path
from typing import Any

from grpo_pipeline.env.paths import publish_once
from grpo_pipeline.env.locations import cache_root

ASSETS_DIR = Path(__file__).resolve().parent
QWEN_TOKENIZER_SRC = ASSETS_DIR / "qwen2.5-tokenizer"
# sha256 of the uncompressed tokenizer.json, checked after unpacking.
QWEN_TOKENIZER_JSON_SHA256 = "6588e6818d742ba76d711e504638dcc1ce3873c0cce8943a9cd8a83e4f760f32"
# The unpacked copy's folder, keyed by the chat template too: a copy unpacked before it changed would keep the old one.
_TEMPLATE_SHA256 = hashlib.sha256((QWEN_TOKENIZER_SRC / "chat_template.jinja").read_bytes()).hexdigest()
QWEN_TOKENIZER_CACHE_NAME = f"qwen2.5-tokenizer-{QWEN_TOKENIZER_JSON_SHA256[:12]}-{_TEMPLATE_SHA256[:8]}"


def qwen_tokenizer_dir() -> Path:
    """A folder `AutoTokenizer.from_pretrained` loads as the real Qwen2.5 tokenizer, unpacked into the cache once."""
    target = cache_root() / QWEN_TOKENIZER_CACHE_NAME
    is_unpacked = lambda folder: (folder / "tokenizer.json").is_file()  # noqa: E731 - written before publishing
    data = None if is_unpacked(target) else lzma.decompress((QWEN_TOKENIZER_SRC / "tokenizer.json.xz").read_bytes())
    if data is not None and hashlib.sha256(data).hexdigest() != QWEN_TOKENIZER_JSON_SHA256:
        raise RuntimeError(f"bundled tokenizer.json.xz in {QWEN_TOKENIZER_SRC} is corrupt (sha256 mismatch)")

    def unpack(tmp: Path) -> None:
        (tmp / "tokenizer.json").write_bytes(data)
        for name in ("tokenizer_config.json", "chat_template.jinja"):
            shutil.copy2(QWEN_TOKENIZER_SRC / name, tmp / name)

    return publish_once(target, unpack, is_complete=is_unpacked)


def load_qwen_tokenizer():
    """Load the bundled real Qwen2.5 tokenizer (offline).

    >>> tok = load_qwen_tokenizer()
    >>> tok.encode("你好, world")
    [108386, 11, 1879]
    """
    return read_tokenizer(qwen_tokenizer_dir())


# Tokenizers read in this process, by folder and its files' (name, size, mtime): each read once, kept unchanged, and
# copied for every call.
_READ: dict[tuple, Any] = {}
# transformers 5's tables of a fast tokenizer (str -> int, and (str, str) pairs): immutable entries, so a copy of the
# table is a deep copy of it (copy.deepcopy walks 150k entries one by one: 0.3 s of a 0.6 s copy).
_FLAT_TABLES = ("_vocab", "_merges")


def read_tokenizer(folder: str | os.PathLike[str], trust_remote_code: bool = False) -> Any:
    """`AutoTokenizer.from_pretrained(folder)`, read from disk once per process while the folder's files stay the same
    (names, sizes and mtimes): that read is kept unchanged, and every call gets its own copy of it, which it may
    change. Reading Qwen2.5's 151k-token tokenizer takes ~1.2 s (transformers parses tokenizer.json three times); a
    copy ~5 ms: it shares the kept read's BPE model (`_backend_copy`, checked once per kept read: ~0.1 s), where a
    deep copy rebuilt it (0.6 s). So a command that reads its tokenizer more than once (`grpo train`: the check, then
    the model; `grpo eval`: its data, then the generator) reads it from disk once, and a notebook or a test process
    once per folder. A hub id (not a folder) and a folder's own tokenizer code (trust_remote_code) are read every time.

    >>> a, b, c = load_qwen_tokenizer(), load_qwen_tokenizer(), load_qwen_tokenizer()
    >>> b.padding_side = "left"; _ = b.add_special_tokens({"additional_special_tokens": ["<mine>"]})
    >>> (len(a), len(b), len(c), c.padding_side, load_qwen_tokenizer().padding_side)
    (151665, 151666, 151665, 'right', 'right')
    """
    from transformers import AutoTokenizer  # lazy: imports torch

    path = Path(folder).expanduser()
    if trust_remote_code or not path.is_dir():
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    files = [(entry.name, entry.stat()) for entry in os.scandir(path) if entry.is_file()]
    key = (str(path.resolve()), tuple(sorted((name, stat.st_size, stat.st_mtime_ns) for name, stat in files)))
    if key not in _READ:
        _READ[key] = AutoTokenizer.from_pretrained(str(folder))  # a folder that does not read is not kept
    original = _READ[key]
    tables = (getattr(original, "__dict__", {}).get(name) for name in _FLAT_TABLES)
    memo = {id(table): type(table)(table) for table in tables if isinstance(table, (dict, list))}
    backend = getattr(original, "__dict__", {}).get("_tokenizer")
    shared = _backend_copy(backend) if backend is not None else None
    if shared is not None:
        memo[id(backend)] = shared
    try:
        return copy.deepcopy(original, memo)
    except Exception:  # noqa: BLE001 - a tokenizer class that cannot be copied is read again
        return AutoTokenizer.from_pretrained(str(folder))


# The BPE model's settings (tokenizers' `models.BPE` attributes): a copy shares the model only while the kept read's
# are as they were when its copy was checked.
_MODEL_SETTINGS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                   "byte_fallback", "ignore_merges")
# id(kept backend) -> (the backend, its model's settings when a rebuilt copy serialised exactly as it did, or None)
_CHECKED: dict[int, tuple[Any, Any]] = {}


def _settings(model: Any) -> tuple:
    return (type(model).__name__, *(getattr(model, name, None) for name in _MODEL_SETTINGS))


def _rebuilt(backend: Any) -> Any:
    """A `tokenizers.Tokenizer` on `backend`'s own model object (shared, not copied), with its own normalizer,
    pre-tokenizer, post-processor and decoder settings, its added tokens (in id order: the same ids), padding,
    truncation and special-token encoding."""
    from tokenizers import Tokenizer  # lazy: tokenizers comes with transformers

    new = Tokenizer(backend.model)
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        value = getattr(backend, part)
        if value is not None:
            setattr(new, part, value)
    new.add_tokens([token for _, token in sorted(backend.get_added_tokens_decoder().items())])
    if backend.padding:
        new.enable_padding(**backend.padding)
    if backend.truncation:
        new.enable_truncation(**backend.truncation)
    new.encode_special_tokens = backend.encode_special_tokens
    return new


def _backend_copy(backend: Any) -> Any:
    """A copy of the kept read's `tokenizers` object in a few ms instead of the ~0.6 s of rebuilding its BPE model (a
    deep copy serialises and parses all of it): the copy shares the model, its vocabulary and merges, which no call
    of transformers, TRL or peft changes (added and special tokens, templates, padding and truncation live outside
    it, and are the copy's own). Checked once per kept read: the rebuilt copy must serialise exactly as the original
    (~0.1 s for Qwen2.5); None (a deep copy) when it does not, or when the model's settings changed since (someone set
    them on a copy, so that copies stop sharing from then on)."""
    try:
        copied = _rebuilt(backend)
        if id(backend) not in _CHECKED:
            exact = copied.to_str() == backend.to_str()
            _CHECKED[id(backend)] = (backend, _settings(backend.model) if exact else None)
        kept, settings = _CHECKED[id(backend)]
        if kept is not backend or settings is None or _settings(backend.model) != settings:
            return None
        return copied
    except Exception:  # noqa: BLE001 - a backend this cannot rebuild is deep-copied as before
        return None
