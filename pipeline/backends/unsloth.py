"""Unsloth backend: FastLanguageModel (4-bit LoRA) + vLLM (`fast_inference`) + TRL's GRPOTrainer.

Written against unsloth 2026.10.9 / unsloth_zoo 2026.10.9 / vLLM 0.31.0 / trl 1.15.0; the
file:line references below point into those released wheels. It is single-GPU: vLLM runs
inside the training process on the same card and shares the model weights with it.

`fast_inference: false` runs Unsloth without vLLM: the same 4-bit LoRA model, but Unsloth's patched
GRPOTrainer generates with transformers, and eval/generate use FastLanguageModel.for_inference + generate.

Importing this module imports nothing heavy. `prepare_environment(cfg)` (pipeline/backends/unsloth_setup.py,
with the from_pretrained arguments every loader here shares) must run before trl, transformers or peft are
imported; `grpo` calls it at start-up (pipeline/bootstrap.py) and every entry point below calls it again.

The contract tests (tests/test_unsloth_*.py) replace unsloth and vllm with a recording
fake and check the exact calls made here; nothing in this file has been run on a GPU by them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional

from env.paths import absolute_path, atomic_write_json, cache_root
from pipeline.backends import EXPORT_METHODS, Completion, mixed_precision, score_with_vllm
from pipeline.backends.gpu_settings import (  # noqa: F401  (re-exported: callers and the README use them from here)
    EVAL_SLEEP_LEVEL,
    choose_gpu_memory_utilization,
    refuse_vllm_sleep_mode,
    resolve_gpu_memory_utilization,
    standby_enabled,
)
from pipeline.backends.plain import PlainGenerator
from pipeline.backends.unsloth_config import config_rewrites, predicted_config_kwargs  # noqa: F401 (Backend)
from pipeline.backends.unsloth_setup import from_pretrained_kwargs, gradient_checkpointing_mode, prepare_environment
from pipeline.config import (  # UNSLOTH_OVERRIDDEN...: rl_replacements.grpo_update_SamplingParams
    UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS,
    ConfigError,
    PipelineConfig,
    check_adapter_rank,
    sampling_params_mapping,
    validate_unsloth,
)
from pipeline.data.tokenizer import resolve_model_path
from pipeline.run.manifest import other_base

NAME = "unsloth"

DEFAULT_GGUF_QUANTIZATION = "q4_k_m"  # Unsloth's "Recommended" k-quant (unsloth_save_pretrained_gguf)
# save_pretrained_gguf writes the merged 16-bit checkpoint into save_directory and the .gguf
# files into the SIBLING folder f"{save_directory}_gguf" (save._gguf_output_directory). We point
# save_directory at a child of out_dir so both land inside the caller's atomic temp folder.
GGUF_MERGED_SUBDIR = "merged"
# Where training_generator's live LoRA config goes (inside output_dir; see training_generator).
LIVE_LORA_SUBDIR = ".vllm_live_lora"


def serves_with_vllm(model: Any, cfg: PipelineConfig) -> bool:
    """Whether generation goes through vLLM: the model Unsloth returned carries a `vllm_engine`, not merely
    fast_inference: true in the config. Unsloth switches vLLM off by itself on a GPU below compute capability 7,
    on DGX Spark (FastLanguageModel.from_pretrained in unsloth/models/loader.py) and when vLLM does not import
    (fast_inference_setup in unsloth/models/_utils.py); use_vllm=True then would make Unsloth's patched
    `_init_vllm` build a second engine. Said once on the console (a warning) when it differs from the config.
    """
    engine = hasattr(model, "vllm_engine")
    if cfg.model.fast_inference and not engine and not getattr(model, "_grpo_said_no_vllm", False):
        warnings.warn("fast_inference: true, but Unsloth returned the model without a vLLM engine (it turns vLLM "
                      "off itself on GPUs below compute capability 7, on DGX Spark, or when vllm does not import; "
                      "its log above says which): rollouts and eval generate with transformers instead (slower). "
                      "Set fast_inference: false to say so in the config.", stacklevel=2)
        try:
            model._grpo_said_no_vllm = True
        except AttributeError:
            pass
    return engine


def unsloth_model_name(name: str) -> str:
    """What FastLanguageModel.from_pretrained is given for a model name: a built-in model's folder, else the name.

    A hub id stays a hub id with `model_source: modelscope` too: prepare_environment sets UNSLOTH_USE_MODELSCOPE=1
    before `import unsloth` (unsloth/models/_utils.py reads it at import, into USE_MODELSCOPE), and then
    from_pretrained maps the name to its pre-quantised repo (mapper.py, get_model_name), downloads that with
    modelscope.snapshot_download and records the repo id as the model's name (_record_modelscope_repo_id), all
    only `if USE_MODELSCOPE and not os.path.exists(model_name)` (unsloth/models/loader.py). A snapshot folder
    handed in would skip all three. (The plain backend downloads the snapshot itself: env/hubs.py.)
    """
    return resolve_model_path(name)  # source "hf": a built-in name becomes its folder, a hub id passes unchanged


@contextlib.contextmanager
def unsloth_adapter_folder(adapter: Any) -> Iterator[str]:
    """The adapter folder to hand FastLanguageModel.from_pretrained, which loads the base its adapter_config.json
    names (unsloth/models/loader.py: `model_name = peft_config.base_model_name_or_path`, then AutoConfig).

    A built-in base is recorded by its name (pipeline/run/manifest.py recorded_base), which Unsloth cannot load:
    then, while the caller uses it, a temporary view of the folder (its files linked, not copied) whose
    adapter_config.json names the built-in model's folder instead. Any other base is handed over as recorded.
    """
    path = absolute_path(adapter.path)
    recorded = adapter.base_model_name_or_path
    loadable = unsloth_model_name(recorded) if recorded else recorded
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
        **from_pretrained_kwargs(cfg, unsloth_model_name(cfg.model.model_name_or_path),
                                  fast_inference=cfg.model.fast_inference, standby=prepared.standby)
    )
    # FastLlamaModel.get_peft_model. It ends with patch_peft_fast_inference (unsloth/models/_utils.py),
    # which attaches save_lora (always) and, with a vLLM engine, load_lora/fast_generate to the PeftModel.
    model = FastLanguageModel.get_peft_model(
        model,
        r=cfg.lora.lora_r,
        target_modules=list(cfg.lora.lora_target_modules),
        lora_alpha=cfg.lora.lora_alpha,
        lora_dropout=cfg.lora.lora_dropout,  # 0 keeps the fused LoRA kernels on (llama._fused_lora_skip_reason)
        use_gradient_checkpointing=gradient_checkpointing_mode(cfg),
        random_state=cfg.grpo.seed,
        modules_to_save=list(cfg.lora.lora_modules_to_save) or None,
    )
    _anchor_live_lora(model, absolute_path(cfg.grpo.output_dir) / LIVE_LORA_SUBDIR)
    return model, tokenizer


def _anchor_live_lora(model: Any, folder: Path) -> None:
    """Make `model.load_lora` put a RELATIVE folder under `folder` (the run's) instead of the working directory.

    Unsloth's patched trainer calls `model.load_lora(<relative name>, load_tensors=True)` on every vLLM rollout:
    "vllm_gen_lora[_<CUDA_VISIBLE_DEVICES>]" (rl_replacements.py, the VLLMGeneration.generate wrapper, which
    takes model.load_lora at trainer init) or "<trainer>_lora_model" (rl.py, the self.llm.generate rewrite),
    and unsloth_zoo's load_lora writes the live adapter_config.json into that folder (_live_lora_config).
    Absolute paths (ours: training_generator, load_generator) pass through unchanged.
    """
    load_lora = getattr(model, "load_lora", None)
    if load_lora is None:  # no vLLM engine: no live LoRA either
        return

    @functools.wraps(load_lora)
    def anchored(save_directory, *args, **kwargs):
        path = Path(save_directory)
        return load_lora(str(path if path.is_absolute() else folder / path), *args, **kwargs)

    model.load_lora = anchored


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

    - `use_vllm`: True exactly when the model carries a vLLM engine (serves_with_vllm): generation then goes
      through it (Unsloth's patched trainer reuses `model.vllm_engine`, vllm_mode='colocate'; no second LLM).
      Without one, Unsloth's patched trainer generates with transformers and no vLLM field is passed.
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
    use_vllm = serves_with_vllm(model, cfg)
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
    (unsloth_zoo.vllm_utils.save_lora). The path is made absolute so nothing depends on the
    working directory (the caller passes the temp folder of env.paths.atomic_directory).
    """
    directory = absolute_path(directory)
    model.save_lora(str(directory))
    tokenizer.save_pretrained(str(directory))


def _warn_if_other_base(adapter: Any, base_model: str) -> None:
    """Warn when the adapter names another base than `base_model` (pipeline/run/manifest.py other_base compares
    hub ids and built-in names, and Unsloth's 4-bit repo names as the model they quantise)."""
    recorded = adapter.base_model_name_or_path  # from adapter_config.json (env.adapters.AdapterInfo)
    if other_base(recorded, base_model):
        warnings.warn(
            f"The adapter at {adapter.path} was trained on {recorded!r} (adapter_config.json) but base model "
            f"{base_model!r} was given. A LoRA on the wrong base loads without error and produces garbage; "
            "pass the base it was trained on.",
            stacklevel=3,
        )


def _check_adapter_rank(adapter: Any, cfg: PipelineConfig) -> None:
    """Refuse before loading anything: vLLM reserves LoRA slots of max_lora_rank at start-up, and
    unsloth_zoo would only refuse after the engine is built (unsloth_zoo.vllm_utils._check_lora_rank_fits)."""
    rank = int(adapter.r)
    check_adapter_rank(rank, cfg.model.max_lora_rank, what=f"the adapter at {adapter.path}",
                       fix=f"Pass --max_lora_rank {rank} (or higher).")


class UnslothGenerator:
    """Generation through the model's vLLM engine, with one LoRA request reused for every call."""

    def __init__(self, model: Any, tokenizer: Any, lora_request: Any, wake_engine: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        # Built once: unsloth_zoo's load_lora hands out a new adapter id on every call
        # (unsloth_zoo.vllm_utils.load_lora, _build_lora_request), and each new id is a new adapter for vLLM to load.
        self.lora_request = lora_request
        self.wake_engine = wake_engine

    def generate(self, prompts: list[str], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, min_p: Optional[float] = None) -> list[Completion]:
        """One completion per chat-templated prompt. temperature 0 is greedy in vLLM."""
        if not prompts:
            return []
        from vllm import SamplingParams

        # max_tokens must be set: vLLM's default is 16 tokens. top_k 0 / min_p 0 are vLLM's "off" too.
        rollout = {key: value for key, value in (("top_k", top_k), ("min_p", min_p)) if value}
        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, **rollout)
        slept = self._wake_if_sleeping()
        try:
            # model.fast_generate is vLLM's LLM.generate (set in FastLlamaModel.from_pretrained); lora_request=None
            # is passed explicitly for the base model so nothing falls back to an adapter loaded earlier.
            outputs = self.model.fast_generate(list(prompts), sampling_params=params,
                                               lora_request=self.lora_request)
        finally:
            if slept:
                self._sleep()
        return [Completion(output.outputs[0].text, len(output.outputs[0].token_ids)) for output in outputs]

    def _wake_if_sleeping(self) -> bool:
        """In standby the trainer puts vLLM to sleep after each rollout and wakes it before the next
        (rl_replacements.grpo_trainer__generate_and_score_completions); eval outside those rollouts must
        do the same."""
        if not self.wake_engine:
            return False
        engine = self.model.vllm_engine
        if engine.llm_engine.is_sleeping():  # as unsloth's _keep_awake (unsloth/models/_async_grpo_vllm.py)
            engine.wake_up()
            return True
        return False

    def _sleep(self) -> None:
        # Back to sleep, as the trainer expects (its next sync_weights wakes the engine again).
        self.model.vllm_engine.sleep(EVAL_SLEEP_LEVEL)


class UnslothRolloutEngine(UnslothGenerator):
    """The rollouts' vLLM engine as the rollout probe scores it (pipeline/health/rollout.py): each `score` first
    sends the trainer's current adapter the way Unsloth's patched trainer does before every rollout
    (`model.load_lora(<folder>, load_tensors=True)`, rl_replacements.vllm_generation_init_patch), waking the engine
    in standby as eval does, then scores the probe through fast_generate's prompt_logprobs."""

    def __init__(self, model: Any, tokenizer: Any, folder: Path):
        super().__init__(model, tokenizer, lora_request=None, wake_engine=True)
        self.folder = folder

    def score(self, prompt_ids: list[int], continuation_ids: list[int]) -> list[float]:
        self.folder.mkdir(parents=True, exist_ok=True)
        lora_request = self.model.load_lora(str(self.folder), load_tensors=True)
        slept = self._wake_if_sleeping()
        try:
            return score_with_vllm(self.model.fast_generate, prompt_ids, continuation_ids, lora_request=lora_request)
        finally:
            if slept:
                self._sleep()


def rollout_engine(trainer: Any, tokenizer: Any, cfg: PipelineConfig) -> Optional[UnslothRolloutEngine]:
    """With a vLLM engine (serves_with_vllm) the rollouts come from it; without, from the trained model itself."""
    if not serves_with_vllm(trainer.model, cfg) or getattr(trainer.model, "load_lora", None) is None:
        return None
    folder = absolute_path(cfg.grpo.output_dir) / LIVE_LORA_SUBDIR / "probe"
    return UnslothRolloutEngine(trainer.model, tokenizer, folder)


class UnslothTransformersGenerator(PlainGenerator):
    """fast_inference: false: Unsloth's own inference path, `FastLanguageModel.for_inference` + `model.generate`.

    for_inference turns off gradient checkpointing and switches Unsloth's fast decoding on; a model that is
    still being trained is handed back with `for_training` afterwards. Batching, padding and decoding are
    the plain backend's (one home for transformers generation).
    """

    def __init__(self, model: Any, tokenizer: Any, back_to_training: bool):
        super().__init__(model, tokenizer)
        self.back_to_training = back_to_training

    def generate(self, prompts: list[str], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, min_p: Optional[float] = None) -> list[Completion]:
        if not prompts:
            return []
        from unsloth import FastLanguageModel

        FastLanguageModel.for_inference(self.model)
        try:
            return super().generate(prompts, max_tokens, temperature, top_p, top_k, min_p)
        finally:
            if self.back_to_training:
                FastLanguageModel.for_training(self.model)


def training_generator(model: Any, tokenizer: Any, cfg: PipelineConfig):
    """Generate with the LoRA model being trained (eval before/after in `grpo train`).

    `model.load_lora(..., load_tensors=True)` sends the adapter's *current* in-memory tensors to
    vLLM, the way Unsloth's GRPO rollouts do (rl_replacements.vllm_generation_init_patch). It writes the live
    adapter_config.json into the folder it is given (unsloth_zoo.vllm_utils._live_lora_config), so that folder is a
    hidden one in output_dir. Call this again after training: each call snapshots the weights.
    """
    if not serves_with_vllm(model, cfg):
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

    `adapter` is an env.adapters.AdapterInfo from verify_adapter_dir, so `adapter.path` is absolute:
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
        **from_pretrained_kwargs(cfg, unsloth_model_name(base_model), fast_inference=True, standby=prepared.standby)
    )
    if not serves_with_vllm(model, cfg):  # Unsloth turned vLLM off: its transformers path, from the adapter folder
        del model
        return _load_transformers_generator(base_model, adapter, cfg)
    lora_request = None
    if adapter is not None:
        # `model.load_lora` exists only on a PeftModel (patch_peft_fast_inference in unsloth/models/_utils.py);
        # a base model from from_pretrained has the vLLM engine but not the method. The path branch of
        # unsloth_zoo's load_lora needs only model.vllm_engine (rank check, servability check) and
        # returns LoRARequest(str(id), id, path) (unsloth_zoo.vllm_utils.load_lora), so we bind it ourselves,
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

    with (unsloth_adapter_folder(adapter) if adapter is not None
          else contextlib.nullcontext(unsloth_model_name(base_model))) as source:
        model, tokenizer = FastLanguageModel.from_pretrained(
            **from_pretrained_kwargs(cfg, source, fast_inference=False, standby=False))
    if adapter is not None and not getattr(model, "peft_config", None):
        raise RuntimeError(f"Unsloth loaded {adapter.path} without its LoRA adapter (the model has no peft_config); "
                           "refusing to generate with the base model in its place. Check adapter_config.json there.")
    return UnslothTransformersGenerator(model, tokenizer, back_to_training=False)


