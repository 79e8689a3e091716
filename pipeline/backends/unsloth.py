"""Unsloth backend: FastLanguageModel (4-bit LoRA) + vLLM (`fast_inference`) + TRL's GRPOTrainer.

Written against unsloth 2026.10.9 / unsloth_zoo 2026.10.9 / vLLM 0.31.0 / trl 1.15.0 (the references below point
into those wheels). Single-GPU: vLLM runs in the training process, sharing the weights; `fast_inference: false`
generates with transformers. `prepare_environment(cfg)` must run before trl, transformers or peft are imported.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.pipeline.backends import EXPORT_METHODS, mixed_precision
from grpo_pipeline.pipeline.backends.base import BackendBase
from grpo_pipeline.pipeline.backends.gpu_settings import (  # noqa: F401  (re-exported: the README uses them here)
    EVAL_SLEEP_LEVEL,
    choose_gpu_memory_utilization,
    refuse_vllm_sleep_mode,
    resolve_gpu_memory_utilization,
    standby_enabled,
)
from grpo_pipeline.pipeline.backends.unsloth_config import config_rewrites, predicted_config_kwargs  # noqa: F401 (Backend)
from grpo_pipeline.pipeline.backends.unsloth_infer import load_generator, rollout_engine, training_generator  # noqa: F401 (Backend)
from grpo_pipeline.pipeline.backends.unsloth_setup import (
    LIVE_LORA_SUBDIR,
    from_pretrained,
    gradient_checkpointing_mode,
    prepare_environment,  # noqa: F401 (Backend)
    serves_with_vllm,
    unsloth_adapter_folder,
    warn_if_other_base,
)
from grpo_pipeline.pipeline.config import (
    UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS,
    ConfigError,
    PipelineConfig,
    sampling_params_mapping,
    validate_unsloth,
)
from grpo_pipeline.pipeline.config.validate import BACKEND_RULES
from grpo_pipeline.pipeline.data.prompts import carry_system_prompt

NAME = "unsloth"


class UnslothBackend(BackendBase):

    NAME = NAME
    VLLM_ENGINE = "own"
    MODULE = __name__
    COUNTERPART = "plain"
    GPU_ONLY = True
    MULTI_GPU = False  # vLLM shares the card and the weights with the trainer
    EXPORT_METHODS = EXPORT_METHODS  # gguf too: save_pretrained_gguf
    KWARGS_NEED_MODEL = True
    MEMORY_SAVERS = True
    RECIPE_RULES = BACKEND_RULES[NAME]

    def memory_path(self, vllm_mode: str, fast_inference: bool) -> str:
        return "unsloth+vllm" if fast_inference else "unsloth (no vLLM)"

    def refuse_before_training(self, cfg: PipelineConfig) -> None:
        refuse_vllm_sleep_mode(standby_enabled(cfg))  # the trainer's rollouts would sleep vLLM with it

DEFAULT_GGUF_QUANTIZATION = "q4_k_m"  # Unsloth's "Recommended" k-quant (unsloth_save_pretrained_gguf)
# save_pretrained_gguf writes the .gguf files into the SIBLING folder f"{save_directory}_gguf"
# (save._gguf_output_directory): a child of out_dir keeps both inside the caller's atomic temp folder.
GGUF_MERGED_SUBDIR = "merged"


def load_for_training(cfg: PipelineConfig, tokenizer: Any = None):
    """(LoRA model, Unsloth's own tokenizer): from_pretrained then get_peft_model (`tokenizer` is not used)."""
    validate_unsloth(cfg.lora.lora_modules_to_save, cfg.lora.lora_target_modules, cfg.model.fast_inference,
                     cfg.grpo.vllm_sampling_params, cfg.model.vllm_standby)
    refuse_vllm_sleep_mode(standby_enabled(cfg))
    model, tokenizer = from_pretrained(cfg, cfg.model.model_name_or_path, fast_inference=cfg.model.fast_inference)
    from unsloth import FastLanguageModel  # imported by from_pretrained, after prepare_environment

    # Its patch_peft_fast_inference (unsloth/models/_utils.py) attaches save_lora and, with vLLM, load_lora.
    model = FastLanguageModel.get_peft_model(
        model,
        r=cfg.lora.lora_r,
        target_modules=list(cfg.lora.lora_target_modules),
        lora_alpha=cfg.lora.lora_alpha,
        lora_dropout=cfg.lora.lora_dropout,  # 0 keeps the fused LoRA kernels on (llama._fused_lora_skip_reason)
        use_gradient_checkpointing=gradient_checkpointing_mode(cfg.lora.gradient_checkpointing),
        random_state=cfg.grpo.seed,
        modules_to_save=list(cfg.lora.lora_modules_to_save) or None,
    )
    # `model.load_lora` puts a RELATIVE folder under the run's, not the cwd: Unsloth's patched trainer calls it with
    # one on every vLLM rollout (rl_replacements.py, rl.py), writing the live adapter_config.json there
    # (unsloth_zoo _live_lora_config). No vLLM engine: no load_lora.
    load_lora = getattr(model, "load_lora", None)
    folder = absolute_path(cfg.grpo.output_dir) / LIVE_LORA_SUBDIR
    if load_lora is not None:
        @functools.wraps(load_lora)
        def anchored(save_directory, *args, **kwargs):
            path = Path(save_directory)
            return load_lora(str(path if path.is_absolute() else folder / path), *args, **kwargs)

        model.load_lora = anchored
    return model, tokenizer


def peft_config(cfg: PipelineConfig) -> None:
    """Always None: Unsloth's patched GRPOTrainer rewrites `if peft_config is not None:` to `if False:` (a LoraConfig
    would be silently ignored); load_for_training applied the LoRA.

    >>> from grpo_pipeline.pipeline.config import PipelineConfig
    >>> peft_config(PipelineConfig()) is None
    True
    """
    return None


class SamplingOverrides(dict):
    """`vllm_sampling_params` as Unsloth reads it (only `_set_kwargs`: rl_replacements.py grpo_update_SamplingParams)
    and transformers can write it: Unsloth's vLLMSamplingParams fails TrainingArguments.to_json_string (the
    TensorBoard and wandb callbacks call it)."""

    @property
    def _set_kwargs(self) -> dict[str, Any]:
        return dict(self)


def grpo_config_kwargs(cfg: PipelineConfig, model: Any) -> dict[str, Any]:
    """Backend-specific GRPOConfig (UnslothGRPOConfig) keyword arguments.

    - `use_vllm`: True exactly when the model carries a vLLM engine (serves_with_vllm): generation then goes
      through it (Unsloth's patched trainer reuses `model.vllm_engine`, vllm_mode='colocate'; no second LLM).
      Without one, Unsloth's patched trainer generates with transformers and no vLLM field is passed.
    - `bf16`/`fp16` from the loaded model's dtype (grpo_pipeline.pipeline.backends.mixed_precision): Unsloth raises
      TypeError when they disagree with the model; with dtype auto the model is bf16 where the GPU supports
      it and fp16 elsewhere (T4, V100). A float32 model gets neither and Unsloth picks autocast itself.
    - `vllm_importance_sampling_correction` from the config: Unsloth would default it to False, TRL to True.
    - `vllm_sampling_params` from the config mapping (see SamplingOverrides). Unsloth copies its fields over
      TRL's generation kwargs (top_p, top_k, min_p, repetition_penalty, ...), except seed, n, temperature,
      max_tokens and logprobs, which come from GRPOConfig (grpo_update_SamplingParams).

    Other Unsloth-specific fields (unsloth_num_chunks=-1, unsloth_grpo_mini_batch=None,
    unsloth_logit_chunk_multiplier=None; rl.py) keep their defaults.
    """
    use_vllm = serves_with_vllm(model, cfg.model.fast_inference)
    kwargs: dict[str, Any] = {"use_vllm": use_vllm, **mixed_precision(model)}
    if not use_vllm:
        if not cfg.model.fast_inference and sampling_params_mapping(cfg.grpo.vllm_sampling_params):
            # validate() refuses this first
            raise ConfigError("vllm_sampling_params", "is for vLLM; fast_inference: false runs without it.")
        return kwargs
    kwargs["vllm_importance_sampling_correction"] = cfg.grpo.vllm_importance_sampling_correction
    mapping = sampling_params_mapping(cfg.grpo.vllm_sampling_params)
    if mapping:
        overridden = sorted(set(mapping) & set(UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS))
        if overridden:  # validate() refuses these first; kept for direct callers
            raise ConfigError("vllm_sampling_params", f"{overridden} are taken from the trainer config by Unsloth "
                              "and would be ignored here; set temperature / num_generations / "
                              "max_completion_length / seed instead.")
        # Built once with Unsloth's own helper (vllm.SamplingParams(**mapping)) so vLLM rejects a bad field or
        # value now, naming it, instead of at the first rollout.
        from unsloth import vLLMSamplingParams  # lazy: unsloth imports torch
        from vllm.exceptions import VLLMValidationError  # lazy: vllm only with fast_inference; not a ValueError

        try:
            vLLMSamplingParams(**mapping)
        except (TypeError, ValueError, VLLMValidationError) as err:  # TypeError: an unknown field (msgspec)
            raise ConfigError("vllm_sampling_params", f"vLLM's SamplingParams rejected {mapping}: {err}. Fix "
                              "or remove that field (see vLLM's SamplingParams).") from None
        kwargs["vllm_sampling_params"] = SamplingOverrides(mapping)
    return kwargs


def prepare_trainer(trainer: Any, cfg: PipelineConfig) -> None:
    return None  # Unsloth's patched trainer sends the adapter to its vLLM (load_lora) before each rollout


def save_adapter(model: Any, tokenizer: Any, directory: Path) -> None:
    """`model.save_lora` (unsloth_zoo.vllm_utils.save_lora) plus the tokenizer, at an absolute path."""
    directory = absolute_path(directory)
    model.save_lora(str(directory))
    tokenizer.save_pretrained(str(directory))


def export(adapter: Any, base_model: str, method: str, out_dir: Path, cfg: PipelineConfig,
           system_prompt: Optional[str] = None, gguf_quantization: str = DEFAULT_GGUF_QUANTIZATION) -> None:
    """merged16 merges into the original 16-bit checkpoint (save.unsloth_generic_save); merged4 into the loaded
    4-bit weights ("merged_4bit" raises asking for "_forced"); gguf builds llama.cpp on first use."""
    if method not in EXPORT_METHODS:
        raise ConfigError("to", f"got {method!r}; choose one of {', '.join(EXPORT_METHODS)}.")
    if method == "gguf" and not (isinstance(gguf_quantization, str) and gguf_quantization.strip()):
        raise ConfigError("gguf_quantization", f"got {gguf_quantization!r}; use a llama.cpp type such as q4_k_m, "
                          "q8_0 or f16.")
    warn_if_other_base(adapter, base_model)
    with unsloth_adapter_folder(adapter) as folder:
        model, tokenizer = from_pretrained(cfg, folder, fast_inference=False,
                                           load_in_4bit=True if method == "merged4" else None)
        # Absolute: Unsloth moves *relative* save paths elsewhere on Kaggle (save.py _preflight_merge_disk).
        out_dir = absolute_path(out_dir)
        carry_system_prompt(tokenizer, system_prompt)  # before the save: the .gguf's metadata carries it too
        if method == "merged16":
            model.save_pretrained_merged(str(out_dir), tokenizer, save_method="merged_16bit")
        elif method == "merged4":
            model.save_pretrained_merged(str(out_dir), tokenizer, save_method="merged_4bit_forced")
        else:
            model.save_pretrained_gguf(str(out_dir / GGUF_MERGED_SUBDIR), tokenizer,
                                       quantization_method=gguf_quantization.strip().lower())
