"""Unsloth backend, generation: through the model's vLLM engine (fast_inference), or Unsloth's transformers path."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.pipeline.backends import Completion
from grpo_pipeline.pipeline.backends.gpu_settings import EVAL_SLEEP_LEVEL
from grpo_pipeline.pipeline.backends.plain import PlainGenerator
from grpo_pipeline.pipeline.backends.vllm_engine import generate_with_vllm, score_with_vllm
from grpo_pipeline.pipeline.backends.unsloth_setup import (
    LIVE_LORA_SUBDIR,
    from_pretrained,
    serves_with_vllm,
    unsloth_adapter_folder,
    warn_if_other_base,
)
from grpo_pipeline.pipeline.config import PipelineConfig, check_adapter_rank


class UnslothGenerator:
    """Generation through the model's vLLM engine, one LoRA request for all calls (unsloth_zoo load_lora: new ids)."""

    def __init__(self, model: Any, tokenizer: Any, lora_request: Any, wake_engine: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.lora_request = lora_request
        self.wake_engine = wake_engine

    def generate(self, prompts: list[str] | list[list[int]], max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, min_p: Optional[float] = None) -> list[Completion]:
        if not prompts:
            return []
        with self._awake():
            # lora_request=None is explicit: the base model, never an adapter loaded earlier
            return generate_with_vllm(self.model.fast_generate, prompts, max_tokens, temperature, top_p, top_k,
                                      min_p, lora_request=self.lora_request)

    @contextlib.contextmanager
    def _awake(self):
        """Wake a standby engine and sleep it after, as around each rollout (unsloth/models/_async_grpo_vllm.py
        _keep_awake; rl_replacements.grpo_trainer__generate_and_score_completions)."""
        engine = self.model.vllm_engine if self.wake_engine else None
        slept = engine is not None and engine.llm_engine.is_sleeping()
        if slept:
            engine.wake_up()
        try:
            yield
        finally:
            if slept:
                engine.sleep(EVAL_SLEEP_LEVEL)


class UnslothRolloutEngine(UnslothGenerator):
    """The rollouts' engine for the rollout probe: each `score` first sends the current adapter as Unsloth's trainer
    does (`model.load_lora(<folder>, load_tensors=True)`: rl_replacements.vllm_generation_init_patch)."""

    def __init__(self, model: Any, tokenizer: Any, folder: Path):
        super().__init__(model, tokenizer, lora_request=None, wake_engine=True)
        self.folder = folder

    def score(self, prompt_ids: list[int], continuation_ids: list[int]) -> list[float]:
        self.folder.mkdir(parents=True, exist_ok=True)
        lora_request = self.model.load_lora(str(self.folder), load_tensors=True)
        with self._awake():
            return score_with_vllm(self.model.fast_generate, prompt_ids, continuation_ids, lora_request=lora_request)


def rollout_engine(trainer: Any, tokenizer: Any, cfg: PipelineConfig) -> Optional[UnslothRolloutEngine]:
    if (not serves_with_vllm(trainer.model, cfg.model.fast_inference)
            or getattr(trainer.model, "load_lora", None) is None):
        return None
    folder = absolute_path(cfg.grpo.output_dir) / LIVE_LORA_SUBDIR / "probe"
    return UnslothRolloutEngine(trainer.model, tokenizer, folder)


class UnslothTransformersGenerator(PlainGenerator):
    """fast_inference: false: the plain `generate` between `for_inference` and (still training) `for_training`."""

    def __init__(self, model: Any, tokenizer: Any, back_to_training: bool):
        super().__init__(model, tokenizer)
        self.back_to_training = back_to_training

    def generate(self, prompts: list[str] | list[list[int]], max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, min_p: Optional[float] = None) -> list[Completion]:
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
    """Generate with the LoRA being trained: its *current* tensors sent to vLLM per call, as Unsloth's rollouts do."""
    if not serves_with_vllm(model, cfg.model.fast_inference):
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
    """Base model in vLLM plus the adapter by its absolute path (vllm/lora/utils.py get_adapter_absolute_path takes a
    relative one it cannot find for a Hub repo id)."""
    if not cfg.model.fast_inference:
        return _load_transformers_generator(base_model, adapter, cfg)
    if adapter is not None:
        # Before loading: unsloth_zoo refuses only after the engine is built (_check_lora_rank_fits).
        rank = int(adapter.r)
        check_adapter_rank(rank, cfg.model.max_lora_rank, what=f"the adapter at {adapter.path}",
                           fix=f"Pass --max_lora_rank {rank} (or higher).")
        warn_if_other_base(adapter, base_model)
    model, tokenizer = from_pretrained(cfg, base_model, fast_inference=True)
    if not serves_with_vllm(model, cfg.model.fast_inference):
        del model  # Unsloth turned vLLM off
        return _load_transformers_generator(base_model, adapter, cfg)
    lora_request = None
    if adapter is not None:
        # `model.load_lora` exists only on a PeftModel, but the path branch of unsloth_zoo's load_lora needs only
        # model.vllm_engine: bound here as patch_peft_fast_inference binds it.
        from unsloth_zoo.vllm_utils import load_lora

        lora_request = load_lora(model, str(absolute_path(adapter.path)))
    return UnslothGenerator(model, tokenizer, lora_request)


def _load_transformers_generator(base_model: str, adapter: Optional[Any], cfg: PipelineConfig):
    """Unsloth without vLLM, from the adapter folder (Unsloth's documented way), checked to carry the adapter."""
    if adapter is not None:
        warn_if_other_base(adapter, base_model)
    with (unsloth_adapter_folder(adapter) if adapter is not None
          else contextlib.nullcontext(base_model)) as source:
        model, tokenizer = from_pretrained(cfg, source, fast_inference=False)
    if adapter is not None and not getattr(model, "peft_config", None):
        raise RuntimeError(f"Unsloth loaded {adapter.path} without its LoRA adapter (the model has no peft_config); "
                           "refusing to generate with the base model in its place. Check adapter_config.json there.")
    return UnslothTransformersGenerator(model, tokenizer, back_to_training=False)
