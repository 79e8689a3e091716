"""Unsloth backend: FastLanguageModel (4-bit LoRA) + vLLM (`fast_inference`) + TRL's GRPOTrainer.

Written against unsloth 2026.10.9 / unsloth_zoo 2026.10.9 / vLLM 0.31.0 / trl 1.15.0; the
file:line references below point into those released wheels. It is single-GPU: vLLM runs
inside the training process on the same card and shares the model weights with it.

`fast_inference: false` runs Unsloth without vLLM: the same 4-bit LoRA model, but Unsloth's patched
GRPOTrainer generates with transformers, and eval/generate use FastLanguageModel.for_inference + generate.

Importing this module imports nothing heavy. `prepare_environment(cfg)` must run before
trl, transformers or peft are imported, because `import unsloth` patches them (and reads
UNSLOTH_VLLM_STANDBY while doing so); every entry point below calls it for you, but only a
call at the very start of the process can get the import order right.

The contract tests (tests/test_unsloth_backend.py) replace unsloth and vllm with a recording
fake and check the exact calls made here; nothing in this file has been run on a GPU by them.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from env.paths import absolute_path
from pipeline.backends import mixed_precision
from pipeline.backends.gpu_settings import (  # noqa: F401  (re-exported: callers and the README use them from here)
    EVAL_SLEEP_LEVEL,
    choose_gpu_memory_utilization,
    refuse_vllm_sleep_mode,
    resolve_gpu_memory_utilization,
    standby_enabled,
)
from pipeline.backends.plain import PlainGenerator
from pipeline.config import (  # UNSLOTH_OVERRIDDEN...: rl_replacements.py:4476-4485
    UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS,
    ConfigError,
    PipelineConfig,
    sampling_params_mapping,
    validate_unsloth,
)
from pipeline.data.tokenizer import resolve_model_path

NAME = "unsloth"

STANDBY_ENV = "UNSLOTH_VLLM_STANDBY"
# `--to` values of `grpo export`, the same names the plain backend takes.
EXPORT_METHODS = ("merged16", "merged4", "gguf")
DEFAULT_GGUF_QUANTIZATION = "q4_k_m"  # Unsloth's "Recommended" k-quant (save.py:4602)
# save_pretrained_gguf writes the merged 16-bit checkpoint into save_directory and the .gguf
# files into the SIBLING folder f"{save_directory}_gguf" (save.py:3965-3967). We point
# save_directory at a child of out_dir so both land inside the caller's atomic temp folder.
GGUF_MERGED_SUBDIR = "merged"
# Where training_generator's live LoRA config goes (inside output_dir; see training_generator).
LIVE_LORA_SUBDIR = ".vllm_live_lora"


@dataclass
class PreparedEnvironment:
    """What `prepare_environment` decided, for logs and the run manifest."""

    standby: bool
    import_order_problems: list[str] = field(default_factory=list)


_prepared: Optional[PreparedEnvironment] = None


def _import_order_problems() -> list[str]:
    """Modules Unsloth must precede that are already imported (env.imports owns the rule)."""
    from env.imports import import_order_problems

    return [str(problem) for problem in import_order_problems()]


def prepare_environment(cfg: PipelineConfig) -> PreparedEnvironment:
    """Set UNSLOTH_VLLM_STANDBY, check the import order, then `import unsloth`. Idempotent.

    Standby must be in the environment *before* `import unsloth`: unsloth_zoo reads it at
    import to keep `expandable_segments` off (unsloth_zoo/__init__.py:321-343) and to install
    vLLM's sleep/wake patches (vllm_utils.py:1125), and `from_pretrained(unsloth_vllm_standby=True)`
    raises if it is unset (llama.py:3538-3541).

    If trl/transformers/peft are already imported we warn (naming them and the fix) rather than
    raise: Unsloth itself only warns (unsloth/_gpu_init.py:135-143) and patches what it can.
    """
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
            # Too late: the import-time patches above were not installed. Setting the variable
            # now would only get us past llama.py's check into a half-configured engine.
            raise RuntimeError(
                "vllm_standby is on, but unsloth was imported before UNSLOTH_VLLM_STANDBY=1 was set. "
                "Restart the process (in a notebook: restart the kernel) and let the pipeline import unsloth, "
                "or set os.environ['UNSLOTH_VLLM_STANDBY'] = '1' before `import unsloth`, or use vllm_standby: false."
            )
        os.environ[STANDBY_ENV] = "1"
    elif current != "0":
        # The config is the source of truth; an exported variable would silently turn standby on
        # (load_vllm ORs it in, vllm_utils.py:4426).
        if "unsloth" in sys.modules:
            raise RuntimeError(
                f"vllm_standby is false, but unsloth was already imported with {STANDBY_ENV}={current}. "
                "Restart the process without that variable, or set vllm_standby: true."
            )
        why = "vllm_standby is false" if cfg.model.fast_inference else "fast_inference: false runs without vLLM"
        warnings.warn(f"{STANDBY_ENV}={current} is set in the environment but {why}; "
                      f"setting {STANDBY_ENV}=0 for this run.", stacklevel=2)
        os.environ[STANDBY_ENV] = "0"

    problems = [] if "unsloth" in sys.modules else _import_order_problems()
    if problems:
        warnings.warn(
            "Unsloth must be imported before " + ", ".join(problems) + ", which are already imported, so some of "
            "its patches (speed, memory) will not apply. Fix: call "
            "pipeline.backends.unsloth.prepare_environment(cfg) (or `import unsloth`) before anything imports "
            "trl, transformers or peft; in a notebook, restart the kernel and run it in the first cell.",
            stacklevel=2,
        )
    import unsloth  # noqa: F401  (the import is the point: it patches trl/transformers/peft)

    _prepared = PreparedEnvironment(standby=standby, import_order_problems=problems)
    return _prepared


def _torch_dtype(cfg: PipelineConfig):
    """`auto` -> None (Unsloth picks bf16 where supported, else fp16: llama.py:3601-3602)."""
    if cfg.model.dtype == "auto":
        return None
    import torch

    # A torch dtype, not the string: loader.py:1369-1376 converts only "float16"/"bfloat16".
    return getattr(torch, cfg.model.dtype)


def _gradient_checkpointing(cfg: PipelineConfig):
    # "unsloth" = Unsloth's offloaded checkpointing (falls back to plain below 512 tokens, _utils.py:502-515).
    return "unsloth" if cfg.lora.gradient_checkpointing else False


def _from_pretrained_kwargs(cfg: PipelineConfig, model_name: str, *, fast_inference: bool,
                            standby: bool, load_in_4bit: Optional[bool] = None) -> dict[str, Any]:
    """Keyword arguments for FastLanguageModel.from_pretrained (loader.py:1241-1271)."""
    kwargs: dict[str, Any] = {
        "model_name": model_name,
        "max_seq_length": cfg.model.max_seq_length,
        "load_in_4bit": cfg.model.load_in_4bit if load_in_4bit is None else load_in_4bit,
        "fast_inference": fast_inference,
        "dtype": _torch_dtype(cfg),
        "random_state": cfg.grpo.seed,
        "use_gradient_checkpointing": _gradient_checkpointing(cfg),
        "trust_remote_code": cfg.model.trust_remote_code,
    }
    if fast_inference:
        kwargs.update(
            # vLLM's LoRA slot size: every adapter it serves must have r <= this (vllm_utils.py:5572-5590).
            max_lora_rank=cfg.model.max_lora_rank,
            gpu_memory_utilization=resolve_gpu_memory_utilization(cfg, standby=standby),
            float8_kv_cache=cfg.model.float8_kv_cache,
        )
        if standby:
            # Not a loader.py parameter: it travels in **kwargs to FastQwen2Model.from_pretrained
            # (qwen2.py:64-91) and on to FastLlamaModel.from_pretrained(unsloth_vllm_standby=...)
            # (llama.py:3509), which hands it to load_vllm (llama.py:4274). load_vllm would also read
            # the environment variable (vllm_utils.py:4426); passing it makes the intent explicit.
            kwargs["unsloth_vllm_standby"] = True
    return kwargs


def load_for_training(cfg: PipelineConfig):
    """from_pretrained(fast_inference=cfg) then get_peft_model: returns (LoRA model, tokenizer).

    The LoRA must be applied here, before the trainer is built: Unsloth's GRPOTrainer rewrites
    `if peft_config is not None:` to `if False:` (see `peft_config` below).
    """
    validate_unsloth(cfg)  # e.g. lora_modules_to_save with vLLM: get_peft_model would refuse after loading
    refuse_vllm_sleep_mode(standby_enabled(cfg))  # the trainer's rollouts would sleep vLLM with it
    prepared = prepare_environment(cfg)
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        **_from_pretrained_kwargs(cfg, resolve_model_path(cfg.model.model_name_or_path),
                                  fast_inference=cfg.model.fast_inference, standby=prepared.standby)
    )
    # llama.py:4569-4590. get_peft_model ends with patch_peft_fast_inference (_utils.py:8079-8102),
    # which attaches save_lora (always) and, with a vLLM engine, load_lora/fast_generate to the PeftModel.
    model = FastLanguageModel.get_peft_model(
        model,
        r=cfg.lora.lora_r,
        target_modules=list(cfg.lora.lora_target_modules),
        lora_alpha=cfg.lora.lora_alpha,
        lora_dropout=cfg.lora.lora_dropout,  # 0 keeps the fused LoRA kernels on (llama.py:3096-3108)
        use_gradient_checkpointing=_gradient_checkpointing(cfg),
        random_state=cfg.grpo.seed,
        modules_to_save=list(cfg.lora.lora_modules_to_save) or None,
    )
    return model, tokenizer


def peft_config(cfg: PipelineConfig) -> None:
    """Always None: Unsloth's patched GRPOTrainer replaces `if peft_config is not None:` with
    `if False:`, so a LoraConfig passed there would be silently ignored. load_for_training
    already applied the LoRA with FastLanguageModel.get_peft_model.

    >>> peft_config(PipelineConfig()) is None
    True
    """
    return None


class SamplingOverrides(dict):
    """`vllm_sampling_params` as Unsloth reads it AND as transformers can write it.

    Unsloth reads only the `_set_kwargs` attribute of this field (grpo_update_SamplingParams in
    unsloth/models/rl_replacements.py, and the `vLLMSamplingParams()._set_kwargs` splice in rl.py), applying
    exactly those keys. Its own `unsloth.vLLMSamplingParams` returns a vLLM SamplingParams with that attribute,
    but UnslothGRPOConfig declares the field as a dataclass field, so TrainingArguments.to_json_string
    (json.dumps(to_dict())), which the TensorBoard and wandb callbacks call at train start, fails on it. A dict
    carrying the same `_set_kwargs` serialises as the mapping and is applied identically.
    """

    @property
    def _set_kwargs(self) -> dict[str, Any]:
        return dict(self)


def grpo_config_kwargs(cfg: PipelineConfig, model: Any) -> dict[str, Any]:
    """Backend-specific GRPOConfig (UnslothGRPOConfig) keyword arguments.

    - `use_vllm`: with fast_inference, generation goes through the model's own vLLM engine (Unsloth would
      set it anyway when `model.vllm_engine` exists, vllm_mode='colocate'; TRL builds no second LLM).
      Without it, Unsloth's patched trainer generates with transformers and no vLLM field is passed.
    - `bf16`/`fp16` from the loaded model's dtype (pipeline.backends.mixed_precision): Unsloth raises
      TypeError when they disagree with the model; with dtype auto the model is bf16 where the GPU supports
      it and fp16 elsewhere (T4, V100). A float32 model gets neither and Unsloth picks autocast itself.
    - `vllm_importance_sampling_correction` from the config: Unsloth would default it to False, TRL to True.
    - `vllm_sampling_params` from the config mapping (see SamplingOverrides). Unsloth copies its fields over
      TRL's generation kwargs (top_p, top_k, min_p, repetition_penalty, ...), except seed, n, temperature,
      max_tokens and logprobs, which come from GRPOConfig (grpo_update_SamplingParams).

    Other Unsloth-specific fields (unsloth_num_chunks=-1, unsloth_grpo_mini_batch=None,
    unsloth_logit_chunk_multiplier=None; rl.py) keep their defaults.
    """
    kwargs: dict[str, Any] = {"use_vllm": bool(cfg.model.fast_inference), **mixed_precision(model)}
    if not cfg.model.fast_inference:
        if sampling_params_mapping(cfg.grpo.vllm_sampling_params):  # validate() refuses this first
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
        from unsloth import vLLMSamplingParams
        from vllm.exceptions import VLLMValidationError  # out-of-range values; not a ValueError subclass

        try:
            vLLMSamplingParams(**mapping)
        except (TypeError, ValueError, VLLMValidationError) as err:  # TypeError: an unknown field (msgspec)
            raise ConfigError("vllm_sampling_params", f"vLLM's SamplingParams rejected {mapping}: {err}. Fix "
                              "or remove that field (see vLLM's SamplingParams).") from None
        kwargs["vllm_sampling_params"] = SamplingOverrides(mapping)
    return kwargs


def save_adapter(model: Any, tokenizer: Any, directory: Path) -> None:
    """`model.save_lora` (adapter_config.json + adapter_model.safetensors) plus the tokenizer.

    save_lora saves only the lora_A/lora_B tensors, cast to the embedding dtype
    (unsloth_zoo/vllm_utils.py:5485-5506). The path is made absolute so nothing depends on the
    working directory (the caller passes the temp folder of env.paths.atomic_directory).
    """
    directory = absolute_path(directory)
    model.save_lora(str(directory))
    tokenizer.save_pretrained(str(directory))


def _normalised_model_name(name: str) -> str:
    """'unsloth/qwen2.5-1.5b-instruct-unsloth-bnb-4bit' and 'Qwen/Qwen2.5-1.5B-Instruct' -> 'qwen2.5-1.5b-instruct'.

    Unsloth maps a 16-bit name to its pre-quantized 4-bit repo when load_in_4bit (loader.py:1432-1441),
    so the adapter records the 4-bit name while the manifest keeps the name the user gave.
    """
    base = str(name).rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix in ("-unsloth-bnb-4bit", "-bnb-4bit", "-unsloth"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base


def _warn_if_other_base(adapter: Any, base_model: str) -> None:
    recorded = adapter.base_model_name_or_path  # from adapter_config.json (env.paths.AdapterInfo)
    if recorded and _normalised_model_name(recorded) != _normalised_model_name(base_model):
        warnings.warn(
            f"The adapter at {adapter.path} was trained on {recorded!r} (adapter_config.json) but base model "
            f"{base_model!r} was given. A LoRA on the wrong base loads without error and produces garbage; "
            "pass the base it was trained on.",
            stacklevel=3,
        )


def _check_adapter_rank(adapter: Any, cfg: PipelineConfig) -> None:
    """Refuse before loading anything: vLLM reserves LoRA slots of max_lora_rank at start-up, and
    unsloth_zoo would only refuse after the engine is built (vllm_utils.py:5572-5590)."""
    rank = int(adapter.r)
    if rank > cfg.model.max_lora_rank:
        raise ConfigError(
            "max_lora_rank",
            f"the adapter at {adapter.path} has rank r={rank}, above max_lora_rank={cfg.model.max_lora_rank}, so "
            f"vLLM cannot serve it. Pass --max_lora_rank {rank} (or higher).",
        )


class UnslothGenerator:
    """Generation through the model's vLLM engine, with one LoRA request reused for every call."""

    def __init__(self, model: Any, tokenizer: Any, lora_request: Any, wake_engine: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        # Built once: unsloth_zoo's load_lora hands out a new adapter id on every call
        # (vllm_utils.py:7196-7200, 7270), and each new id is a new adapter for vLLM to load.
        self.lora_request = lora_request
        self.wake_engine = wake_engine

    def generate(self, prompts: list[str], max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0) -> list[str]:
        """One completion per chat-templated prompt. temperature 0 is greedy in vLLM."""
        if not prompts:
            return []
        from vllm import SamplingParams

        # max_tokens must be set: vLLM's default is 16 tokens.
        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
        slept = self._wake_if_sleeping()
        try:
            # model.fast_generate is vLLM's LLM.generate (llama.py:4297); lora_request=None is passed
            # explicitly for the base model so nothing falls back to an adapter loaded earlier.
            outputs = self.model.fast_generate(list(prompts), sampling_params=params,
                                               lora_request=self.lora_request)
        finally:
            if slept:
                self._sleep()
        return [output.outputs[0].text for output in outputs]

    def _wake_if_sleeping(self) -> bool:
        """In standby the trainer puts vLLM to sleep after each rollout and wakes it before the next
        (rl_replacements.py:2597-2606); eval outside those rollouts must do the same."""
        if not self.wake_engine:
            return False
        engine = self.model.vllm_engine
        if engine.llm_engine.is_sleeping():  # as unsloth's _keep_awake (_async_grpo_vllm.py:432-439)
            engine.wake_up()
            return True
        return False

    def _sleep(self) -> None:
        # Back to sleep, as the trainer expects (its next sync_weights wakes the engine again).
        self.model.vllm_engine.sleep(EVAL_SLEEP_LEVEL)


class UnslothTransformersGenerator(PlainGenerator):
    """fast_inference: false: Unsloth's own inference path, `FastLanguageModel.for_inference` + `model.generate`.

    for_inference turns off gradient checkpointing and switches Unsloth's fast decoding on; a model that is
    still being trained is handed back with `for_training` afterwards. Batching, padding and decoding are
    the plain backend's (one home for transformers generation).
    """

    def __init__(self, model: Any, tokenizer: Any, back_to_training: bool):
        super().__init__(model, tokenizer)
        self.back_to_training = back_to_training

    def generate(self, prompts: list[str], max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0) -> list[str]:
        if not prompts:
            return []
        from unsloth import FastLanguageModel

        FastLanguageModel.for_inference(self.model)
        try:
            return super().generate(prompts, max_tokens, temperature, top_p)
        finally:
            if self.back_to_training:
                FastLanguageModel.for_training(self.model)


def training_generator(model: Any, tokenizer: Any, cfg: PipelineConfig):
    """Generate with the LoRA model being trained (eval before/after in `grpo train`).

    `model.load_lora(..., load_tensors=True)` sends the adapter's *current* in-memory tensors to
    vLLM, the way Unsloth's GRPO rollouts do (rl_replacements.py:5606-5607). It writes the live
    adapter_config.json into the folder it is given (_live_lora_config, vllm_utils.py:5553-5566), so that folder is a
    hidden one in output_dir. Call this again after training: each call snapshots the weights.
    """
    if not cfg.model.fast_inference:
        return UnslothTransformersGenerator(model, tokenizer, back_to_training=True)
    load_lora = getattr(model, "load_lora", None)
    if load_lora is None:
        raise RuntimeError("this model has no load_lora: the unsloth backend generates through the LoRA model "
                           "from load_for_training (FastLanguageModel.get_peft_model with fast_inference=True).")
    live_dir = absolute_path(cfg.grpo.output_dir) / LIVE_LORA_SUBDIR
    live_dir.mkdir(parents=True, exist_ok=True)
    lora_request = load_lora(str(live_dir), load_tensors=True)
    return UnslothGenerator(model, tokenizer, lora_request, wake_engine=True)


def load_generator(base_model: str, adapter: Optional[Any], cfg: PipelineConfig):
    """Base model in vLLM plus the verified adapter (`adapter=None`: the base model alone).

    With fast_inference: false, see `_load_transformers_generator` (no vLLM).

    `adapter` is an env.paths.AdapterInfo from verify_adapter_dir, so `adapter.path` is absolute:
    vLLM treats a relative path that does not exist from its working directory as a Hub repo id
    (vllm/lora/utils.py get_adapter_absolute_path). The tokenizer is the one from_pretrained
    returns, the same call training made.
    """
    if not cfg.model.fast_inference:
        return _load_transformers_generator(base_model, adapter, cfg)
    if adapter is not None:
        _check_adapter_rank(adapter, cfg)
        _warn_if_other_base(adapter, base_model)
    prepared = prepare_environment(cfg)
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        **_from_pretrained_kwargs(cfg, resolve_model_path(base_model), fast_inference=True, standby=prepared.standby)
    )
    lora_request = None
    if adapter is not None:
        # `model.load_lora` exists only on a PeftModel (patch_peft_fast_inference, _utils.py:8079-8089);
        # a base model from from_pretrained has the vLLM engine but not the method. The path branch of
        # unsloth_zoo's load_lora needs only model.vllm_engine (rank check, servability check) and
        # returns LoRARequest(str(id), id, path) (vllm_utils.py:7183-7272), so we bind it ourselves,
        # exactly as patch_peft_fast_inference does.
        from unsloth_zoo.vllm_utils import load_lora

        load_lora_for_model = functools.partial(load_lora, model)
        lora_request = load_lora_for_model(str(absolute_path(adapter.path)))
    return UnslothGenerator(model, tokenizer, lora_request)


