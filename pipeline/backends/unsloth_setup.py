"""Unsloth process set-up (`prepare_environment`, before trl, transformers or peft are imported) and the one
FastLanguageModel.from_pretrained call, shared by training, generation and export."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Optional

from grpo_pipeline.env.hubs import HubSourceError, require_modelscope
from grpo_pipeline.env.imports import import_order_problems
from grpo_pipeline.env.locations import absolute_path, cache_root
from grpo_pipeline.env.paths import atomic_write_json
from grpo_pipeline.pipeline.backends.gpu_settings import resolve_gpu_memory_utilization, standby_enabled
from grpo_pipeline.pipeline.backends.vllm_engine import slot_rank
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig
from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path
from grpo_pipeline.pipeline.run.manifest import other_base

STANDBY_ENV = "UNSLOTH_VLLM_STANDBY"
MODELSCOPE_ENV = "UNSLOTH_USE_MODELSCOPE"
# unsloth_zoo/compiler.py reads it at import; its default, "unsloth_compiled_cache", is relative to the cwd.
COMPILE_LOCATION_ENV = "UNSLOTH_COMPILE_LOCATION"


_prepared: Optional[SimpleNamespace] = None  # .standby, as unsloth was imported with it


def prepare_environment(cfg: PipelineConfig) -> SimpleNamespace:
    """Set Unsloth's environment, then `import unsloth` (idempotent); standby is read at import (unsloth_zoo/
    __init__.py, vllm_utils.patch_vllm). trl/transformers/peft imported first is a warning, as Unsloth's own."""
    global _prepared
    standby = standby_enabled(cfg)
    if _prepared is not None and "unsloth" in sys.modules:
        if _prepared.standby != standby:
            raise RuntimeError(
                f"vllm_standby changed from {_prepared.standby} to {standby} after unsloth was imported; "
                "standby is fixed at import time. Run each configuration in a fresh process."
            )
        return _prepared

    current = os.environ.get(STANDBY_ENV, "0")
    if standby:
        if "unsloth" in sys.modules and current == "0":
            # Setting it now would only get past llama.py's check into a half-configured engine.
            raise RuntimeError(
                "vllm_standby is on, but unsloth was imported before UNSLOTH_VLLM_STANDBY=1 was set. "
                "Restart the process (in a notebook: restart the kernel) and let the pipeline import unsloth, "
                "or set os.environ['UNSLOTH_VLLM_STANDBY'] = '1' before `import unsloth`, or use vllm_standby: false."
            )
        os.environ[STANDBY_ENV] = "1"
    elif current != "0":
        # An exported variable would silently turn standby on (load_vllm ORs it in).
        if "unsloth" in sys.modules:
            raise RuntimeError(
                f"vllm_standby is false, but unsloth was already imported with {STANDBY_ENV}={current}. "
                "Restart the process without that variable, or set vllm_standby: true."
            )
        why = "vllm_standby is false" if cfg.model.fast_inference else "fast_inference: false runs without vLLM"
        warnings.warn(f"{STANDBY_ENV}={current} is set in the environment but {why}; "
                      f"setting {STANDBY_ENV}=0 for this run.", stacklevel=2)
        os.environ[STANDBY_ENV] = "0"

    _set_modelscope_env(cfg.model.model_source)
    if "unsloth" not in sys.modules and not os.environ.get(COMPILE_LOCATION_ENV):
        os.environ[COMPILE_LOCATION_ENV] = str(cache_root().resolve() / "unsloth_compiled_cache")
    problems = [] if "unsloth" in sys.modules else [str(problem) for problem in import_order_problems()]
    if problems:
        warnings.warn(
            "Unsloth must be imported before " + ", ".join(problems) + ", which are already imported, so some of "
            "its patches (speed, memory) will not apply. Fix: call grpo_pipeline.pipeline.backends.unsloth.prepare_environment("
            "cfg) (cfg: the recipe's PipelineConfig; or `import unsloth`) before anything imports "
            "trl, transformers or peft; in a notebook, restart the kernel and run it in the first cell.",
            stacklevel=2,
        )
    import unsloth  # noqa: F401  (the import is the point: it patches trl/transformers/peft)

    _prepared = SimpleNamespace(standby=standby)
    return _prepared


def _set_modelscope_env(model_source: str) -> None:
    """UNSLOTH_USE_MODELSCOPE per `model_source`, read at import (unsloth/models/_utils.py): a later change refused."""
    wanted = "1" if model_source == "modelscope" else "0"
    if os.environ.get(MODELSCOPE_ENV, "0") == wanted:
        return
    if "unsloth" in sys.modules:
        raise RuntimeError(f"model_source is {model_source}, but unsloth was already imported with "
                           f"{MODELSCOPE_ENV}={os.environ.get(MODELSCOPE_ENV, '0')}; Unsloth reads it at import. "
                           "Restart the process (in a notebook: restart the kernel).")
    if wanted == "1":
        try:
            require_modelscope()
        except HubSourceError as err:
            raise ConfigError("model_source", str(err)) from None
    os.environ[MODELSCOPE_ENV] = wanted


