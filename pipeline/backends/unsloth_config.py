"""What Unsloth's generated UnslothGRPOConfig does to the keyword arguments it is given, as a pure function.

unsloth 2026.10.9 builds `UnslothGRPOConfig.__init__` from TRL's GRPOConfig source (unsloth/models/rl.py
`_patch_trl_rl_trainers_impl`): it replaces some of TRL's defaults (its `replacements` tables) and runs lines of its
own first (its `extra_args`, rl_replacements.py `RL_CONFIG_CHANGES["grpo_trainer"]`).
"""

from __future__ import annotations

from typing import Any

from grpo_pipeline.pipeline.config import PipelineConfig


# TRL's defaults that UnslothGRPOConfig replaces (both `replacements` tables: every RL config's and GRPO's).
UNSLOTH_GRPO_DEFAULTS: dict[str, Any] = {
    "output_dir": None, "logging_nan_inf_filter": False, "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2, "weight_decay": 0.001, "seed": 3407, "optim": "adamw_8bit",
    "learning_rate": 5e-05, "per_device_eval_batch_size": 4, "eval_accumulation_steps": 2,
    "torch_empty_cache_steps": 250, "logging_steps": 1, "num_generations": 8, "vllm_mode": "colocate",
    "generation_kwargs": {}, "bf16": False, "fp16": False, "report_to": "none",
    "include_num_input_tokens_seen": False, "auto_find_batch_size": False, "dataloader_pin_memory": True,
    "warmup_steps": 0.1,  # transformers >= 5 (warmup_ratio before)
    # The GRPO table: None are sentinels its extra_args resolve (below).
    "loss_type": None, "beta": None, "vllm_importance_sampling_correction": False, "router_aux_loss_coef": 0.0,
    "mask_truncated_completions": None,
}
WHERE = "unsloth/models/rl.py _patch_trl_rl_trainers_impl"


def config_rewrites(kwargs: dict[str, Any], trl_defaults: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """{field: (value, why)} for every field UnslothGRPOConfig(**kwargs) sets otherwise than TRL's
    GRPOConfig(**kwargs) would; its checks that raise (temperature <= 0 or >= 10) are left to the run.

    >>> rewrites = config_rewrites({"use_vllm": True, "top_k": 0, "beta": 0.0, "loss_type": "dapo"},
    ...                            {"top_k": 0, "vllm_importance_sampling_correction": True})
    >>> rewrites["top_k"][0], rewrites["vllm_importance_sampling_correction"][0]
    (-1, False)
    """
    values = {**trl_defaults, **{k: v for k, v in UNSLOTH_GRPO_DEFAULTS.items() if k not in kwargs}, **kwargs}
    why = {k: f"{WHERE}: Unsloth's default for an unset field" for k in UNSLOTH_GRPO_DEFAULTS if k not in kwargs}
    default_loss = values["loss_type"] is None
    if default_loss:  # TRL >= 0.22: "dapo"
        values["loss_type"] = "dapo"
        why["loss_type"] = f"{WHERE}: loss_type unset, so TRL's default 'dapo' with beta 0"
    if values["beta"] is None:
        values["beta"] = 0.0 if str(values["loss_type"]).lower() in ("dapo", "dr_grpo") else 0.001
        why["beta"] = f"{WHERE}: beta unset: 0 for dapo / dr_grpo, else 0.001"
    loss = str(values["loss_type"]).lower()
    if loss == "dr_grpo" and values.get("scale_rewards") in (None, True, "group"):
        values["scale_rewards"] = values.get("scale_rewards") is None  # None -> True, True / 'group' -> False
        why["scale_rewards"] = f"{WHERE}: the Dr GRPO paper's scale_rewards"
    elif loss == "dapo" and not default_loss:  # an explicit dapo gets the DAPO paper's settings where unset
        for name, paper in (("mask_truncated_completions", True), ("epsilon_high", 0.28)):
            if values.get(name) is None:
                values[name], why[name] = paper, f"{WHERE}: explicit loss_type dapo, the DAPO paper's {name}"
    elif loss == "cispo" and values.get("epsilon_high") is None:
        values["epsilon_high"], why["epsilon_high"] = 5.0, f"{WHERE}: cispo, the ScaleRL paper's epsilon_high"
    if values.get("mask_truncated_completions") is None:
        values["mask_truncated_completions"] = False
        why["mask_truncated_completions"] = f"{WHERE}: mask_truncated_completions unset: False"
    batch, generations = values.get("per_device_train_batch_size"), values.get("num_generations")
    if (values.get("steps_per_generation") is None and values.get("generation_batch_size") is None
            and batch and generations and (values.get("gradient_accumulation_steps") or 1) * batch % generations):
        values["per_device_train_batch_size"] = generations  # (WORLD_SIZE 1: one process, as the backend runs)
        why["per_device_train_batch_size"] = f"{WHERE}: batch x accumulation not a multiple of num_generations"
    if values.get("use_vllm") and values.get("top_k") in (None, 0):
        values["top_k"] = -1
        why["top_k"] = "unsloth/models/rl_replacements.py grpo_config_fix_vllm_top_k: vLLM's 'off' is -1, 0 errors"
    start = {**trl_defaults, **kwargs}
    return {name: (values[name], why[name]) for name in why if values[name] != start.get(name)}


def predicted_config_kwargs(cfg: PipelineConfig) -> dict[str, Any]:
    """grpo_config_kwargs before the model loads (no bf16/fp16; use_vllm as configured: Unsloth may turn it off)."""
    if not cfg.model.fast_inference:
        return {"use_vllm": False}
    return {"use_vllm": True,
            "vllm_importance_sampling_correction": cfg.grpo.vllm_importance_sampling_correction}
