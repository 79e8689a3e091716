"""A model's shape for the memory planner: its config.json (a local folder, the hub cache, or the bundled Qwen2.5
configs, so `grpo plan` works offline), and its real architecture's parameter counts, built on the meta device and
cached by the config's content (the bundled configs' ship beside them).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from huggingface_hub import try_to_load_from_cache

from grpo_pipeline.env.disk import StorageError
from grpo_pipeline.env.paths import atomic_write_text
from grpo_pipeline.env.locations import cache_root
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.demo.registry import builtin_model

BUNDLED_CONFIGS = Path(__file__).resolve().parent.parent / "assets" / "model-configs"
COUNT_CACHE_VERSION = 2
SEEDED_COUNTS = BUNDLED_CONFIGS / "param-counts.json"  # config key -> ParamCounts of each bundled config


# The Qwen2.5 sizes the planner knows offline, smallest first, for the "a smaller model" suggestion.
QWEN25_SIZES = ("0.5B", "1.5B", "3B", "7B")
# Qwen2.5 chat/base models of a bundled size (Qwen/..., unsloth/...-Instruct, ...-bnb-4bit); not Coder/Math/VL.
QWEN25_NAME = re.compile(r"(?i)(qwen2\.5-)(0\.5|1\.5|3|7)b(?!-?(coder|math|vl))")


def bundled_config_name(model: str) -> str | None:
    """The bundled config (pipeline/assets/model-configs) for a Qwen2.5 name of any spelling.

    >>> bundled_config_name("unsloth/Qwen2.5-1.5B-Instruct"), bundled_config_name("Qwen/Qwen2.5-Math-7B")
    ('qwen2.5-1.5b', None)
    """
    match = QWEN25_NAME.search(model)
    return f"qwen2.5-{match.group(2)}b" if match else None


def smaller_models(model: str) -> list[str]:
    """The same Qwen2.5 name at each smaller size, nearest first.

    >>> smaller_models("unsloth/Qwen2.5-3B-Instruct")
    ['unsloth/Qwen2.5-1.5B-Instruct', 'unsloth/Qwen2.5-0.5B-Instruct']
    """
    match = QWEN25_NAME.search(model)
    if not match:
        return []
    index = [s.lower() for s in QWEN25_SIZES].index(match.group(2).lower() + "b")
    return [model[:match.start(2)] + QWEN25_SIZES[i] + model[match.end():] for i in range(index - 1, -1, -1)]


@dataclass(frozen=True)
class ModelShape:
    """What the memory formulas need from config.json, plus where it was read."""

    name: str
    source: str  # "local folder /x", "Hugging Face cache", "bundled (pipeline/assets/model-configs/...)"
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    config: dict  # the whole config.json, for building the architecture

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache per token in 16-bit: layers x kv_heads x head_dim x 2 (K and V) x 2 bytes."""
        return self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 2 * 2


