"""Resolve model names to folders and load tokenizers, without loading any model.

Built-in names (`tiny-demo`, `tiny-qwen2.5`, `bundled:qwen2.5`) let tests, demos and benchmarks run
offline; pipeline/demo/registry.py lists them and says how each is built.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.demo.registry import builtin_model


def resolve_model_path(model_name_or_path: str, source: str = "hf") -> str:
    """Return what `from_pretrained` should load: a built-in model's folder; with `source="modelscope"` a hub id's
    ModelScope download (a local folder, so transformers never asks the Hugging Face Hub); else the name unchanged.
    The one place a model name becomes something to load, for every backend, the tokenizer and the config."""
    builtin = builtin_model(model_name_or_path)
    if builtin is not None and builtin.folder is not None:
        return str(builtin.folder())
    if source == "modelscope" and not Path(model_name_or_path).expanduser().exists():
        from env.hubs import download_model

        return download_model(model_name_or_path)
    return model_name_or_path


def load_tokenizer(model_name_or_path: str, trust_remote_code: bool = False, source: str = "hf"):
    """Return the tokenizer for `model_name_or_path`, padded on the left as GRPO generation needs."""
    builtin = builtin_model(model_name_or_path)
    if builtin is not None and builtin.tokenizer is not None:
        tokenizer = builtin.tokenizer()
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model_path(model_name_or_path, source), trust_remote_code=trust_remote_code
        )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
