"""trl.GRPOConfig's own fields as options of `grpo train`, derived from the installed dataclass: every init field
no section of ours owns, under TRL's name, type, default and help, passed to trl.GRPOConfig as given (a TRL upgrade
brings its new fields with no change here). Importing trl.GRPOConfig imports torch, so nothing here runs until a name
that is not ours is met, or --help / --check / the run need the fields.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import re
import sys
import typing
from typing import Any

from grpo_pipeline.pipeline.config.fields import field_names

_RESTORED = {"resume_restored": True}
# The roles (pipeline/config/roles.py ROLES) of TRL's own fields, whose dataclass cannot carry our metadata:
# run_owned with the reason naming one is refused, backend_decided with the option that decides it.
TRL_ROLES: dict[str, dict[str, Any]] = {
    "disable_tqdm": {"run_owned": "the run replaces TRL's progress bar with its own line (reward, KL, completion "
                                  "length)"},
    "logging_nan_inf_filter": {"run_owned": "the health rules must see a NaN/inf loss to stop or roll the run back"},
    "resume_from_checkpoint": {"run_owned": "resuming is our `resume` option (auto | never | PATH), which also "
                                            "checks the checkpoint first"},
    "eval_strategy": {"run_owned": "evaluation is ours: eval_steps / eval_before / eval_after score held-out "
                                   "problems (TRL is given no eval_dataset)"},
    "use_cpu": {"run_owned": "the backend and the machine decide it: `backend: plain` trains on the CPU when there "
                             "is no GPU"},
    "use_vllm": {"backend_decided": "vllm_mode (plain backend: colocate | server) or fast_inference (unsloth "
                                    "backend)"},
    "bf16": {"backend_decided": "dtype (bfloat16 where the GPU supports it; never on a CPU)"},
    "fp16": {"backend_decided": "dtype (float16; never on a CPU)"},
    "vllm_gpu_memory_utilization": {"backend_decided": "gpu_memory_utilization"},
    "lr_scheduler_kwargs": _RESTORED, "optim_args": _RESTORED, "adam_epsilon": _RESTORED,
    "generation_batch_size": _RESTORED, "steps_per_generation": _RESTORED, "num_iterations": _RESTORED,
    "data_seed": _RESTORED,
    # the eval answers through the tool loop, with the recipe's cap on its rounds (pipeline/infer/tool_loop.py)
    "max_tool_calling_iterations": {"eval_input": "agents"},
}


def trl_with(role: str) -> dict[str, Any]:
    """TRL's fields declaring `role` in TRL_ROLES, name -> the role's value.

    >>> sorted(trl_with("backend_decided"))
    ['bf16', 'fp16', 'use_vllm', 'vllm_gpu_memory_utilization']
    """
    return {name: roles[role] for name, roles in TRL_ROLES.items() if role in roles}

GROUP_NAME = "TRL's GRPOConfig and TrainingArguments (TRL's names, types, defaults and meaning)"

_PORT = {"ge": 1, "le": 65535, "why": "a TCP port"}
_COUNT = {"ge": 1, "why": "a count of steps, batches or items; 0 divides by zero or does nothing"}
_NONNEGATIVE = {"ge": 0, "why": "a coefficient, exponent or delay: a negative one reverses what it does"}
_POSITIVE = {"gt": 0, "why": "a scale, threshold or cap: the code divides by it or compares ratios (> 0) with it"}
_SHARE = {"ge": 0, "le": 1, "why": "a share or mix in [0, 1]"}
# Bounds of TRL's numeric options, each from what TRL, transformers or torch do with the value (check_field_values
# refuses one outside them; tests/test_config_bounds.py fails when a numeric option is missing here).
TRL_BOUNDS: dict[str, dict[str, Any]] = {
    # torch.optim.AdamW refuses eps < 0; 0 divides by sqrt(v) = 0 for a weight with no gradient yet.
    "adam_epsilon": {"gt": 0, "why": "Adam divides by sqrt(v) + epsilon"},
    # transformers' set_seed -> numpy.random.seed, which takes 0 .. 2**32 - 1.
    "data_seed": {"ge": 0, "le": 2**32 - 1, "why": "numpy's seed range"},
    # torch.utils.data.DataLoader refuses a negative num_workers and a prefetch_factor < 1.
    "dataloader_num_workers": {"ge": 0, "why": "0 loads in the main process; torch refuses fewer"},
    "dataloader_prefetch_factor": {**_COUNT},
    "ddp_bucket_cap_mb": {**_COUNT},
    "ddp_timeout": {"ge": 1, "why": "seconds torch.distributed waits; 0 times out at once"},
    # GRPOTrainer._compute_loss clamps the ratio at delta: at or below 1 it clips the on-policy ratio itself.
    "delta": {"gt": 1, "why": "the ratio's upper clip; at 1 or below every on-policy token is clipped (TRL: > 1 + "
                              "epsilon)"},
    "entropy_coef": _NONNEGATIVE, "entropy_coef_delta": _NONNEGATIVE, "entropy_coef_max": _NONNEGATIVE,
    "entropy_coef_min": _NONNEGATIVE,
    "entropy_target": {"ge": 0, "why": "entropy in nats is never negative, so a negative target never applies"},
    # The ratio is clipped to [1 - epsilon, 1 + epsilon]: 0 clips every token (no gradient), 1 removes the low side.
    "epsilon": {"gt": 0, "le": 1, "why": "the ratio is clipped to [1 - epsilon, 1 + epsilon]"},
    "eval_accumulation_steps": _COUNT, "eval_delay": _NONNEGATIVE, "generation_batch_size": _COUNT,
    # transformers' LabelSmoother mixes the target with the uniform distribution by this share.
    "label_smoothing_factor": {"ge": 0, "lt": 1, "why": "the target's share mixed with uniform; 1 leaves no target"},
    "local_rank": {"ge": -1, "why": "-1 is no distributed training, else a process index"},
    "max_tool_calling_iterations": {"ge": 0, "why": "a number of tool-calling turns"},
    "neftune_noise_alpha": _POSITIVE, "num_completions_to_print": _COUNT, "num_generations_eval": _COUNT,
    # GRPOTrainer reuses a generation batch `step % num_iterations`: 0 divides by zero.
    "num_iterations": _COUNT,
    "off_policy_mask_threshold": _POSITIVE, "pad_to_multiple_of": _COUNT, "per_device_eval_batch_size": _COUNT,
    # TR-DPO's pi_ref = alpha * pi_theta + (1 - alpha) * pi_ref_prev: a convex mix.
    "ref_model_mixup_alpha": _SHARE,
    "ref_model_sync_steps": _COUNT,
    # transformers' RepetitionPenaltyLogitsProcessor and vLLM's SamplingParams refuse <= 0 (logits are divided by it).
    "repetition_penalty": {"gt": 0, "why": "logits are divided or multiplied by it; 1 is off"},
    "router_aux_loss_coef": _NONNEGATIVE,
    # SAPO's gate sigmoid(tau * (r - 1)) * 4 / tau divides by it.
    "sapo_temperature_neg": _POSITIVE, "sapo_temperature_pos": _POSITIVE,
    "steps_per_generation": _COUNT,
    # torch.quantile refuses q outside [0, 1].
    "top_entropy_quantile": _SHARE,
    # TrainingArguments.__post_init__ refuses a torch_empty_cache_steps below 1.
    "torch_empty_cache_steps": _COUNT,
    "vespo_k_neg": _NONNEGATIVE, "vespo_k_pos": _NONNEGATIVE, "vespo_lambda_neg": _NONNEGATIVE,
    "vespo_lambda_pos": _NONNEGATIVE,
    # vLLM's CacheConfig takes a share of GPU memory in (0, 1].
    "vllm_gpu_memory_utilization": {"gt": 0, "le": 1, "why": "a share of GPU memory"},
    "vllm_group_port": _PORT, "vllm_server_port": _PORT,
    "vllm_importance_sampling_cap": _POSITIVE, "vllm_importance_sampling_clip_max": _POSITIVE,
    "vllm_importance_sampling_clip_min": {"ge": 0, "why": "importance ratios are never negative"},
    "vllm_max_model_length": _COUNT, "vllm_tensor_parallel_size": _COUNT,
    "vllm_server_timeout": {"gt": 0, "why": "seconds to wait for the server"},
    # TrainingArguments: a float in [0, 1) is a ratio of the total steps, larger is a step count; negative is refused.
    "warmup_steps": {"ge": 0, "why": "a ratio in [0, 1) of the steps, or a number of steps"},
}


@functools.lru_cache(maxsize=1)
def grpo_config_class() -> type:
    """The installed trl.GRPOConfig (from its module: Unsloth's patched copy adds its own fields only at run time)."""
    # lazy: trl imports torch, and comes after the bootstrap's `import unsloth`
    from trl.trainer.grpo_config import GRPOConfig

    return GRPOConfig


@functools.lru_cache(maxsize=1)
def trl_fields() -> dict[str, dataclasses.Field]:
    """GRPOConfig's init fields that no section of ours owns, run_owned ones included (to refuse them by name)."""
    ours = set(field_names())
    return {f.name: f for f in dataclasses.fields(grpo_config_class())
            if f.init and f.name not in ours and not f.name.startswith("_")}


def trl_option_names() -> list[str]:
    """The names `grpo train` takes from TRL (sorted)."""
    owned = trl_with("run_owned")
    return sorted(name for name in trl_fields() if name not in owned)


@functools.lru_cache(maxsize=1)
def trl_section() -> type:
    """The TRL options as one dataclass for TrlParser and --help, with GRPOConfig's types, defaults and help; no
    __post_init__ (TRL validates when the run or --check builds the real GRPOConfig)."""
    hints = typing.get_type_hints(grpo_config_class())
    made = []
    for name in trl_option_names():
        f = trl_fields()[name]
        made.append((name, hints[name], dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                          metadata=dict(f.metadata))))
    section = dataclasses.make_dataclass("TrlArguments", made)
    section._argument_group_name = GROUP_NAME  # HfArgumentParser's group title in --help
    return section


