"""GPU memory settings for the Unsloth backend: vLLM standby and `gpu_memory_utilization`.

Unsloth's vLLM shares the model weights with training (unsloth/models/llama.py `llm.shared_weights = True`):
`gpu_memory_utilization` is the GPU share for them plus the KV cache. Standby (`UNSLOTH_VLLM_STANDBY=1`) sleeps the
KV cache during forward/backward, and unsloth_zoo then *replaces* our share with its own tier (vllm_utils.load_vllm,
unless UNSLOTH_VLLM_STANDBY_UTIL_OVERRIDE=1): `auto` is exactly that tier.
"""

from __future__ import annotations

import os
import warnings
from typing import Optional

from grpo_pipeline.pipeline import backends
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig

# unsloth_zoo.vllm_utils.load_vllm's standby tiers (its vLLM >= 0.11 branch), keyed on
# `ten_percent = total_memory / 1024**3 * 0.1`, times 0.95 headroom: computed the same way, so the float is
# bit-identical and Unsloth prints no "Changing gpu_memory_utilization". Rows: (minimum ten_percent, tier).
STANDBY_TIERS: tuple[tuple[float, float], ...] = (
    (4.0, 0.925),  # >= 40 GiB: A100/H100 40-80 GB, A6000 48 GB
    (2.5, 0.9),    # >= 25 GiB: V100 32 GB, RTX 5090
    (2.0, 0.825),  # >= 20 GiB: L4 / RTX 4090 / A10 (22-24 GiB)
    (1.4, 0.8),    # >= 14 GiB: T4 (14.7 GiB), 16 GB cards
    (1.0, 0.775),  # >= 10 GiB: 12 GB cards
    (0.0, 0.75),   # smaller cards
)
STANDBY_HEADROOM = 0.95  # unsloth_zoo.vllm_utils.load_vllm

# Without standby training gets only the remainder, a roughly fixed amount for a model and batch (our estimate
# for Qwen2.5-1.5B/3B with 8 x 1024-token completions: 6-8 GiB, not measured), so small cards leave a larger share:
NO_STANDBY_TABLE: tuple[tuple[float, float], ...] = (
    (16.0, 0.5),  # ~7.4 GiB left on a T4 (also Unsloth's FastLanguageModel.from_pretrained default)
    (24.0, 0.55),  # ~10 GiB left on an L4 / RTX 4090
    (48.0, 0.6),  # ~16-19 GiB left on an A100-40GB / A6000
    (float("inf"), 0.7),  # ~24 GiB left on an 80 GB card
)


def gpu_total_gib(device: int = 0) -> float:
    import torch

    return torch.cuda.get_device_properties(device).total_memory / 1024**3


def standby_enabled(cfg: PipelineConfig, has_cuda: Optional[bool] = None) -> bool:
    """Resolve `vllm_standby`: `auto` is on with a CUDA GPU, as the official Qwen2.5 GRPO notebook sets it.

    >>> from grpo_pipeline.pipeline.config import PipelineConfig
    >>> standby_enabled(PipelineConfig().replace(vllm_standby="auto"), has_cuda=True)
    True
    """
    value = str(cfg.model.vllm_standby).strip().lower()  # a YAML `true` arrives as a bool
    if not cfg.model.fast_inference:
        return False  # standby is vLLM's sleep mode
    if value in ("true", "false"):
        return value == "true"
    if value == "auto":
        return backends.cuda_available() if has_cuda is None else bool(has_cuda)
    raise ConfigError("vllm_standby", f"got {cfg.model.vllm_standby!r}; choose auto, true or false.")


SLEEP_MODE_ENV = "VLLM_SLEEP_MODE"
# Our eval's sleep level for a standby engine: Unsloth's outside its trainer (rl.py _maybe_prepare_vllm_for_resume).
EVAL_SLEEP_LEVEL = 1


