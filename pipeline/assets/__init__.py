"""Files the project ships: the real Qwen2.5 tokenizer (with Qwen2.5-Instruct's chat template, tools included), for
tests, benchmarks and `grpo data` offline. Its tokenizer.json (11 MB) is committed xz-compressed (1.4 MB) and unpacked
once into the cache: a folder of only vocab.json + merges.txt does not load through AutoTokenizer.
"""

from __future__ import annotations

import hashlib
import lzma
import shutil
from pathlib import Path

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
    from transformers import AutoTokenizer  # lazy: imports torch

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
