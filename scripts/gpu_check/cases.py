"""The GPU check's cases, run inside its child processes (run_check.py spawns them): the shapes and sizes,
the Recorder that writes each sub-step's result line, the random-weight model builder, and which units run where
(skip_reason, unit_steps). The chain (train -> resume -> generate -> export) is chain_case.py, the benchmark
benchmark.py.

Nothing here imports torch, transformers or the pipeline at module level: the driver imports this module
for its names and must stay fast, and a child must `import unsloth` (the backend's prepare_environment)
before anything imports trl/transformers/peft.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

# Qwen2Config values of Qwen/Qwen2.5-0.5B-Instruct and -1.5B-Instruct (their config.json), as data:
# the check builds random-weight models of these shapes instead of downloading weights.
QWEN25_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, max_window_layers=21),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, max_window_layers=21),
}
QWEN25_COMMON: dict[str, Any] = dict(
    vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, hidden_act="silu",
    tie_word_embeddings=True, use_sliding_window=False, sliding_window=32768, attention_dropout=0.0,
    bos_token_id=151643, eos_token_id=151645, initializer_range=0.02,
)
# In a dry run the "0.5B shape" keeps Qwen2.5's vocabulary but is one narrow layer, so CPU builds it in a second.
DRY_RUN_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                     num_key_value_heads=2, max_window_layers=1)

TINY_MODEL = "tiny-qwen2.5"  # pipeline/demo/registry.py: the tiny random Qwen2 with the real Qwen2.5 tokenizer
CHAIN_MODELS = (TINY_MODEL, "qwen2.5-0.5b")
PRECISIONS = ("bf16", "nf4")
CHAIN_SUBSTEPS = ("train", "resume", "generate", "export")
# Unsloth with fast_inference: true (vLLM rollouts), a label of its own in unit names (chain/unsloth-vllm/...,
# bench/unsloth-vllm/...): backend unsloth, plus vLLM. It needs vllm installed (the parts mode: parts.py).
VLLM_LABEL = "unsloth-vllm"
VLLM_CHAIN_CASES = (("qwen2.5-0.5b", "nf4"), ("qwen2.5-0.5b", "bf16"))
# One process per sub-step: each loads one vLLM engine, and nothing in the pipeline releases an engine inside a
# process (a second one would find the first one's memory taken). generate-base writes the base model's greedy
# answer for generate to compare with.
VLLM_CHAIN_SUBSTEPS = ("train", "resume", "generate-base", "generate", "export")
# vLLM's share of the card in every vLLM case, recorded beside its peak: 30% of the H200's 139 GiB holds the 0.5B
# and 1.5B shapes' weights and KV caches many times over, and leaves the training side most of the card.
VLLM_GPU_MEMORY_UTILIZATION = 0.3
BENCH_SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b")
GENERATE_PROMPT = "Tom has 3 boxes of 12 pencils and gives away 5. How many pencils are left?"


# ------------------------------------------------------------------------------------------ parameters


def run_params(dry_run: bool) -> dict[str, Any]:
    """Sizes of the chain and the benchmark: GPU values, or the smallest that exercise the code on CPU."""
    if dry_run:
        return dict(chain_steps=1, chain_generations=2, chain_batch=2, chain_completion=8, chain_samples=4,
                    bench_steps=2, bench_generations=2, bench_batch=2, bench_completion=8, bench_samples=4,
                    gen_tokens=4, warmup_steps=1)
    return dict(chain_steps=2, chain_generations=4, chain_batch=4, chain_completion=32, chain_samples=16,
                bench_steps=4, bench_generations=8, bench_batch=8, bench_completion=128, bench_samples=16,
                gen_tokens=16, warmup_steps=4)


def base_mapping(backend: str, model: str, precision: str, output_dir: Path, *, cuda: bool) -> dict[str, Any]:
    """The flat config (PipelineConfig fields) shared by the chain and the benchmark."""
    values: dict[str, Any] = {
        "model_name_or_path": model,
        "backend": backend,
        "dataset_name": "sample",  # the bundled GSM8K problems: real prompts for the real rewards, offline
        "max_seq_length": 512,
        "load_in_4bit": precision == "nf4",
        "dtype": "bfloat16" if cuda else "auto",
        "gradient_checkpointing": True,
        "lora_r": 16,
        "lora_alpha": 16,
        "output_dir": str(output_dir),
        "learning_rate": 5e-6,
        # bitsandbytes' 8-bit AdamW beside its 4-bit weights, as the GPU recipes do.
        "optim": "adamw_8bit" if precision == "nf4" and cuda else "adamw_torch",
        "logging_steps": 1,
        "report_to": "none",
        # Random weights write garbage by design: the health rules must watch, not stop the run.
        "garbled_action": "warn",
        "repetition_action": "warn",
        "kl_action": "warn",
    }
    if backend == "unsloth":
        values.update(fast_inference=False, vllm_standby="false")
    if backend == VLLM_LABEL:
        # Standby off: the engine keeps its memory, so the peak read is the same at every step.
        values.update(backend="unsloth", fast_inference=True, vllm_standby="false",
                      gpu_memory_utilization=str(VLLM_GPU_MEMORY_UTILIZATION), max_lora_rank=16)
    return values


def model_path(model: str, work: Path) -> str:
    """A built-in model name, or the folder the models step wrote a shape into."""
    return model if model == TINY_MODEL else str(work / "models" / model)


# ------------------------------------------------------------------------------------------ child helpers


class Recorder:
    """Appends one JSON line per finished sub-step (and a `start` line per case) to the results file."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
            handle.flush()
        if "status" in record:
            print(f"[gpu-check] {record['step']}: {record['status']} ({record.get('seconds', 0):.1f} s)"
                  + (f" - {record['error'].splitlines()[-1]}" if record.get("error") else ""), flush=True)

    def run(self, step: str, action: Callable[[], Optional[dict[str, Any]]]) -> bool:
        """Run one sub-step; record pass with its detail, or fail with the traceback's tail."""
        start = time.time()
        try:
            detail = action() or {}
        except Exception:  # noqa: BLE001 - the check records every failure and carries on
            self.write({"step": step, "status": "fail", "seconds": time.time() - start,
                        "error": tail(traceback.format_exc())})
            return False
        self.write({"step": step, "status": "pass", "seconds": time.time() - start, "detail": detail})
        return True

    def skip(self, step: str, reason: str) -> None:
        self.write({"step": step, "status": "skipped", "seconds": 0.0, "error": reason})


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def freeze_dry_run_imports(child: str) -> None:
    """A dry-run child of the models step or the plain backend (no Unsloth to import first): import the libraries it
    reaches anyway, then move everything alive into the garbage collector's permanent generation (gc.freeze), as the
    tests' own processes do (tests/conftest.py). A full collection walks every tracked object: with torch,
    transformers and TRL loaded ~800k, about 0.5 s each, and a chain child ran 27 of them (accelerate's at each
    Trainer.train, free_memory's per case, and Python's own, which parsing tokenizer.json's hundreds of thousands
    of objects starts at each tokenizer load). Frozen module-level objects are never garbage; what the child makes
    afterwards is collected as before. Never on a GPU: its children run exactly as they were measured there."""
    import importlib

    modules = ["transformers.models.qwen2.modeling_qwen2", "grpo_pipeline.pipeline.assets"]
    if child != "models":  # a chain or bench child: training, generate and export
        # TRL's GRPOTrainer first, as the plain backend's run imports it (no vllm_mode): with vLLM hidden. A plain
        # import would load vLLM too wherever it is installed (trl/generation/ imports it at its top), about 5 s of
        # CPU that no dry-run child uses: every unit that needs vLLM needs CUDA too, so a dry run skips it.
        from grpo_pipeline.pipeline.config.trl_fields import grpo_trainer_module

        grpo_trainer_module()
        modules += ["peft", "datasets", "trl.trainer.sft_trainer", "grpo_pipeline.pipeline.train",
                    "grpo_pipeline.pipeline.cli", "grpo_pipeline.pipeline.trainer.build"]
    for module in modules:
        importlib.import_module(module)
    gc.collect()
    gc.freeze()


