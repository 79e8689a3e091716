"""Validation of a parsed config, before any model loads: what would surface deep inside TRL or Unsloth (or be
silently rewritten by them) becomes one ConfigError naming the field and the fix. The per-field checks
(check_field_values, pipeline_config.py) run first.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import warnings
from typing import Any, Optional

from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.config.fields import ConfigError
from grpo_pipeline.pipeline.config.pipeline_config import PipelineConfig, check_field_values, check_generation_temperature
from grpo_pipeline.rewards import check_reward_names, check_reward_weights, get_reward_funcs  # light: no torch

# What Unsloth trains in full rather than as LoRA (unsloth/models/_utils.py EMBEDDING_MODULES).
EMBEDDING_MODULES = ("embed_tokens", "lm_head")

# Fields Unsloth takes from GRPOConfig, silently ignoring them in `vllm_sampling_params`
# (unsloth/models/rl_replacements.py grpo_update_SamplingParams).
UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS = {
    "seed": "seed",
    "n": "num_generations",
    "temperature": "temperature",
    "max_tokens": "max_completion_length",
    "logprobs": "(set by the trainer)",
}


def check_adapter_rank(rank: int, max_lora_rank: int, *, what: str, fix: str,
                       field_name: str = "max_lora_rank") -> None:
    """Refuse an adapter rank above max_lora_rank: vLLM sizes its LoRA slots by it when the engine starts.

    >>> check_adapter_rank(64, 32, what="the adapter at /runs/lora",  # doctest: +ELLIPSIS
    ...                    fix="Pass --max_lora_rank 64.")
    Traceback (most recent call last):
    ...
    grpo_pipeline.pipeline.config.fields.ConfigError: config error in `max_lora_rank`: the adapter at /runs/lora has rank r=64, ...
    """
    if rank > max_lora_rank:
        raise ConfigError(field_name, f"{what} has rank r={rank}, above max_lora_rank={max_lora_rank}; vLLM cannot "
                                      f"load it. {fix}")


def world_size() -> int:
    """Number of training processes (set by accelerate/torchrun); 1 for a plain run."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def parse_limit(value: Any, field_name: str) -> Optional[int]:
    """`auto` -> None, else a positive int; anything else is a ConfigError."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(field_name, f"got {excerpt(value)}; use a positive integer or `auto`.") from None
    if number <= 0:
        raise ConfigError(field_name, f"got {number}; use a positive integer or `auto`.")
    return number


def sampling_params_mapping(value: Any) -> dict[str, Any]:
    """Normalise `vllm_sampling_params` (mapping or JSON string) to a dict."""
    if value in (None, "", {}):
        return {}
    if isinstance(value, dict):
        return dict(value)
    try:
        parsed = json.loads(value)
    except (TypeError, json.JSONDecodeError):
        raise ConfigError("vllm_sampling_params", f"got {excerpt(value)}; give a YAML mapping or a JSON object "
                          "string such as '{\"min_p\": 0.1}'.") from None
    if not isinstance(parsed, dict):
        raise ConfigError("vllm_sampling_params", "must be a mapping such as {min_p: 0.1}.")
    return parsed


# Every `optim` transformers builds from bitsandbytes (transformers.trainer_optimizer._BITSANDBYTES_OPTIMIZERS: an
# ImportError at train start without the package), written out so that this check never imports transformers before
# Unsloth; tests/test_config.py keeps the two equal.
BITSANDBYTES_OPTIMIZERS = frozenset({
    "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit", "ademamix", "ademamix_8bit",
    "paged_ademamix_32bit", "paged_ademamix_8bit", "lion_32bit", "lion_8bit", "paged_lion_32bit",
    "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
})
OPTIM_WITHOUT_BITSANDBYTES = "adamw_torch"


def resolve_optim(cfg: PipelineConfig) -> tuple[PipelineConfig, Optional[str]]:
    """The config a run trains with, and why when it differs: a bitsandbytes optimizer without bitsandbytes
    installed becomes adamw_torch, with a note (as the plain backend's 4-bit loading falls back).

    >>> cfg, note = resolve_optim(PipelineConfig().replace(optim="adamw_torch"))
    >>> cfg.grpo.optim, note
    ('adamw_torch', None)
    """
    optim = cfg.grpo.optim
    if optim not in BITSANDBYTES_OPTIMIZERS or importlib.util.find_spec("bitsandbytes") is not None:
        return cfg, None
    note = (f"optim: {optim} is a bitsandbytes optimizer, but bitsandbytes is not installed here: training "
            f"with {OPTIM_WITHOUT_BITSANDBYTES} instead (32-bit optimizer states: about 4x the 8-bit ones' memory, "
            "small for a LoRA). For "
            f"{optim}, install bitsandbytes (`pip install bitsandbytes==0.50.2`, the pinned one; its wheel carries "
            f"CUDA 12 and 13 kernels), or set optim: {OPTIM_WITHOUT_BITSANDBYTES} to silence this.")
    return cfg.replace(optim=OPTIM_WITHOUT_BITSANDBYTES), note


def validate(cfg: PipelineConfig, n_processes: int | None = None, backend: str | None = None,
             run_user_code: bool = True) -> list[str]:
    """Check the config; raise ConfigError on the first fatal problem, return warnings. `backend`: the resolved
    backend's name when known, whose BACKEND_RULES run.

    >>> validate(PipelineConfig().replace(num_generations=1))
    Traceback (most recent call last):
    ...
    grpo_pipeline.pipeline.config.fields.ConfigError: config error in `num_generations`: got 1; it must be >= 2 ...
    """
    m, lo, g = cfg.model, cfg.lora, cfg.grpo
    notes: list[str] = []
    n_processes = n_processes or world_size()
    check_field_values(cfg)

    if g.max_steps == 0:  # the Trainer would take one step and report success
        raise ConfigError("max_steps", "got 0, which trains nothing; give the number of optimizer steps (e.g. 250), "
                          "or -1 to train num_train_epochs.")
    global_batch = g.per_device_train_batch_size * g.gradient_accumulation_steps * n_processes
    if global_batch % g.num_generations != 0:  # (each factor >= 1: check_field_values)
        raise ConfigError(
            "per_device_train_batch_size",
            f"per_device_train_batch_size ({g.per_device_train_batch_size}) x gradient_accumulation_steps "
            f"({g.gradient_accumulation_steps}) x processes ({n_processes}) = {global_batch} is not divisible by "
            f"num_generations ({g.num_generations}). TRL counts completions, not prompts, in this batch: set "
            f"per_device_train_batch_size to a multiple of {g.num_generations} (e.g. {g.num_generations}). "
            "(Unsloth would silently rewrite the batch size; we refuse instead so the run does what you wrote.)",
        )
    # The prompt and completion limits fit in max_seq_length (None: auto).
    prompt_limit = parse_limit(cfg.data.max_prompt_length, "max_prompt_length")
    completion_limit = parse_limit(cfg.data.max_completion_length, "max_completion_length")
    if prompt_limit is not None and completion_limit is not None \
            and prompt_limit + completion_limit > m.max_seq_length:
        raise ConfigError(
            "max_completion_length",
            f"max_prompt_length ({prompt_limit}) + max_completion_length ({completion_limit}) = "
            f"{prompt_limit + completion_limit} exceeds max_seq_length ({m.max_seq_length}). Lower one of them, "
            "raise max_seq_length, or set max_completion_length: auto.",
        )
    for name, limit in (("max_prompt_length", prompt_limit), ("max_completion_length", completion_limit)):
        if limit is not None and limit >= m.max_seq_length:
            raise ConfigError(name, f"{limit} leaves no room in max_seq_length ({m.max_seq_length}).")
    check_adapter_rank(lo.lora_r, m.max_lora_rank, what="the adapter this run trains (lora_r)",
                       fix=f"Raise max_lora_rank to {lo.lora_r} or lower lora_r.", field_name="lora_r")
    # The generation settings used after training: a sampling temperature, no answer past the trained length.
    gen = cfg.generation
    check_generation_temperature(gen.gen_temperature, "gen_temperature")
    if gen.gen_max_tokens is not None and completion_limit is not None and gen.gen_max_tokens > completion_limit \
            and not gen.allow_longer_generation:  # (gen_max_tokens >= 1: check_field_values)
        raise ConfigError(
            "gen_max_tokens",
            f"gen_max_tokens ({gen.gen_max_tokens}) exceeds the trained max_completion_length "
            f"({completion_limit}); answers past the trained length are often cut before </answer>. "
            "Lower it, or set allow_longer_generation: true.",
        )
    if not (1e-7 <= g.learning_rate <= 1e-3):  # <= 0 was refused by check_field_values
        notes.append(f"learning_rate {g.learning_rate:g} is outside 1e-7..1e-3; GRPO with LoRA usually uses "
                     "1e-6..5e-5 (the notebooks: 5e-6).")

    if cfg.health.adaptive_beta and g.beta <= 0:
        raise ConfigError("adaptive_beta", "needs beta > 0 at the start: with beta = 0 TRL loads no reference "
                          "model, so there is no KL to steer. Set beta: 0.04, or adaptive_beta: false.")
    if cfg.health.adaptive_beta and cfg.health.beta_min > cfg.health.beta_max:  # (>= 0: check_field_values)
        raise ConfigError("beta_min", f"need 0 <= beta_min ({cfg.health.beta_min}) <= beta_max "
                          f"({cfg.health.beta_max}).")
    params = sampling_params_mapping(g.vllm_sampling_params)
    for key, where in UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS.items():
        if key in params:
            raise ConfigError("vllm_sampling_params", f"`{key}` is ignored there (Unsloth takes it from the "
                              f"trainer config); set `{where}` instead.")

    flat = cfg.to_dict()
    for rule in BACKEND_RULES.get(backend or m.backend, ()):  # auto: the backend is not known yet
        rule(**{name: flat[name] for name in inspect.signature(rule).parameters})  # the options it names
    if m.vllm_mode == "server" and not m.vllm_server_base_url:
        notes.append("vllm_mode=server without vllm_server_base_url: TRL will use host 0.0.0.0:8000.")
    _check_rewards(g, run_user_code)
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return notes


def check_truncated_sampling(min_p: Optional[float], top_p: float, top_k: int, vllm_mode: str,
                             vllm_importance_sampling_correction: bool) -> None:
    """Refuse TRL's vLLM rollouts with its importance-sampling correction and a truncating sampler: the ratio
    collapses to ~0 and scales the loss with it, so the run learns nothing and says nothing (a recipe rule).

    TRL compares vLLM's log-probabilities, taken after the sampler truncated and renormalised the distribution
    (LLM(logprobs_mode="processed_logprobs"), trl/generation/vllm_generation.py), with the trainer's, from the whole
    distribution. The message's ratios: one GRPO step, tiny model on vLLM's CPU build, 8 x 32-token completions."""
    samplers = (("min_p", min_p, bool(min_p)), ("top_p", top_p, top_p < 1), ("top_k", top_k, top_k > 0))
    cuts = [f"{name} {value:g}" for name, value, cuts_it in samplers if cuts_it]
    if vllm_mode == "none" or not vllm_importance_sampling_correction or not cuts:
        return
    field = cuts[0].split()[0]
    raise ConfigError(field, f"{', '.join(cuts)} with vLLM rollouts (vllm_mode: {vllm_mode}) and "
                      "vllm_importance_sampling_correction: true: TRL scores vLLM's truncated sampling "
                      "log-probabilities against the trainer's full ones, and the importance ratio that scales the "
                      "loss collapses (measured on one step: 1.4e-06 with min_p 0.1, 0.068 with top_p 0.9, 2.1e-04 "
                      "with top_k 20, against 1.009 without), so nothing is learned. Either sample from the whole "
                      "distribution (min_p: null, top_p: 1.0, top_k: 0), or set "
                      "vllm_importance_sampling_correction: false.")


def _check_rewards(g: Any, run_user_code: bool = True) -> None:
    """reward_funcs name known rewards and reward_weights match them; without `run_user_code` no module is imported
    (docs/security.md). No reward_funcs with an environment_factory is TRL's form: the environment's get_reward."""
    if isinstance(g.reward_funcs, list) and not g.reward_funcs and g.environment_factory:
        if g.reward_weights:
            raise ConfigError("reward_weights", f"{len(g.reward_weights)} weights for no reward function; an "
                              "environment's get_reward has weight 1, as in TRL. Drop reward_weights.")
        return
    try:
        (get_reward_funcs if run_user_code else check_reward_names)(list(g.reward_funcs))
    except ValueError as err:
        raise ConfigError("reward_funcs", str(err)) from None
    try:
        check_reward_weights(list(g.reward_funcs), g.reward_weights)
    except ValueError as err:
        raise ConfigError("reward_weights", str(err)) from None


def validate_unsloth(lora_modules_to_save: list[Any], lora_target_modules: list[Any], fast_inference: bool,
                     vllm_sampling_params: Any, vllm_standby: str) -> None:
    """What the Unsloth backend refuses only after the model (and vLLM) have loaded, refused up front."""
    # FastLlamaModel.get_peft_model accepts in modules_to_save only lm_head, embed_tokens and normalization
    # layers (TypeError "Module = ... is not allowed"), checked after the model has loaded.
    others = [name for name in lora_modules_to_save
              if str(name).rsplit(".", 1)[-1] not in EMBEDDING_MODULES and "norm" not in str(name).rsplit(".", 1)[-1]]
    if others:
        raise ConfigError("lora_modules_to_save", f"got {others}; Unsloth trains in full only lm_head, embed_tokens "
                          "and normalization layers (e.g. norm, input_layernorm). Put other modules in "
                          "lora_target_modules, or use backend: plain.")
    if fast_inference and lora_modules_to_save:
        # FastLlamaModel.get_peft_model raises NotImplementedError ("fast inference does not work with training
        # embeddings or lm_head") with a vLLM engine, for any modules_to_save but None (the backend passes None).
        raise ConfigError("lora_modules_to_save", f"got {list(lora_modules_to_save)}, but Unsloth cannot train "
                          "modules in full while vLLM serves the model (fast_inference: true). Remove "
                          "lora_modules_to_save, set fast_inference: false (slower generation), or use "
                          "backend: plain.")
    embeddings = [name for name in lora_target_modules if str(name).rsplit(".", 1)[-1] in EMBEDDING_MODULES]
    if fast_inference and embeddings:
        # With a vLLM engine, get_peft_model moves embed_tokens from target_modules to modules_to_save and then
        # raises as above; it leaves lm_head as a LoRA target that never trains (_vllm_unmovable_embedding_modules,
        # _redirect_embedding_targets in unsloth/models/_utils.py), a silent no-op.
        raise ConfigError("lora_target_modules", f"contains {embeddings}: with vLLM (fast_inference: true) Unsloth "
                          "cannot train embeddings or lm_head (embed_tokens is refused, lm_head would stay "
                          "untrained). Remove them, or set fast_inference: false (they are then trained in full).")
    if not fast_inference:
        if sampling_params_mapping(vllm_sampling_params):
            raise ConfigError("vllm_sampling_params", "is for vLLM, and fast_inference: false runs without it, so "
                              "it would be ignored. Remove it, or set fast_inference: true.")
        if vllm_standby == "true":
            raise ConfigError("vllm_standby", "standby puts vLLM to sleep between rollouts, and fast_inference: "
                              "false runs without vLLM. Set vllm_standby: auto or false, or fast_inference: true.")


# The recipe rules of each backend (Backend.RECIPE_RULES; register_backend adds a new one's). A rule's parameters
# are the options it reads, by name.
BACKEND_RULES: dict[str, tuple[Any, ...]] = {"unsloth": (validate_unsloth,), "plain": (check_truncated_sampling,)}
