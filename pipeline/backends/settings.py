"""What the backends read from a recipe: `BackendSettings`, built from it once by `backend_settings`.

Every backend operation (pipeline/backends/__init__.py `Backend`: load, train settings, generate, export) and the
helpers beside it take these settings, not the recipe: the run builds them once in its check (pipeline/preflight.py,
carried on the run's decisions as `backend_settings`), a command that loads without training (generate, eval,
export, the bootstrap) once from the recipe it has. Each field is the recipe's option of the same name, lists as
tuples. Imports nothing that loads torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from pipeline.config import PipelineConfig


@dataclass(frozen=True)
class BackendSettings:
    """The recipe's options a backend reads, by their names in the recipe."""

    model_name_or_path: str
    backend: str  # as requested (auto | a backend's name): a GPU recipe refused on CPU names it
    model_source: str
    trust_remote_code: bool
    dtype: str
    load_in_4bit: bool
    max_seq_length: int
    fast_inference: bool
    vllm_mode: str
    vllm_server_base_url: Optional[str]
    vllm_standby: Any  # auto | true | false, as set
    gpu_memory_utilization: Any  # auto or a share, as set
    max_lora_rank: int
    float8_kv_cache: bool
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    lora_target_modules: tuple[str, ...]
    lora_modules_to_save: tuple[str, ...]
    gradient_checkpointing: bool
    seed: int
    output_dir: str
    vllm_importance_sampling_correction: Any
    vllm_sampling_params: Any  # a mapping or its JSON text, as set

    def replace(self, **changes: Any) -> "BackendSettings":
        """A copy with `changes` (the plain backend's export merges into full-precision weights: load_in_4bit off)."""
        return dataclasses.replace(self, **changes)


def backend_settings(cfg: PipelineConfig) -> BackendSettings:
    """The one builder: the recipe's options a backend reads.

    >>> settings = backend_settings(PipelineConfig().replace(lora_target_modules=["q_proj"], vllm_standby="false"))
    >>> settings.lora_target_modules, settings.vllm_standby
    (('q_proj',), 'false')
    """
    flat = cfg.to_dict()
    return BackendSettings(**{f.name: tuple(flat[f.name]) if isinstance(flat[f.name], list) else flat[f.name]
                              for f in dataclasses.fields(BackendSettings)})