def peak_gib() -> Optional[float]:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if torch.cuda.is_available() else None


def free_memory() -> None:
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


class VllmCalls:
    """Counts the vLLM engines built and the `vllm.LLM.generate` calls made in this process (prompts, output tokens,
    whether a LoRARequest came with each, seconds): the proof that rollouts and answers came from vLLM. Unsloth's
    `model.fast_generate` is the engine's bound `generate`, so patching the class before the engine exists sees
    every call. Enter it after `import unsloth` (the backend's prepare_environment): vllm imports transformers.
    """

    def __init__(self):
        self.engines = 0
        self.calls: list[dict[str, Any]] = []
        self._saved: tuple = ()

    def __enter__(self) -> "VllmCalls":
        from vllm import LLM

        init, generate = LLM.__init__, LLM.generate
        self._saved = (LLM, init, generate)

        def counted_init(llm, *args, **kwargs):
            self.engines += 1
            return init(llm, *args, **kwargs)

        def counted_generate(llm, *args, **kwargs):
            start = time.perf_counter()
            outputs = generate(llm, *args, **kwargs)
            self.calls.append({"seconds": time.perf_counter() - start, "prompts": len(outputs),
                               "tokens": sum(len(c.token_ids) for o in outputs for c in o.outputs),
                               "lora": kwargs.get("lora_request") is not None})
            return outputs

        LLM.__init__, LLM.generate = counted_init, counted_generate
        return self

    def __exit__(self, *exc) -> bool:
        LLM, init, generate = self._saved
        LLM.__init__, LLM.generate = init, generate
        return False

    def summary(self) -> dict[str, Any]:
        return {"engines": self.engines, "generate_calls": len(self.calls),
                "with_lora": sum(c["lora"] for c in self.calls), "output_tokens": sum(c["tokens"] for c in self.calls)}