# TRL's modules that import vLLM at their top when it is installed (`if is_vllm_available(): from vllm import ...`),
# in the order they import each other.
TRL_VLLM_MODULES = ("trl.generation.vllm_client", "trl.generation.vllm_generation", "trl.generation")


def grpo_trainer_module(uses_vllm: bool = False) -> Any:
    """TRL's GRPOTrainer module, imported with vLLM hidden unless `uses_vllm`: trl/generation/ imports vLLM at its
    top whenever it is installed, about half the trainer's import time (4 s of CPU on 2 cores). A later run that
    uses it reloads TRL's vLLM modules in place, as an import with vLLM visible would have left them."""
    if uses_vllm:
        if not hasattr(sys.modules.get("trl.generation.vllm_generation"), "LLM") and importlib.util.find_spec("vllm"):
            for name in TRL_VLLM_MODULES:
                if name in sys.modules:
                    importlib.reload(sys.modules[name])
        return importlib.import_module("trl.trainer.grpo_trainer")
    if "vllm" in sys.modules or "trl.trainer.grpo_trainer" in sys.modules:  # vLLM is loaded already (Unsloth's
        return importlib.import_module("trl.trainer.grpo_trainer")  # fast_inference, an earlier run): nothing to save
    sys.modules["vllm"] = None
    try:
        return importlib.import_module("trl.trainer.grpo_trainer")
    finally:
        if sys.modules.get("vllm", 0) is None:
            del sys.modules["vllm"]


