"""The backend boundary: everything that differs between Unsloth+vLLM and plain transformers+peft.

A backend module exposes NAME, load_for_training, peft_config, grpo_config_kwargs, save_adapter,
load_generator and export (see pipeline/backends/plain.py for the reference implementation).
All the rest of the pipeline (data, rewards, trainer, checkpoints, health, eval) is shared.

`choose_backend` decides without importing unsloth, vllm, trl, transformers or peft: the
unsloth backend must be imported *before* those three (Unsloth patches them at import time).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from pipeline.config import ConfigError


@dataclass(frozen=True)
class BackendChoice:
    name: str  # "unsloth" | "plain"
    reason: str


def cuda_available() -> bool:
    """True when torch sees a CUDA device. Importing torch first is fine for Unsloth (it checks trl/transformers/peft)."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def choose_backend(requested: str) -> BackendChoice:
    """Resolve `backend: auto|unsloth|plain` into a concrete backend, with the reason in words."""
    missing = [name for name in ("unsloth", "vllm") if importlib.util.find_spec(name) is None]
    has_cuda = cuda_available()
    if requested == "plain":
        return BackendChoice("plain", "backend: plain was requested")
    if requested == "unsloth":
        problems = []
        if not has_cuda:
            problems.append("no CUDA GPU is visible to torch")
        if missing:
            problems.append(f"{' and '.join(missing)} not installed (pip install -e '.[gpu]')")
        if problems:
            raise ConfigError(
                "backend",
                "backend: unsloth needs a CUDA GPU with unsloth and vllm installed, but " + "; ".join(problems)
                + ". Use backend: plain (or auto) to run without them."
            )
        return BackendChoice("unsloth", "backend: unsloth was requested")
    if requested != "auto":
        raise ConfigError("backend", f"got {requested!r}; choose auto, unsloth or plain.")
    if not has_cuda:
        return BackendChoice("plain", "auto: no CUDA GPU, so the plain transformers + peft + TRL backend")
    if missing:
        return BackendChoice(
            "plain", f"auto: CUDA GPU found but {' and '.join(missing)} not installed; pip install -e '.[gpu]' "
            "for Unsloth + vLLM"
        )
    return BackendChoice("unsloth", "auto: CUDA GPU, unsloth and vllm are all available")


def load_backend(name: str) -> ModuleType:
    """Import the backend module (the unsloth one imports nothing heavy until prepare_environment)."""
    return importlib.import_module(f"pipeline.backends.{name}")
