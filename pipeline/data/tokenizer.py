"""Resolve model names to folders and load tokenizers, without loading any model.

Built-in names let tests, demos and benchmarks run offline:
  tiny-demo        the CPU demo: a tiny Qwen2 with a character-level ChatML tokenizer
  tiny-qwen2.5     a tiny random Qwen2 with the real Qwen2.5 tokenizer (for tests of the real vocabulary)
  bundled:qwen2.5  the real Qwen2.5 tokenizer only (for `grpo data` and benches; no model)
"""

from __future__ import annotations

DEMO_MODEL_NAME = "tiny-demo"
TINY_QWEN_MODEL_NAME = "tiny-qwen2.5"
BUNDLED_QWEN_NAME = "bundled:qwen2.5"


def resolve_model_path(model_name_or_path: str) -> str:
    """Return what `from_pretrained` should load: a built-in model's folder, or the name unchanged."""
    if model_name_or_path == DEMO_MODEL_NAME:
        from pipeline.demo.task import demo_model_dir

        return str(demo_model_dir())
    if model_name_or_path == TINY_QWEN_MODEL_NAME:
        from pipeline.demo.task import tiny_qwen_model_dir

        return str(tiny_qwen_model_dir())
    return model_name_or_path


def load_tokenizer(model_name_or_path: str, trust_remote_code: bool = False):
    """Return the tokenizer for `model_name_or_path`, padded on the left as GRPO generation needs."""
    if model_name_or_path == BUNDLED_QWEN_NAME:
        from pipeline.assets import load_qwen_tokenizer

        tokenizer = load_qwen_tokenizer()
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model_path(model_name_or_path), trust_remote_code=trust_remote_code
        )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
