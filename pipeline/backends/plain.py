"""Plain backend: transformers + peft + TRL, on CPU and on any GPU (4-bit QLoRA with bitsandbytes on CUDA).

TRL applies the LoRA from `peft_config` and generates the rollouts (transformers, or TRL's vLLM colocate/server).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.pipeline.backends import EXPORT_METHODS, Completion
from grpo_pipeline.pipeline.backends.base import BackendBase
from grpo_pipeline.pipeline.backends.trl_cpu_compat import ensure_trl_logprob_kernel
from grpo_pipeline.pipeline.backends.vllm_engine import (
    VllmGenerator,
    engine_arguments,
    follow_the_trainer,
    require_vllm,
    score_with_vllm,
    shared_engine,
    vllm_installed,
)
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig
from grpo_pipeline.pipeline.config.validate import BACKEND_RULES
from grpo_pipeline.pipeline.data.prompts import carry_system_prompt
from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer, resolve_model_path, run_tokenizer
from grpo_pipeline.pipeline.demo.registry import builtin_model

NAME = "plain"


class PlainBackend(BackendBase):

    NAME = NAME
    VLLM_ENGINE = "trl"
    MODULE = __name__
    COUNTERPART = "unsloth"
    KBIT_UPCAST = True
    RECIPE_RULES = BACKEND_RULES[NAME]

    def memory_path(self, vllm_mode: str, fast_inference: bool) -> str:
        return "plain+vllm colocate" if vllm_mode == "colocate" else "plain"


def prepare_environment(cfg: PipelineConfig) -> None:
    return None


def _torch_dtype(dtype: str):
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    if not torch.cuda.is_available():
        return torch.float32  # CPU: fp32 is the only dtype every op supports at full speed
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def load_model(model_name_or_path: str, cfg: PipelineConfig, for_training: bool = True):
    """The base model on this process's GPU when there is one (4-bit when configured and possible), else the CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    builtin = builtin_model(model_name_or_path)
    if builtin is not None and builtin.one_cpu_thread and not torch.cuda.is_available():
        # The demo's matrices are 64 wide: splitting each matmul across threads costs more than it
        # saves, and on a busy machine OpenMP's spinning threads make every step ~5x slower.
        torch.set_num_threads(1)
    kwargs: dict[str, Any] = {"dtype": _torch_dtype(cfg.model.dtype), "trust_remote_code": cfg.model.trust_remote_code}
    # Without a device_map only bitsandbytes moves a model to the GPU, and eval and generate run without TRL's
    # Trainer (which moves it). One GPU per process, as TRL's get_kbit_device_map; under DeepSpeed ZeRO-3 DeepSpeed
    # places the shards (transformers refuses a device_map there).
    if torch.cuda.is_available() and os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") != "3":
        kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", "0"))}
    if cfg.model.load_in_4bit and torch.cuda.is_available() and importlib.util.find_spec("bitsandbytes") is not None:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_use_double_quant=True,
                                                           bnb_4bit_compute_dtype=kwargs["dtype"])
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(model_name_or_path, cfg.model.model_source),
                                                 **kwargs)
    if for_training and "quantization_config" in kwargs:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.lora.gradient_checkpointing)
    return model


def load_for_training(cfg: PipelineConfig, tokenizer: Any = None):
    """Base model + tokenizer; TRL wraps the model with `peft_config(cfg)`."""
    ensure_trl_logprob_kernel()  # CPU-only torch has no Triton: TRL 1.15 needs a torch log-prob path
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg.model.model_name_or_path, cfg.model.trust_remote_code, cfg.model.model_source)
    return load_model(cfg.model.model_name_or_path, cfg), tokenizer


def peft_config(cfg: PipelineConfig):
    from peft import LoraConfig

    return LoraConfig(r=cfg.lora.lora_r, lora_alpha=cfg.lora.lora_alpha, lora_dropout=cfg.lora.lora_dropout,
                      target_modules=list(cfg.lora.lora_target_modules),
                      modules_to_save=list(cfg.lora.lora_modules_to_save) or None, task_type="CAUSAL_LM")


