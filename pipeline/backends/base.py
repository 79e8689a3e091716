"""The backend object: its capabilities as class attributes and small methods, its operations (the `Backend`
protocol) the functions of its module, reached through the object."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from grpo_pipeline.pipeline.config import PipelineConfig


class BackendBase:
    """Defaults for every capability; a backend class sets NAME, MODULE and what differs."""

    NAME: str = ""
    MODULE: str = ""  # the module holding the backend's operations (imported on first use: nothing heavy)
    COUNTERPART: str = ""  # the backend effective_config.json compares this one with ("other_backend")
    GPU_ONLY: bool = False  # needs a CUDA GPU: a run without --config gets the GPU recipe
    MULTI_GPU: bool = True  # trains on several GPUs (DDP / FSDP through Accelerate)
    EXPORT_METHODS: tuple[str, ...] = ("merged16", "merged4")  # what its `export` can write
    KWARGS_NEED_MODEL: bool = False  # its GRPOConfig device settings follow the loaded model (not the machine)
    MEMORY_SAVERS: bool = False  # chunked log-prob projection and offloaded checkpointing (the memory plan)
    KBIT_UPCAST: bool = False  # a 4-bit base gets its 16-bit parameters cast to fp32 (peft's kbit preparation)
    # Whose vLLM engine training starts in this process: "trl" (TRL's, vllm_mode colocate), "own" (the backend's,
    # with fast_inference), "" (none)
    VLLM_ENGINE: str = ""
    # The recipe rules `validate` runs for this backend (each takes the options it reads as same-named parameters).
    RECIPE_RULES: tuple[Callable[..., None], ...] = ()

    def memory_path(self, vllm_mode: str, fast_inference: bool) -> str:
        """`grpo plan`'s `path:`: the backend and where its rollouts come from."""
        return self.NAME

    def starts_vllm_engine(self, cfg: PipelineConfig) -> bool:
        if self.VLLM_ENGINE == "trl":
            return cfg.model.vllm_mode == "colocate"
        return self.VLLM_ENGINE == "own" and bool(cfg.model.fast_inference)

    def refuse_before_training(self, cfg: PipelineConfig) -> None:
        """What the backend refuses before a recipe's model loads."""
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or not self.MODULE:
            raise AttributeError(name)
        return getattr(importlib.import_module(self.MODULE), name)

    def __repr__(self) -> str:
        return f"<{self.NAME} backend>"