def refuse_vllm_sleep_mode(standby: bool) -> None:
    """Refuse an exported VLLM_SLEEP_MODE with vLLM standby: Unsloth's patch (rl_replacements.py) passes it to
    `self.llm.sleep` as a string (vLLM compares `level >= 1`), and TRL 1.15 sleeps at level 2 itself.

    >>> refuse_vllm_sleep_mode(standby=False)  # no standby: vLLM never sleeps
    """
    raw = os.environ.get(SLEEP_MODE_ENV)
    if not standby or raw is None:
        return
    raise ConfigError(SLEEP_MODE_ENV, f"the environment variable is set ({raw!r}), but it cannot choose the sleep "
                      "level of vLLM standby: Unsloth's trainer patch would pass it to vLLM's sleep() as a string "
                      "(a TypeError mid-run), and with TRL 1.15 TRL sleeps vLLM at level 2 itself and ignores it. "
                      "Unset it (`unset VLLM_SLEEP_MODE`; in a notebook `os.environ.pop('VLLM_SLEEP_MODE')`), "
                      "or set vllm_standby: false.")


def choose_gpu_memory_utilization(total_gib: float, standby: bool) -> float:
    """The `auto` share of GPU memory for vLLM, from the GPU size and standby.

    >>> choose_gpu_memory_utilization(80.0, standby=True) == 0.925 * 0.95
    True
    >>> choose_gpu_memory_utilization(22.0, standby=False)
    0.55
    """
    if not total_gib > 0:
        raise ValueError(f"total_gib must be positive, got {total_gib!r}")
    if standby:
        ten_percent = total_gib * 0.1
        for min_ten_percent, tier in STANDBY_TIERS:
            if ten_percent >= min_ten_percent:
                return tier * STANDBY_HEADROOM
    return next(share for max_gib, share in NO_STANDBY_TABLE if total_gib <= max_gib)


def parse_gpu_memory_utilization(value: object) -> Optional[float]:
    """`auto` -> None; a number in (0, 1] -> float; anything else is a ConfigError.

    >>> parse_gpu_memory_utilization("0.6"), parse_gpu_memory_utilization("auto")
    (0.6, None)
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        share = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError("gpu_memory_utilization", f"got {value!r}; use `auto` or a number in (0, 1] "
                          "such as 0.6 (the share of GPU memory vLLM may reserve).") from None
    if not 0.0 < share <= 1.0:
        raise ConfigError("gpu_memory_utilization", f"got {share}; it is a share of GPU memory, so use a "
                          "number in (0, 1] such as 0.6, or `auto`.")
    return share


def standby_replaces_share(standby: bool) -> bool:
    """Whether unsloth_zoo's load_vllm replaces an explicit share with its standby tier."""
    return standby and os.environ.get("UNSLOTH_VLLM_STANDBY_UTIL_OVERRIDE", "0") == "0"


def resolve_gpu_memory_utilization(cfg: PipelineConfig, total_gib: Optional[float] = None,
                                   standby: Optional[bool] = None) -> float:
    """`FastLanguageModel.from_pretrained`'s gpu_memory_utilization; warns when standby will replace an explicit one.

    >>> from grpo_pipeline.pipeline.config import PipelineConfig
    >>> resolve_gpu_memory_utilization(PipelineConfig(), total_gib=15.0, standby=False)
    0.5
    """
    explicit = parse_gpu_memory_utilization(cfg.model.gpu_memory_utilization)
    if standby is None:
        standby = standby_enabled(cfg)
    if total_gib is None and (explicit is None or standby):
        total_gib = gpu_total_gib()
    if explicit is None:
        return choose_gpu_memory_utilization(total_gib, standby)
    if standby_replaces_share(standby):
        tier = choose_gpu_memory_utilization(total_gib, standby=True)
        if abs(tier - explicit) > 1e-9:
            warnings.warn(
                f"gpu_memory_utilization={explicit} will be replaced by Unsloth's standby tier {tier:.4f} for a "
                f"{total_gib:.1f} GiB GPU (unsloth_zoo load_vllm). Set gpu_memory_utilization: auto to silence this, "
                "or export UNSLOTH_VLLM_STANDBY_UTIL_OVERRIDE=1 to keep your value.",
                stacklevel=2,
            )
    return explicit