def make_config(values: dict[str, Any]):
    """PipelineConfig from a flat mapping; refuses clearly when this tree lacks a field the check needs."""
    from grpo_pipeline.pipeline.config import field_names, from_mapping

    missing = sorted(set(values) - set(field_names()))
    if missing:
        raise RuntimeError(f"this tree's config has no field(s) {missing}; the unsloth steps need "
                           "ModelArguments.fast_inference (false: Unsloth without vLLM)")
    return from_mapping(values)


# ------------------------------------------------------------------------------------------ child: models


def build_shape(name: str, folder: Path, *, dry_run: bool) -> dict[str, Any]:
    """A random-weight Qwen2ForCausalLM of a Qwen2.5 shape plus the bundled tokenizer, saved to `folder`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_pipeline.pipeline.assets import load_qwen_tokenizer

    shape = {**QWEN25_SHAPES[name], **(DRY_RUN_SHAPE if dry_run else {})}
    config = Qwen2Config(**QWEN25_COMMON, **shape)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):  # initialising 1.5B parameters on the GPU takes seconds, on a CPU minutes
        model = Qwen2ForCausalLM(config).to(torch.bfloat16 if device == "cuda" else torch.float32)
    tokenizer = load_qwen_tokenizer()
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    del model
    free_memory()
    return {"parameters": params, "shape": shape, "folder": str(folder)}


def child_models(args: argparse.Namespace, rec: Recorder) -> None:
    names = BENCH_SHAPES if not args.dry_run else ("qwen2.5-0.5b",)
    for name in names:
        rec.run(f"models/{name}", lambda name=name: build_shape(name, args.work / "models" / name,
                                                              dry_run=args.dry_run))


def skip_reason(unit: str, *, cuda: bool, dry_run: bool, vllm: Optional[bool] = None) -> Optional[str]:
    """Why a unit (chain/<backend>/<model>/<precision>[/<sub-step>] or bench/<backend>/<shape>) cannot run here,
    or None. `vllm`: whether vllm is installed (looked up when not given).

    >>> skip_reason("chain/plain/tiny-qwen2.5/nf4", cuda=False, dry_run=True)
    'needs a CUDA GPU (dry run)'
    >>> skip_reason("bench/unsloth/qwen2.5-0.5b", cuda=True, dry_run=False) is None
    True
    >>> skip_reason("models", cuda=False, dry_run=True) is None  # a step that is one unit: it needs no GPU
    True
    >>> skip_reason("bench/unsloth-vllm/qwen2.5-0.5b", cuda=True, dry_run=False, vllm=False)
    'needs vllm, which this machine lacks: the parts mode installs it (docs/gpu.md, GPU check)'
    """
    parts = unit.split("/")
    if parts[0] not in ("chain", "bench"):
        return None  # `models` (and `env`): built on CPU, so never skipped for want of CUDA
    if (parts[1].startswith("unsloth") or "nf4" in parts) and (dry_run or not cuda):
        return "needs a CUDA GPU (dry run)" if dry_run else "needs a CUDA GPU; torch sees none"
    if dry_run and parts[0] == "chain" and parts[2] != TINY_MODEL:
        return "dry run: the tiny model only"
    if parts[1] == VLLM_LABEL:
        import importlib.util

        if not (vllm if vllm is not None else importlib.util.find_spec("vllm") is not None):
            return "needs vllm, which this machine lacks: the parts mode installs it (docs/gpu.md, GPU check)"
    return None


def unit_steps(unit: str) -> list[str]:
    """The step names a unit records: a chain case has four sub-steps, a bench case or a vLLM chain sub-step one.

    >>> unit_steps("chain/plain/tiny-qwen2.5/bf16")[-1], unit_steps("chain/unsloth-vllm/qwen2.5-0.5b/nf4/train")
    ('chain/plain/tiny-qwen2.5/bf16/export', ['chain/unsloth-vllm/qwen2.5-0.5b/nf4/train'])
    """
    is_case = unit.startswith("chain/") and len(unit.split("/")) == 4
    return [f"{unit}/{sub}" for sub in CHAIN_SUBSTEPS] if is_case else [unit]