def grpo_config_kwargs(cfg: PipelineConfig, model: Any = None) -> dict[str, Any]:
    import torch

    kwargs: dict[str, Any] = {}
    if torch.cuda.is_available():
        dtype = _torch_dtype(cfg.model.dtype)
        kwargs.update(bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16)
    else:
        # TRL's config defaults bf16=True, which fails at config time on a CPU-only machine.
        kwargs.update(use_cpu=True, bf16=False, fp16=False)
    if cfg.model.vllm_mode == "none":
        kwargs["use_vllm"] = False
    else:
        require_vllm("vllm_mode", "gpu" if torch.cuda.is_available() else "cpu")
        if cfg.model.vllm_mode == "server" and not torch.cuda.is_available():
            # TRL raises NotImplementedError off CUDA in GRPOTrainer.__init__ (VLLMClient.init_communicator), after
            # the model loaded: said before.
            raise ConfigError("vllm_mode", "server sends the trained weights to `trl vllm-serve` over NCCL (vLLM's "
                              "weight-transfer engine), which needs a CUDA GPU on the training side; this machine "
                              "has none. On a CPU use vllm_mode: colocate (vLLM's CPU build in this process) or "
                              "none. docs/scale-out.md says what of server mode runs on a CPU.")
        # Explicit, as the unsloth backend passes it: one default for both.
        kwargs.update(use_vllm=True, vllm_mode=cfg.model.vllm_mode,
                      vllm_importance_sampling_correction=cfg.grpo.vllm_importance_sampling_correction)
        if cfg.model.vllm_mode == "colocate" and cfg.model.gpu_memory_utilization != "auto":
            kwargs["vllm_gpu_memory_utilization"] = float(cfg.model.gpu_memory_utilization)
        if cfg.model.vllm_mode == "server" and cfg.model.vllm_server_base_url:
            kwargs["vllm_server_base_url"] = cfg.model.vllm_server_base_url
    return kwargs


def config_rewrites(kwargs: dict[str, Any], trl_defaults: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    return {}  # TRL's own GRPOConfig keeps every keyword it is given


def predicted_config_kwargs(cfg: PipelineConfig) -> dict[str, Any]:
    """grpo_config_kwargs, or nothing where vLLM is not installed for its vllm_mode."""
    try:
        return grpo_config_kwargs(cfg)
    except ConfigError:
        return {}


class TrlVllmEngine:
    """TRL's colocated vLLM, synced as TRL syncs it before a rollout, then scored."""

    def __init__(self, generation: Any):
        self.generation = generation

    def score(self, prompt_ids: list[int], continuation_ids: list[int]) -> list[float]:
        self.generation.sync_weights()
        return score_with_vllm(self.generation.llm.generate, prompt_ids, continuation_ids)


def prepare_trainer(trainer: Any, cfg: PipelineConfig) -> None:
    follow_the_trainer(trainer)


def rollout_engine(trainer: Any, tokenizer: Any, cfg: PipelineConfig) -> Optional[Any]:
    """TRL's colocated vLLM, or None (generate; or server mode's engine, in another process)."""
    generation = getattr(trainer, "vllm_generation", None)
    if cfg.model.vllm_mode == "colocate" and getattr(generation, "llm", None) is not None:
        return TrlVllmEngine(generation)
    return None


def save_adapter(model: Any, tokenizer: Any, directory: Path) -> None:
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))


class PlainGenerator:

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    def generate(self, prompts: list[str] | list[list[int]], max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, min_p: Optional[float] = None) -> list[Completion]:
        import torch

        tok = self.tokenizer
        tok.padding_side = "left"  # decoder-only: pad on the left so every prompt ends where generation starts
        was_training = self.model.training
        self.model.eval()
        texts: list[Completion] = []
        try:
            for start in range(0, len(prompts), self.batch_size):
                chunk = prompts[start : start + self.batch_size]
                batch = (tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
                         if isinstance(chunk[0], str) else  # token ids: only padded
                         tok.pad({"input_ids": [list(ids) for ids in chunk]}, return_tensors="pt"))
                batch = batch.to(self.model.device)
                # top_k is always given: transformers would otherwise apply the model's default (often 50)
                sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                            **({"min_p": min_p} if min_p else {})} if temperature > 0 else {"do_sample": False}
                with torch.no_grad():
                    out = self.model.generate(**batch, max_new_tokens=max_tokens, pad_token_id=tok.pad_token_id,
                                              eos_token_id=tok.eos_token_id, **sampling)
                new_tokens = out[:, batch["input_ids"].shape[1]:]
                decoded = tok.batch_decode(new_tokens, skip_special_tokens=True)
                for text, ids in zip(decoded, new_tokens):
                    n = generated_length(ids.tolist(), tok.eos_token_id)
                    texts.append(Completion(text, n, ids.tolist()[:n]))
        finally:
            self.model.train(was_training)
        return texts


