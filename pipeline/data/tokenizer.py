"""Resolve model names to folders and load tokenizers, without loading any model (built-in names:
pipeline/demo/registry.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from tokenizers import Tokenizer

from grpo_pipeline.env.hubs import download_model
from grpo_pipeline.env.text import shorten
from grpo_pipeline.pipeline.assets import read_tokenizer
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig
from grpo_pipeline.pipeline.demo.gguf_model import gguf_model_dir, is_gguf_file
from grpo_pipeline.pipeline.demo.registry import builtin_model


def resolve_model_path(model_name_or_path: str, source: str = "hf") -> str:
    """What `from_pretrained` should load: a built-in model's folder, a `.gguf` file's converted folder, a hub id's
    ModelScope download (`source="modelscope"`: transformers never asks the Hugging Face Hub), else the name."""
    builtin = builtin_model(model_name_or_path)
    if builtin is not None and builtin.folder is not None:
        return str(builtin.folder())
    if is_gguf_file(model_name_or_path):
        return str(gguf_model_dir(model_name_or_path))
    if source == "modelscope" and not Path(model_name_or_path).expanduser().exists():
        return download_model(model_name_or_path)
    return model_name_or_path


# The files AutoTokenizer reads from a model folder (transformers' tokenization_utils_base and the fast tokenizer).
TOKENIZER_JSON_FILES = ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "added_tokens.json",
                        "vocab.json", "config.json")


def broken_tokenizer_file(folder: Path) -> Optional[str]:
    """What is wrong with a model folder's tokenizer files, naming the file and line (transformers' JSONDecodeError
    and tokenizers' bare Exception name neither), or None."""
    for name in TOKENIZER_JSON_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as err:
            return f"{path} is not UTF-8 text ({err.reason} at byte {err.start})"
        except json.JSONDecodeError as err:
            return f"{path} line {err.lineno}, column {err.colno} is not valid JSON ({err.msg})"
    if (folder / "tokenizer.json").is_file():
        try:
            Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as err:  # noqa: BLE001 - tokenizers raises a plain Exception
            return (f"{folder / 'tokenizer.json'} is not a tokenizer the tokenizers library can read "
                    f"({shorten(str(err))})")
    return None


def load_tokenizer(model_name_or_path: str, trust_remote_code: bool = False, source: str = "hf"):
    """Return the tokenizer for `model_name_or_path`, padded on the left as GRPO generation needs."""
    builtin = builtin_model(model_name_or_path)
    if builtin is not None and builtin.tokenizer is not None:
        tokenizer = builtin.tokenizer()
    else:
        # The path first: a built-in real model's fetch that fails (offline) says so before transformers' import.
        path = resolve_model_path(model_name_or_path, source)
        try:
            tokenizer = read_tokenizer(path, trust_remote_code=trust_remote_code)
        except Exception as err:  # noqa: BLE001 - a local folder's broken file is named; anything else re-raised
            broken = broken_tokenizer_file(Path(path).expanduser()) if Path(path).expanduser().is_dir() else None
            if broken is None:
                raise
            raise ConfigError("model_name_or_path", f"{broken}. Restore that file from the model's original copy "
                              "(or download the model again).") from err
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def run_tokenizer(adapter: Optional[Any], base_model: str, cfg: PipelineConfig) -> Any:
    """The tokenizer a saved adapter generates with: its folder's, with trust_remote_code off (never a folder's code),
    else the base model's."""
    if adapter is not None and (adapter.path / "tokenizer_config.json").is_file():
        return load_tokenizer(str(adapter.path), False, "hf")
    return load_tokenizer(base_model, cfg.model.trust_remote_code, cfg.model.model_source)
