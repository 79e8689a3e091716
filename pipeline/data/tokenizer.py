"""Resolve model names to folders and load tokenizers, without loading any model.

Built-in names (`tiny-demo`, `tiny-qwen2.5`, `bundled:qwen2.5`) let tests, demos and benchmarks run
offline; pipeline/demo/registry.py lists them and says how each is built.
"""

from __future__ import annotations

from pipeline.demo.registry import builtin_model


def resolve_model_path(model_name_or_path: str) -> str:
    """Return what `from_pretrained` should load: a built-in model's folder, or the name unchanged."""
    builtin = builtin_model(model_name_or_path)
    if builtin is not None and builtin.folder is not None:
        return str(builtin.folder())
    return model_name_or_path


def load_tokenizer(model_name_or_path: str, trust_remote_code: bool = False):
    """Return the tokenizer for `model_name_or_path`, padded on the left as GRPO generation needs."""
    builtin = builtin_model(model_name_or_path)
    if builtin is not None and builtin.tokenizer is not None:
        tokenizer = builtin.tokenizer()
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model_path(model_name_or_path), trust_remote_code=trust_remote_code
        )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