def generated_length(ids: list[int], eos_token_id: Optional[int]) -> int:
    """Tokens generated up to and including the first end-of-sequence token (the batch's padding after it).

    >>> generated_length([5, 6, 2, 2, 2], eos_token_id=2), generated_length([5, 6, 7], eos_token_id=2)
    (3, 3)
    """
    return ids.index(eos_token_id) + 1 if eos_token_id in ids else len(ids)


def training_generator(model: Any, tokenizer: Any, cfg: PipelineConfig) -> PlainGenerator:
    return PlainGenerator(model, tokenizer)


def load_generator(base_model: str, adapter: Optional[Any], cfg: PipelineConfig) -> Any:
    """Through vLLM with a LoRARequest when the run's rollouts came from vLLM and it is installed, else peft."""
    tokenizer = run_tokenizer(adapter, base_model, cfg)
    if cfg.model.vllm_mode != "none":
        if vllm_installed():
            kwargs = engine_arguments(str(resolve_model_path(base_model, cfg.model.model_source)), cfg,
                                      _torch_dtype(cfg.model.dtype), with_lora=adapter is not None)
            return VllmGenerator(shared_engine(kwargs), tokenizer, adapter)
        print(f"note: the run used vLLM (vllm_mode: {cfg.model.vllm_mode}) but vLLM is not installed here; "
              "generating with transformers.", file=sys.stderr)
    model = load_model(base_model, cfg, for_training=False)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter.path))
    return PlainGenerator(model, tokenizer)


def _export_dtype(cfg: PipelineConfig, base_model: str, merged_dtype):
    """merged16's dtype: the merge's, the run's `dtype` or the base model's, the first that is 16-bit; else bf16."""
    import torch
    from transformers import AutoConfig

    sixteen = {"bfloat16": torch.bfloat16, "float16": torch.float16}
    if merged_dtype in sixteen.values():
        return merged_dtype
    if cfg.model.dtype in sixteen:
        return sixteen[cfg.model.dtype]
    try:
        config = AutoConfig.from_pretrained(resolve_model_path(base_model, cfg.model.model_source),
                                            trust_remote_code=cfg.model.trust_remote_code)
        native = str(getattr(config, "dtype", None) or "").replace("torch.", "")
    except (OSError, ValueError):
        native = ""
    return sixteen.get(native, torch.bfloat16)


def export(adapter: Any, base_model: str, method: str, out_dir: Path, cfg: PipelineConfig,
           system_prompt: Optional[str] = None) -> None:
    if method == "gguf":
        raise ConfigError("to", "GGUF export needs the unsloth backend (llama.cpp conversion via "
                          "save_pretrained_gguf). On the plain backend export merged16 and convert with llama.cpp.")
    if method == "merged4":
        import torch

        if not (torch.cuda.is_available() and importlib.util.find_spec("bitsandbytes")):
            raise ConfigError("to", "merged4 needs a CUDA GPU with bitsandbytes (4-bit weights). Use merged16 on CPU.")
    if method not in EXPORT_METHODS:
        raise ConfigError("to", f"got {method!r}; choose one of {', '.join(EXPORT_METHODS)}.")
    from peft import PeftModel

    # merge into full-precision weights, never into rounded 4-bit ones
    full_precision = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, load_in_4bit=False))
    model = PeftModel.from_pretrained(load_model(base_model, full_precision, for_training=False), str(adapter.path))
    merged = model.merge_and_unload()
    tokenizer = run_tokenizer(adapter, base_model, cfg)
    if method == "merged16":
        # on CPU the merge ran in float32
        merged.to(_export_dtype(cfg, base_model, merged.dtype)).save_pretrained(str(out_dir))
    else:
        # bitsandbytes quantizes the merged full-precision weights on load
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        with tempfile.TemporaryDirectory(dir=out_dir.parent) as staging:
            merged.save_pretrained(staging)
            quantized = AutoModelForCausalLM.from_pretrained(
                staging, quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"))
            quantized.save_pretrained(str(out_dir))
    carry_system_prompt(tokenizer, system_prompt)
    tokenizer.save_pretrained(str(out_dir))