def _load_transformers_generator(base_model: str, adapter: Optional[Any], cfg: PipelineConfig):
    """Unsloth without vLLM: `FastLanguageModel.from_pretrained(<adapter folder>)` + for_inference + generate.

    Given an adapter folder, from_pretrained reads adapter_config.json, loads the base it names and applies
    the adapter with PeftModel.from_pretrained (unsloth/models/loader.py) -- Unsloth's documented way to
    load a saved LoRA. We check that the result really is a PEFT model carrying an adapter: generating with
    the bare base model while the user asked for their LoRA is the failure this pipeline never allows.
    """
    if adapter is not None:
        _warn_if_other_base(adapter, base_model)
    prepare_environment(cfg)
    from unsloth import FastLanguageModel

    source = str(absolute_path(adapter.path)) if adapter is not None else resolve_model_path(base_model)
    model, tokenizer = FastLanguageModel.from_pretrained(
        **_from_pretrained_kwargs(cfg, source, fast_inference=False, standby=False))
    if adapter is not None and not getattr(model, "peft_config", None):
        raise RuntimeError(f"Unsloth loaded {adapter.path} without its LoRA adapter (the model has no peft_config); "
                           "refusing to generate with the base model in its place. Check adapter_config.json there.")
    return UnslothTransformersGenerator(model, tokenizer, back_to_training=False)


