"""The GPU check's benchmark case, run inside a child process (run_check.py spawns it): one GRPO run of
the pipeline's own trainer per backend and shape, every rollout forced to full length, timed step by step
(median step time, rollout tokens/s from TRL's own generate timing, peak VRAM).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from cases import (VLLM_GPU_MEMORY_UTILIZATION, VLLM_LABEL, Recorder, VllmCalls, base_mapping, free_memory, has_cuda,
                   make_config, model_path, peak_gib, run_params, skip_reason)


def force_full_length(trainer: Any, length: int) -> list[str]:
    """Make every rollout exactly `length` tokens: min_new_tokens in TRL's generation settings.

    TRL 1.15 GRPOTrainer (transformers generate path) builds `self.generation_config` and keeps the
    same values in `self.generation_kwargs`, which `unwrap_model_for_generation` writes over the model's
    own generation_config; setting both keeps them in step. transformers' MinNewTokensLengthLogitsProcessor
    then masks the EOS tokens until `length` tokens exist, and `max_new_tokens` stops there.

    >>> from types import SimpleNamespace
    >>> trainer = SimpleNamespace(generation_config=SimpleNamespace(max_new_tokens=8), generation_kwargs={})
    >>> force_full_length(trainer, 8), trainer.generation_config.min_new_tokens, trainer.generation_kwargs
    (['generation_config', 'generation_kwargs'], 8, {'min_new_tokens': 8})
    """
    where = []
    config = getattr(trainer, "generation_config", None)
    if config is not None:
        config.min_new_tokens = length
        where.append("generation_config")
    kwargs = getattr(trainer, "generation_kwargs", None)
    if isinstance(kwargs, dict):
        kwargs["min_new_tokens"] = length
        where.append("generation_kwargs")
    if not where:
        raise RuntimeError("the trainer has neither generation_config nor generation_kwargs: cannot force "
                           "full-length rollouts, so the backends would not do equal work")
    return where


class GenerateTimes:
    """Collects TRL's own timing of each rollout: its ProfilingContext measures `transformers.generate`
    but only reports to wandb/mlflow/trackio, so the check taps `_log_metrics` (the one place it lands)."""

    def __init__(self):
        self.seconds: list[float] = []
        self._original = None

    def __enter__(self):
        from trl.extras import profiling

        self._original = original = profiling.ProfilingContext._log_metrics
        sink = self.seconds

        def tapped(context, duration):
            if context.name.endswith("generate"):
                sink.append(duration)
            return original(context, duration)

        profiling.ProfilingContext._log_metrics = tapped
        return self

    def __exit__(self, *exc):
        from trl.extras import profiling

        profiling.ProfilingContext._log_metrics = self._original
        return False


def _step_timer():
    import torch
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step, synchronised with the GPU so queued kernels are counted."""

        def __init__(self):
            self.seconds: list[float] = []
            self.device_used: list[float] = []  # GiB in use on the card at each step's end (vLLM's reservation too)
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                free, total = torch.cuda.mem_get_info()
                self.device_used.append(round((total - free) / 2**30, 3))
            self.seconds.append(time.perf_counter() - self._start)

    return StepTimer()


def bench_values(backend_name: str, model: str, params: dict[str, Any], out: Path, *, cuda: bool) -> dict[str, Any]:
    """The flat config of one benchmark case (tests/memory_plan_figures.py plans the committed reports' cases with it)."""
    values = base_mapping(backend_name, model, "nf4" if cuda else "bf16", out, cuda=cuda)
    values.update(num_generations=params["bench_generations"], per_device_train_batch_size=params["bench_batch"],
                  max_completion_length=str(params["bench_completion"]), max_samples=params["bench_samples"],
                  max_steps=params["bench_steps"], save_steps=10_000, resume="never",
                  rollout_probe_steps=0)  # the probe's scoring calls would count as rollout time
    if backend_name == VLLM_LABEL:
        # vLLM's counterpart of min_new_tokens: Unsloth copies vllm_sampling_params into its SamplingParams.
        values["vllm_sampling_params"] = json.dumps({"min_tokens": params["bench_completion"]})
    return values