def shape_from_config(model_config: dict, name: str, source: str) -> ModelShape:
    text = model_config.get("text_config") or model_config
    try:
        heads = int(text["num_attention_heads"])
        hidden = int(text["hidden_size"])
        return ModelShape(
            name=name, source=source, hidden_size=hidden, intermediate_size=int(text["intermediate_size"]),
            num_hidden_layers=int(text["num_hidden_layers"]), num_attention_heads=heads,
            num_key_value_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or hidden // heads), vocab_size=int(text["vocab_size"]),
            tie_word_embeddings=bool(model_config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            config=dict(model_config),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError("model_name_or_path", f"{source}: config.json lacks or mangles {err}, which the memory "
                          "plan needs (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
                          "vocab_size). Point model_name_or_path at a decoder-only transformers model.") from None


def load_shape(model: str) -> ModelShape:
    """The shape of `model`: a local folder, then the hub cache, then a bundled Qwen2.5 config."""
    path = Path(model).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ConfigError("model_name_or_path", f"{path.resolve()} has no config.json; point at the folder "
                              "that holds it.")
        return shape_from_config(_read_json(config_file), model, f"local folder {path.resolve()}")
    try:
        cached = try_to_load_from_cache(model, "config.json")
    except ValueError:  # huggingface_hub's HFValidationError: not a repo id (e.g. a folder path that is not there)
        cached = None
    if isinstance(cached, str):
        return shape_from_config(_read_json(Path(cached)), model, f"Hugging Face cache ({cached})")
    bundled, builtin = bundled_config_name(model), builtin_model(model)
    file = BUNDLED_CONFIGS / f"{bundled}.json" if bundled else builtin and builtin.plan_config
    if file:
        return shape_from_config(_read_json(file), model, f"bundled config pipeline/assets/model-configs/{file.name}")
    if builtin is not None:
        raise ConfigError("model_name_or_path", f"{model!r} is a built-in CPU model; the memory plan is for GPU "
                          "recipes. Plan a Qwen2.5 recipe, e.g. --config configs/qwen2.5-1.5b-gsm8k.yaml.")
    raise ConfigError("model_name_or_path", f"no config.json for {model!r}: it is not a local folder, not in the "
                      "Hugging Face cache, and not one of the bundled Qwen2.5 0.5B/1.5B/3B/7B configs. Fetch only its "
                      f"config (`huggingface-cli download {model} config.json`) or pass a local model folder.")


def _read_json(file: Path) -> dict:
    try:
        loaded = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError("model_name_or_path", f"{file}: not a readable JSON config ({err}).") from None
    if not isinstance(loaded, dict):
        raise ConfigError("model_name_or_path", f"{file}: config.json must be a JSON object.")
    return loaded


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of the real architecture, grouped as the memory formulas need them."""

    total: int  # unique parameters (a tied lm_head counted once)
    embed: int  # input embeddings
    lm_head: int  # 0 when tied to the embeddings
    quantizable: int  # decoder nn.Linear weights: what bitsandbytes turns into NF4
    # nn.Linear short name (q_proj, ..., lm_head) -> [in_features, out_features, how many]: what LoRA can adapt
    linears: dict[str, list[int]]
    # module short name -> parameters in all modules of that name (for lora_modules_to_save)
    by_module: dict[str, int]

    @property
    def sixteen_bit(self) -> int:
        """What stays 16-bit under 4-bit loading: embeddings, lm_head, norms, biases."""
        return self.total - self.quantizable


def count_parameters(shape: ModelShape, cache_dir: Optional[Path] = None, use_seeds: bool = True) -> ParamCounts:
    """The counts: cached (<cache root>/plan), shipped (SEEDED_COUNTS), else built on the meta device and cached."""
    key = hashlib.sha256(json.dumps({"v": COUNT_CACHE_VERSION, "config": shape.config}, sort_keys=True,
                                    default=str).encode()).hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir is not None else cache_root() / "plan"
    file = folder / f"params-{key}.json"
    for source in (file, SEEDED_COUNTS if use_seeds else None):
        try:
            loaded = json.loads(source.read_text()) if source else None
            return ParamCounts(**(loaded.get(key) if source == SEEDED_COUNTS and isinstance(loaded, dict) else loaded))
        except (OSError, ValueError, TypeError):
            continue
    counts = _count_on_meta(shape.config)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(file, json.dumps(counts.__dict__))
    except (OSError, StorageError):
        pass  # a read-only or full cache only costs the next run the count again
    return counts


def _count_on_meta(model_config: dict) -> ParamCounts:
    # lazy: torch, accelerate and transformers, only to count a model's parameters
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(model_config)
    model_type = cfg.pop("model_type", None)
    if model_type is None:
        raise ConfigError("model_name_or_path", "config.json has no model_type; the architecture cannot be built.")
    try:
        hf_config = AutoConfig.for_model(model_type, **cfg)
    except (ValueError, KeyError) as err:
        raise ConfigError("model_name_or_path", f"transformers does not know model_type {model_type!r} ({err}).") \
            from None
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(hf_config)
    model.tie_weights()  # from_config on meta leaves a tied lm_head untied until asked
    embed_module = model.get_input_embeddings()
    head_module = model.get_output_embeddings()
    embed = embed_module.weight.numel()
    tied = head_module is not None and head_module.weight is embed_module.weight
    lm_head = 0 if (head_module is None or tied) else head_module.weight.numel()
    quantizable = 0
    linears: dict[str, list[int]] = {}
    by_module: dict[str, int] = {}
    for name, module in model.named_modules():
        short = name.rsplit(".", 1)[-1]
        if short:
            by_module[short] = by_module.get(short, 0) + sum(p.numel() for p in module.parameters(recurse=True))
        if isinstance(module, torch.nn.Linear):
            if module is not head_module:  # bitsandbytes leaves lm_head in 16-bit
                quantizable += module.weight.numel()
            row = linears.setdefault(short, [module.in_features, module.out_features, 0])
            row[2] += 1
    total = sum(p.numel() for p in model.parameters())
    return ParamCounts(total=total, embed=embed, lm_head=lm_head, quantizable=quantizable, linears=linears,
                       by_module=by_module)
