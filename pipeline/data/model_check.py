"""Can the model named be found before anything loads? Callers call `model_check.check_model` through the module,
so a test replaces the one network boundary in one place.
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import try_to_load_from_cache

from grpo_pipeline.env.hubs import HubSourceError, reachable, require_modelscope
from grpo_pipeline.env.hubs import endpoint as hub_endpoint
from grpo_pipeline.env.path_check import local_model
from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.config.paths import config_paths
from grpo_pipeline.pipeline.demo.gguf_model import check_gguf_file, is_gguf_file
from grpo_pipeline.pipeline.demo.registry import builtin_model


def check_model_source(source: str) -> str:
    """`model_source: modelscope` without the modelscope package is refused, with the install command."""
    if source == "modelscope":
        try:
            require_modelscope()
        except HubSourceError as err:
            raise ConfigError("model_source", str(err)) from None
    return f"model_source: {source}"


def check_model(name: str, source: str = "hf") -> str:
    """A built-in name, a local model folder or GGUF file, a hub id in the local cache, or a hub id we can reach."""
    builtin = builtin_model(name)
    if builtin is not None:
        if builtin.gguf is not None:
            return (f"{name}: built in (real weights, {builtin.gguf.general_name}; fetched from the package registry "
                    "and converted on first use, then cached)")
        return f"{name}: built in"
    if is_gguf_file(name):
        info = check_gguf_file(name)
        return (f"{Path(name).expanduser().resolve()}: GGUF file ({info.general_name or 'unnamed'}, "
                f"{info.architecture}; converted once into the cache)")
    if local_model(name):
        config_paths({"model_name_or_path": name}, "model_name_or_path")  # unset $VARS, loops, unreadable
    path = Path(name).expanduser()
    looks_local = path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
    if path.exists() or looks_local:
        if not path.is_dir():
            raise ConfigError("model_name_or_path", f"{path.resolve()} is not a model folder (it does not exist "
                              "or is a file). Give a folder with config.json and the weights, or a hub id such "
                              "as unsloth/Qwen2.5-1.5B-Instruct.")
        if not (path / "config.json").is_file():
            raise ConfigError("model_name_or_path", f"{path.resolve()} has no config.json, so it is not a "
                              "transformers model folder. Point at the folder that holds config.json.")
        return f"{path.resolve()}: local folder"
    if source == "modelscope":
        check_model_source(source)
        address = hub_endpoint(source)
        if not reachable(address):
            raise ConfigError("model_name_or_path", f"model {excerpt(name)} is to come from ModelScope, but {address} "
                              "cannot be reached. Fixes: check the network (on AutoDL: `source /etc/network_turbo`), "
                              "set model_name_or_path to a local model folder, or set model_source: hf.")
        return f"{name}: from ModelScope ({address}; cached in MODELSCOPE_CACHE after the first download)"
    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return f"{name}: in the Hugging Face cache"
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    endpoint = hub_endpoint("hf")
    if offline or not reachable(endpoint, timeout=3.0):
        why = "HF_HUB_OFFLINE is set" if offline else f"{endpoint} cannot be reached"
        raise ConfigError("model_name_or_path", f"model {excerpt(name)} is not in the local Hugging Face cache and "
                          f"{why}. Fixes: download it where there is network (`huggingface-cli download {name}`, "
                          "then copy ~/.cache/huggingface over) or set model_name_or_path to a local model folder; "
                          "in mainland China set HF_ENDPOINT=https://hf-mirror.com.")
    return f"{name}: will be downloaded from {endpoint}"