def bench_case(backend_name: str, shape: str, args: argparse.Namespace) -> dict[str, Any]:
    """One benchmark run: the pipeline's own trainer (build_trainer), timed step by step. `backend_name`: plain,
    unsloth (fast_inference: false) or VLLM_LABEL (Unsloth with vLLM rollouts)."""
    import contextlib

    import torch

    from grpo_pipeline.pipeline.backends import load_backend
    from grpo_pipeline.pipeline.config import validate

    params = run_params(args.dry_run)
    cuda = torch.cuda.is_available()
    out = args.work / "bench" / f"{backend_name}-{shape}"
    length = params["bench_completion"]
    vllm = backend_name == VLLM_LABEL
    values = bench_values(backend_name, model_path(shape, args.work), params, out, cuda=cuda)
    cfg = make_config(values)
    validate(cfg)
    backend = load_backend(values["backend"])
    # `import unsloth` before anything imports trl/transformers/peft
    backend.prepare_environment(cfg)
    from grpo_pipeline.pipeline.data.prepare import prepare_dataset
    from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer
    from grpo_pipeline.pipeline.trainer.agents import resolve_agents
    from grpo_pipeline.pipeline.trainer.build import build_trainer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(cfg.model.model_name_or_path)
    prepared = prepare_dataset(cfg, tokenizer, report_dir=out)
    free_memory()
    # Memory still held from an earlier case would count in this one's peak: record it to see a leak.
    held_before = round(torch.cuda.memory_allocated() / 2**30, 3) if cuda else None
    with VllmCalls() if vllm else contextlib.nullcontext() as calls:  # the engine is built by load_for_training
        model, tokenizer = backend.load_for_training(cfg)
        load_peak = peak_gib()
        trainer, _ = build_trainer(resolve_agents(cfg.grpo), backend,
                                   cfg, model, tokenizer, prepared, backend.peft_config(cfg), out)
        forced = force_full_length(trainer, length) + (["vllm_sampling_params.min_tokens"] if vllm else [])
        timer = _step_timer()
        trainer.add_callback(timer)
        with GenerateTimes() as generated:
            trainer.train()
    lengths = [entry["completions/mean_length"] for entry in trainer.state.log_history
               if "completions/mean_length" in entry]
    measured = slice(1, None)  # step 1 carries warm-up (kernel compilation, allocator growth)
    step_times = timer.seconds[measured]
    gen_times = generated.seconds[measured]
    tokens = sum(params["bench_batch"] * n for n in lengths[measured])
    rollout_rate = round(tokens / sum(gen_times), 1) if gen_times and len(gen_times) == len(lengths[measured]) else None
    engine = None
    if vllm:
        # The engine's own count: output tokens and wall time of every LLM.generate call after step 1's.
        if calls.summary()["engines"] != 1 or len(calls.calls) < len(timer.seconds):
            raise RuntimeError(f"the rollouts did not come from one vLLM engine, a call per step: {calls.summary()}")
        later = calls.calls[len(calls.calls) - len(step_times):] if step_times else []
        engine = {**calls.summary(), "measured_calls": len(later),
                  "tokens_per_s": round(sum(c["tokens"] for c in later) / sum(c["seconds"] for c in later), 1)
                  if later else None}
        rollout_rate = engine["tokens_per_s"]
    return {
        "backend": backend_name, "shape": shape, "precision": values["load_in_4bit"] and "nf4" or values["dtype"],
        "steps": len(timer.seconds), "samples_measured": len(step_times),
        "completion_length_target": length, "completion_mean_lengths": lengths, "forced_via": forced,
        "full_length": bool(lengths) and all(abs(n - length) < 0.5 for n in lengths),
        "step_times_s": [round(s, 4) for s in timer.seconds],
        "median_step_s": round(statistics.median(step_times), 4) if step_times else None,
        "generate_times_s": [round(s, 4) for s in generated.seconds],
        "rollout_tokens_per_s": rollout_rate, "vllm": engine,
        "gpu_memory_utilization": VLLM_GPU_MEMORY_UTILIZATION if vllm else None,
        "peak_vram_gib": peak_gib(), "load_peak_vram_gib": load_peak, "held_before_load_gib": held_before,
        # `max_prompt_length: auto` as the data resolved it: the planner's estimate for what the case ran
        "prompt_limit": prepared.max_prompt_length,
        "device_used_peak_gib": max(timer.device_used) if timer.device_used else None,
        "planned_peak_gib": planned_peak(cfg.replace(max_prompt_length=str(prepared.max_prompt_length))),
        "completions_per_step": params["bench_batch"],
    }


def planned_peak(cfg: Any) -> float | None:
    """The memory planner's estimate for this case (`grpo plan`), recorded beside the measured peak. Without vLLM
    the estimate does not depend on the card's size; with it, vLLM's reservation is a share of this card."""
    import torch

    from grpo_pipeline.pipeline.config import ConfigError
    from grpo_pipeline.pipeline.plan.cards import card_from_memory
    from grpo_pipeline.pipeline.plan.fit import plan

    memory = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 80.0
    try:
        return round(plan(cfg, card_from_memory(memory)).peak_gib, 3)
    except ConfigError:
        return None


def case_peak_gib(case: dict[str, Any]) -> float:
    """The peak a case allocated itself: its peak VRAM less what the process held before its model loaded (an
    earlier case's leftovers), except the cuBLAS workspace, which the case uses too and the planner counts.

    >>> case_peak_gib({"peak_vram_gib": 2.0, "held_before_load_gib": 0.53125})
    1.5
    >>> case_peak_gib({"peak_vram_gib": 0.915, "held_before_load_gib": 0.031}), case_peak_gib({"peak_vram_gib": 1.0})
    (0.915, 1.0)
    """
    from grpo_pipeline.pipeline.plan.estimate import CUBLAS_WORKSPACE_BYTES

    held = max(0.0, (case.get("held_before_load_gib") or 0.0) - CUBLAS_WORKSPACE_BYTES / 2**30)
    return case["peak_vram_gib"] - held


def child_bench(args: argparse.Namespace, rec: Recorder) -> None:
    cuda = has_cuda()
    for shape in args.shapes:
        step = f"bench/{args.backend}/{shape}"
        reason = skip_reason(step, cuda=cuda, dry_run=args.dry_run)
        if reason:
            rec.skip(step, reason)
            continue
        rec.write({"start": step})
        rec.run(step, lambda shape=shape: bench_case(args.backend, shape, args))
        free_memory()