def export(adapter: Any, base_model: str, method: str, out_dir: Path, cfg: PipelineConfig,
           gguf_quantization: str = DEFAULT_GGUF_QUANTIZATION) -> None:
    """Merge the adapter into its base and write it into `out_dir` (a temp folder the caller owns).

    - merged16: `save_pretrained_merged(save_method="merged_16bit")`. Unsloth merges into the
      original 16-bit checkpoint, not the 4-bit weights in memory (merge_and_overwrite_lora, save.py:6578-6602).
    - merged4: `save_method="merged_4bit_forced"`. Plain "merged_4bit" raises a RuntimeError asking
      for "_forced" (save.py:6389-6395); it merges into the loaded 4-bit weights, so we load in 4-bit.
    - gguf: `save_pretrained_gguf(quantization_method=gguf_quantization)` (save.py:4559), which
      builds llama.cpp on first use. Files: out_dir/merged (16-bit) and out_dir/merged_gguf (*.gguf).

    The model is loaded from the adapter folder: Unsloth reads adapter_config.json, loads the base it
    names and applies the adapter with PeftModel (loader.py:1693-1694, 2082-2091); vLLM is not needed.
    """
    if method not in EXPORT_METHODS:
        raise ConfigError("to", f"got {method!r}; choose one of {', '.join(EXPORT_METHODS)}.")
    if method == "gguf" and not (isinstance(gguf_quantization, str) and gguf_quantization.strip()):
        raise ConfigError("gguf_quantization", f"got {gguf_quantization!r}; use a llama.cpp type such as q4_k_m, "
                          "q8_0 or f16.")
    _warn_if_other_base(adapter, base_model)
    prepared = prepare_environment(cfg)
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        **_from_pretrained_kwargs(cfg, str(absolute_path(adapter.path)), fast_inference=False,
                                  standby=prepared.standby, load_in_4bit=True if method == "merged4" else None)
    )
    # Absolute: Unsloth moves *relative* save paths elsewhere on Kaggle (save.py _preflight_merge_disk).
    out_dir = absolute_path(out_dir)
    if method == "merged16":
        model.save_pretrained_merged(str(out_dir), tokenizer, save_method="merged_16bit")
    elif method == "merged4":
        model.save_pretrained_merged(str(out_dir), tokenizer, save_method="merged_4bit_forced")
    else:
        model.save_pretrained_gguf(str(out_dir / GGUF_MERGED_SUBDIR), tokenizer,
                                   quantization_method=gguf_quantization.strip().lower())