def gradient_checkpointing_mode(gradient_checkpointing: bool):
    # "unsloth": offloaded checkpointing (plain below 512 tokens: apply_unsloth_gradient_checkpointing)
    return "unsloth" if gradient_checkpointing else False


def from_pretrained(cfg: PipelineConfig, model_name: str, *, fast_inference: bool,
                    load_in_4bit: Optional[bool] = None) -> tuple[Any, Any]:
    """(model, tokenizer) from FastLanguageModel.from_pretrained (unsloth/models/loader.py) of a name or folder."""
    standby = prepare_environment(cfg).standby
    import torch
    from unsloth import FastLanguageModel

    kwargs: dict[str, Any] = {
        # A built-in model's folder, else the name as given, with modelscope too (source "hf"): unsloth/models/
        # loader.py maps and downloads only `if USE_MODELSCOPE and not os.path.exists(model_name)`.
        "model_name": resolve_model_path(model_name),
        "max_seq_length": cfg.model.max_seq_length,
        "load_in_4bit": cfg.model.load_in_4bit if load_in_4bit is None else load_in_4bit,
        "fast_inference": fast_inference,
        # auto: None (Unsloth picks); a torch dtype, not the string: from_pretrained converts only float16/bfloat16
        "dtype": None if cfg.model.dtype == "auto" else getattr(torch, cfg.model.dtype),
        "random_state": cfg.grpo.seed,
        "use_gradient_checkpointing": gradient_checkpointing_mode(cfg.lora.gradient_checkpointing),
        "trust_remote_code": cfg.model.trust_remote_code,
    }
    if fast_inference:
        kwargs.update(max_lora_rank=slot_rank(cfg.model.max_lora_rank),
                      gpu_memory_utilization=resolve_gpu_memory_utilization(cfg, standby=standby),
                      float8_kv_cache=cfg.model.float8_kv_cache)
        if standby:  # on to load_vllm in **kwargs (which also reads the environment variable): explicit
            kwargs["unsloth_vllm_standby"] = True
    return FastLanguageModel.from_pretrained(**kwargs)


LIVE_LORA_SUBDIR = ".vllm_live_lora"


def serves_with_vllm(model: Any, fast_inference: bool) -> bool:
    """Whether the model carries a `vllm_engine` (Unsloth switches vLLM off itself: unsloth/models/loader.py,
    _utils.py fast_inference_setup); warned once when it differs from the config."""
    engine = hasattr(model, "vllm_engine")
    if fast_inference and not engine and not getattr(model, "_grpo_said_no_vllm", False):
        warnings.warn("fast_inference: true, but Unsloth returned the model without a vLLM engine (it turns vLLM "
                      "off itself on GPUs below compute capability 7, on DGX Spark, or when vllm does not import; "
                      "its log above says which): rollouts and eval generate with transformers instead (slower). "
                      "Set fast_inference: false to say so in the config.", stacklevel=2)
        with contextlib.suppress(AttributeError):
            model._grpo_said_no_vllm = True
    return engine


@contextlib.contextmanager
def unsloth_adapter_folder(adapter: Any) -> Iterator[str]:
    """The adapter folder for FastLanguageModel.from_pretrained, which loads the base its adapter_config.json names;
    for a built-in base (recorded by name) a temporary view of the folder naming the built-in model's folder."""
    path = absolute_path(adapter.path)
    recorded = adapter.base_model_name_or_path
    loadable = resolve_model_path(recorded) if recorded else recorded
    if loadable == recorded:
        yield str(path)
        return
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".adapter-view-", dir=root) as tmp:
        view = Path(tmp) / path.name
        view.mkdir()
        for item in path.iterdir():
            if item.name != "adapter_config.json":
                os.symlink(item, view / item.name)
        config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
        atomic_write_json(view / "adapter_config.json", {**config, "base_model_name_or_path": loadable})
        yield str(view)


def warn_if_other_base(adapter: Any, base_model: str) -> None:
    recorded = adapter.base_model_name_or_path
    if other_base(recorded, base_model):
        warnings.warn(
            f"The adapter at {adapter.path} was trained on {recorded!r} (adapter_config.json) but base model "
            f"{base_model!r} was given. A LoRA on the wrong base loads without error and produces garbage; "
            "pass the base it was trained on.",
            stacklevel=3,
        )