def export(adapter: Any, base_model: str, method: str, out_dir: Path, cfg: PipelineConfig,
           system_prompt: Optional[str] = None, gguf_quantization: str = DEFAULT_GGUF_QUANTIZATION) -> None:
    """Merge the adapter into its base and write it into `out_dir` (a temp folder the caller owns).

    - merged16: `save_pretrained_merged(save_method="merged_16bit")`. Unsloth merges into the
      original 16-bit checkpoint, not the 4-bit weights in memory (merge_and_overwrite_lora,
      called from save.unsloth_generic_save).
    - merged4: `save_method="merged_4bit_forced"`. Plain "merged_4bit" raises a RuntimeError asking
      for "_forced" (save.unsloth_generic_save); it merges into the loaded 4-bit weights, so we load in 4-bit.
    - gguf: `save_pretrained_gguf(quantization_method=gguf_quantization)` (save.unsloth_save_pretrained_gguf), which
      builds llama.cpp on first use. Files: out_dir/merged (16-bit) and out_dir/merged_gguf (*.gguf).

    The model is loaded from the adapter folder: Unsloth reads adapter_config.json, loads the base it
    names and applies the adapter with PeftModel (FastLanguageModel.from_pretrained); vLLM is not needed.
    """
    if method not in EXPORT_METHODS:
        raise ConfigError("to", f"got {method!r}; choose one of {', '.join(EXPORT_METHODS)}.")
    if method == "gguf" and not (isinstance(gguf_quantization, str) and gguf_quantization.strip()):
        raise ConfigError("gguf_quantization", f"got {gguf_quantization!r}; use a llama.cpp type such as q4_k_m, "
                          "q8_0 or f16.")
    _warn_if_other_base(adapter, base_model)
    with unsloth_adapter_folder(adapter) as folder:  # the merge below reads the base from the loaded model
        _export(folder, method, out_dir, cfg, system_prompt, gguf_quantization)


def _export(folder: str, method: str, out_dir: Path, cfg: PipelineConfig, system_prompt: Optional[str],
            gguf_quantization: str) -> None:
    prepared = prepare_environment(cfg)
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        **from_pretrained_kwargs(cfg, folder, fast_inference=False,
                                  standby=prepared.standby, load_in_4bit=True if method == "merged4" else None)
    )
    # Absolute: Unsloth moves *relative* save paths elsewhere on Kaggle (save.py _preflight_merge_disk).
    out_dir = absolute_path(out_dir)
    from pipeline.data.prompts import carry_system_prompt

    carry_system_prompt(tokenizer, system_prompt)  # before the save: the .gguf's metadata carries it too
    if method == "merged16":
        model.save_pretrained_merged(str(out_dir), tokenizer, save_method="merged_16bit")
    elif method == "merged4":
        model.save_pretrained_merged(str(out_dir), tokenizer, save_method="merged_4bit_forced")
    else:
        model.save_pretrained_gguf(str(out_dir / GGUF_MERGED_SUBDIR), tokenizer,
                                   quantization_method=gguf_quantization.strip().lower())