@functools.lru_cache(maxsize=1)
def trainer_choices() -> dict[str, tuple[str, ...]]:
    """The values GRPOTrainer dispatches on for its text fields, read from its source (`self.loss_type == "dapo"`,
    `args.scale_rewards in [...]`): TRL declares them as plain `str` and refuses an unknown value only deep in a
    training step. A dispatch: two values or more, the field's default among them.

    >>> trainer_choices()["loss_type"][:3], "none" in trainer_choices()["scale_rewards"]
    (('bnpo', 'cispo', 'dapo'), True)
    """
    source = inspect.getsource(grpo_trainer_module())
    found: dict[str, set[str]] = {}
    for name, value in re.findall(r"(?:self|args)\.(\w+)\s*[!=]=\s*[\"'](\w+)[\"']", source):
        found.setdefault(name, set()).add(value)
    for name, body in re.findall(r"(?:self|args)\.(\w+)\s+(?:not\s+)?in\s+[\[({]([^\])}]*)[\])}]", source):
        found.setdefault(name, set()).update(re.findall(r"[\"'](\w+)[\"']", body))
    fields = {f.name: f for f in dataclasses.fields(grpo_config_class())}
    return {name: tuple(sorted(values)) for name, values in sorted(found.items())
            if name in fields and len(values) >= 2 and fields[name].default in values}
