"""The GPU check: everything but vLLM, on a real GPU, in one run of about 8 minutes; a JSON report and a log.

What it runs, each recorded as pass / fail / skipped with its error tail, the run carrying on after a
failure; in the order env, models, the plain chain, the benchmark, the Unsloth chain (see STEPS):

1. env      `grpo env --json` on the machine (versions, GPU, driver).
2. models   random-weight models with the bundled Qwen2.5 tokenizer, built from Qwen2Config values
            written below as data (nothing is downloaded): the Qwen2.5-0.5B-Instruct and -1.5B shapes.
3. chain    per backend (plain, then unsloth with fast_inference: false), per model (the tiny test model
            `tiny-qwen2.5` and the 0.5B shape), per precision (bf16 LoRA, 4-bit NF4 QLoRA through
            bitsandbytes), with gradient checkpointing and the real rewards:
            train 2 GRPO steps (a checkpoint each) -> resume from checkpoint-2 to step 3 -> lora/ ->
            `grpo generate --lora` -> `grpo export --to merged16`.
4. bench    plain vs unsloth, same config, 4-bit QLoRA, on the 0.5B and 1.5B shapes: median GRPO step
            time, rollout tokens/s and peak VRAM, with completions forced to full length
            (`min_new_tokens` = max_completion_length in TRL's generation config, so random weights
            cannot stop early and both backends generate the same number of tokens), and the ratios.

The anchor for the benchmark is Unsloth's published claim for GRPO: about 90% less VRAM than
Hugging Face TRL with Flash Attention 2 (unsloth.ai/blog/grpo, 2025-02-20: Llama 3.1 8B, 20K context,
8 generations: 54.3 GB vs 510.8 GB). That figure includes Unsloth's vLLM path and long contexts; this
check has no vLLM and short completions, so it measures how much of the gap remains without them.
vLLM itself (`fast_inference: true`, `fast_generate`, `load_lora`) is NOT run here: its wheel is far
over the device's carry limit, so it stays covered by the contract tests (tests/test_unsloth_backend.py) only.

Each backend runs in its own child process (Unsloth patches trl/transformers/peft at import, so a plain
measurement must never share a process with it); a child that dies is restarted for the cases it had
not reached. `--dry-run` runs the same plumbing on CPU with the tiny model and one step (the tests do).

On a lent GPU machine, from the repository root here: build the wheel set first
(`python scripts/gpu_check/wheels.py build`), then call the device tool's `run` with
carry [".gpu-wheels"], timeout_s 560 and this command:

    set -o pipefail; export PYTHONUNBUFFERED=1; python3 scripts/gpu_check/wheels.py install --target /tmp/site > $OUT/install.log 2>&1 || { tail -20 $OUT/install.log; exit 3; }; PYTHONPATH=/tmp/site python3 scripts/gpu_check/run_check.py --out $OUT --budget-s 480 2>&1 | tee $OUT/console.log

Then copy $OUT/gpu-report.json to docs/gpu-reports/<date>-<gpu>.json and commit it
(docs/gpu-reports/README.md). A rerun of some steps only: add `--only chain-unsloth,bench-unsloth`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
REPORT_NAME = "gpu-report.json"
LOG_NAME = "gpu-check.log"

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
BACKENDS = ("plain", "unsloth")
CHAIN_MODELS = (TINY_MODEL, "qwen2.5-0.5b")
PRECISIONS = ("bf16", "nf4")
CHAIN_SUBSTEPS = ("train", "resume", "generate", "export")
BENCH_SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b")
GENERATE_PROMPT = "Tom has 3 boxes of 12 pencils and gives away 5. How many pencils are left?"

ANCHOR = {
    "claim": "Unsloth GRPO uses about 90% less VRAM than Hugging Face TRL + Flash Attention 2",
    "source": "unsloth.ai/blog/grpo (2025-02-20); the same numbers on docs.unsloth.ai/basics/reasoning-grpo-and-rl",
    "their_setup": "Llama 3.1 8B, 20K context, 8 generations: 54.3 GB (Unsloth) vs 510.8 GB (TRL + FA2), with "
                   "Unsloth's vLLM rollouts and memory-efficient GRPO loss",
    "this_check": "no vLLM (fast_inference: false) on both sides, 4-bit QLoRA, short completions: the part of the "
                  "gap left without vLLM and long context",
}
NOT_COVERED = ("vLLM is not run by this check: fast_inference: true, model.fast_generate and model.load_lora are "
               "covered by the contract tests only (tests/test_unsloth_backend.py, a recording fake bound to the "
               "real signatures); vLLM's wheel is far over the device's 64 MiB carry limit.")

# Wall-clock caps per child (seconds) on the GPU; the whole run also keeps inside --budget-s.
# Estimated on an H200 (not yet measured): env 5, models 25, chain-plain 80, bench-plain 70, bench-unsloth 80,
# chain-unsloth 150: about 7 minutes.
CHILD_CAPS = {"models": 120, "chain-plain": 170, "bench-plain": 150, "bench-unsloth": 170, "chain-unsloth": 230}
# The benchmark runs before the Unsloth chain: it is the figure that counts, and a slow Unsloth chain
# (first-use kernel compilation) must not leave it without time.
STEPS = ("env", "models", "chain-plain", "bench-plain", "bench-unsloth", "chain-unsloth")


# ------------------------------------------------------------------------------------------ parameters


def run_params(dry_run: bool) -> dict[str, Any]:
    """Sizes of the chain and the benchmark: GPU values, or the smallest that exercise the code on CPU."""
    if dry_run:
        return dict(chain_steps=1, chain_generations=2, chain_batch=2, chain_completion=8, chain_samples=4,
                    bench_steps=2, bench_generations=2, bench_batch=2, bench_completion=8, bench_samples=4,
                    gen_tokens=4)
    return dict(chain_steps=2, chain_generations=4, chain_batch=4, chain_completion=32, chain_samples=16,
                bench_steps=4, bench_generations=8, bench_batch=8, bench_completion=128, bench_samples=16,
                gen_tokens=16)


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
                        "error": _tail(traceback.format_exc())})
            return False
        self.write({"step": step, "status": "pass", "seconds": time.time() - start, "detail": detail})
        return True

    def skip(self, step: str, reason: str) -> None:
        self.write({"step": step, "status": "skipped", "seconds": 0.0, "error": reason})


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _peak_gib() -> Optional[float]:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if torch.cuda.is_available() else None


def _free_memory() -> None:
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _config(values: dict[str, Any]):
    """PipelineConfig from a flat mapping; refuses clearly when this tree lacks a field the check needs."""
    from pipeline.config import field_names, from_mapping

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

    from pipeline.assets import load_qwen_tokenizer

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
    _free_memory()
    return {"parameters": params, "shape": shape, "folder": str(folder)}


def child_models(args: argparse.Namespace, rec: Recorder) -> None:
    names = BENCH_SHAPES if not args.dry_run else ("qwen2.5-0.5b",)
    for name in names:
        rec.run(f"models/{name}", lambda name=name: build_shape(name, args.work / "models" / name,
                                                              dry_run=args.dry_run))


# ------------------------------------------------------------------------------------------ child: chain


def run_chain_case(backend: str, model: str, precision: str, args: argparse.Namespace, rec: Recorder) -> None:
    """train -> resume -> generate -> export for one (backend, model, precision)."""
    from pipeline.backends import BackendChoice

    params = run_params(args.dry_run)
    case = f"chain/{backend}/{model}/{precision}"
    out = args.work / "runs" / f"{backend}-{model}-{precision}"
    cuda = _cuda()
    values = base_mapping(backend, model_path(model, args.work), precision, out, cuda=cuda)
    values.update(num_generations=params["chain_generations"], per_device_train_batch_size=params["chain_batch"],
                  max_completion_length=str(params["chain_completion"]), max_samples=params["chain_samples"],
                  max_steps=params["chain_steps"], save_steps=1, save_total_limit=None, resume="auto")
    choice = BackendChoice(backend, "the GPU check asks for it by name")
    state: dict[str, Any] = {}

    def train() -> dict[str, Any]:
        from pipeline.train import run_training

        _free_memory()
        result = run_training(_config(values), choice)
        checkpoints = sorted(p.name for p in out.glob("checkpoint-*"))
        if result.status != "completed" or result.steps != params["chain_steps"]:
            raise RuntimeError(f"run {result.status} at step {result.steps}, expected completed at "
                               f"{params['chain_steps']}; summary: {result.summary}")
        if f"checkpoint-{params['chain_steps']}" not in checkpoints:
            raise RuntimeError(f"no checkpoint-{params['chain_steps']} in {out}: {checkpoints}")
        state["lora"] = result.adapter_dir
        return {"steps": result.steps, "checkpoints": checkpoints, "peak_vram_gib": _peak_gib()}

    def resume() -> dict[str, Any]:
        from pipeline.train import run_training

        _free_memory()
        target = params["chain_steps"] + 1
        result = run_training(_config({**values, "max_steps": target}), choice)
        if result.status != "completed" or result.steps != target:
            raise RuntimeError(f"resumed run {result.status} at step {result.steps}, expected completed at {target}")
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        # Step logs carry `reward`; a run that restarted from scratch instead would log 1..N twice.
        logged = [m.get("step") for m in metrics if "reward" in m]
        if logged != list(range(1, target + 1)):
            raise RuntimeError(f"metrics.jsonl should log steps 1..{target} once each after the resume; got {logged}")
        state["lora"] = result.adapter_dir
        return {"steps": result.steps, "logged_steps": logged, "peak_vram_gib": _peak_gib()}

    def generate() -> dict[str, Any]:
        from pipeline.cli import main as grpo

        answers = out / "generate.jsonl"
        rc = grpo(["generate", "--lora", str(state["lora"]), "--prompt", GENERATE_PROMPT, "--backend", backend,
                   "--max_tokens", str(params["gen_tokens"]), "--output", str(answers)])
        if rc != 0:
            raise RuntimeError(f"grpo generate exited {rc}")
        records = [json.loads(line) for line in answers.read_text().splitlines() if line.strip()]
        if len(records) != 1 or not isinstance(records[0].get("text"), str):
            raise RuntimeError(f"grpo generate wrote {records!r}")
        return {"completion_tokens": records[0].get("completion_tokens"), "text": records[0]["text"][:200]}

    def export() -> dict[str, Any]:
        from pipeline.cli import main as grpo

        merged = out / "merged16"
        rc = grpo(["export", "--lora", str(state["lora"]), "--to", "merged16", "--out", str(merged),
                   "--backend", backend, "--overwrite"])
        if rc != 0:
            raise RuntimeError(f"grpo export exited {rc}")
        weights = sorted(p.name for p in merged.glob("*.safetensors"))
        if not (merged / "config.json").is_file() or not weights:
            raise RuntimeError(f"{merged} lacks config.json or *.safetensors: {sorted(os.listdir(merged))}")
        return {"files": sorted(os.listdir(merged))}

    rec.write({"start": case})
    if not rec.run(f"{case}/train", train):
        for later in CHAIN_SUBSTEPS[1:]:
            rec.skip(f"{case}/{later}", "train failed")
        return
    rec.run(f"{case}/resume", resume)
    rec.run(f"{case}/generate", generate)
    rec.run(f"{case}/export", export)


def skip_reason(unit: str, *, cuda: bool, dry_run: bool) -> Optional[str]:
    """Why a unit (chain/<backend>/<model>/<precision> or bench/<backend>/<shape>) cannot run here, or None.

    >>> skip_reason("chain/plain/tiny-qwen2.5/nf4", cuda=False, dry_run=True)
    'needs a CUDA GPU (dry run)'
    >>> skip_reason("bench/unsloth/qwen2.5-0.5b", cuda=True, dry_run=False) is None
    True
    """
    parts = unit.split("/")
    if (parts[1] == "unsloth" or "nf4" in parts) and (dry_run or not cuda):
        return "needs a CUDA GPU (dry run)" if dry_run else "needs a CUDA GPU; torch sees none"
    if dry_run and parts[0] == "chain" and parts[2] != TINY_MODEL:
        return "dry run: the tiny model only"
    return None


def unit_steps(unit: str) -> list[str]:
    """The step names a unit records: a chain case has four sub-steps, a bench case one."""
    return [f"{unit}/{sub}" for sub in CHAIN_SUBSTEPS] if unit.startswith("chain/") else [unit]


def child_chain(args: argparse.Namespace, rec: Recorder) -> None:
    cuda = _cuda()
    for model, precision in args.cases:
        case = f"chain/{args.backend}/{model}/{precision}"
        reason = skip_reason(case, cuda=cuda, dry_run=args.dry_run)
        if reason:
            for step in unit_steps(case):
                rec.skip(step, reason)
            continue
        run_chain_case(args.backend, model, precision, args, rec)


# ------------------------------------------------------------------------------------------ child: bench


def force_full_length(trainer: Any, length: int) -> list[str]:
    """Make every rollout exactly `length` tokens: min_new_tokens in TRL's generation settings.

    TRL 1.15 GRPOTrainer (transformers generate path) builds `self.generation_config` and keeps the
    same values in `self.generation_kwargs`, which `unwrap_model_for_generation` writes over the model's
    own generation_config; setting both keeps them in step. transformers' MinNewTokensLengthLogitsProcessor
    then masks the EOS tokens until `length` tokens exist, and `max_new_tokens` stops there.
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
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds.append(time.perf_counter() - self._start)

    return StepTimer()


def bench_case(backend_name: str, shape: str, args: argparse.Namespace) -> dict[str, Any]:
    """One benchmark run: the pipeline's own trainer (build_trainer), timed step by step."""
    import torch

    from pipeline.backends import load_backend
    from pipeline.config import validate

    params = run_params(args.dry_run)
    cuda = torch.cuda.is_available()
    out = args.work / "bench" / f"{backend_name}-{shape}"
    length = params["bench_completion"]
    values = base_mapping(backend_name, model_path(shape, args.work), "nf4" if cuda else "bf16", out, cuda=cuda)
    values.update(num_generations=params["bench_generations"], per_device_train_batch_size=params["bench_batch"],
                  max_completion_length=str(length), max_samples=params["bench_samples"],
                  max_steps=params["bench_steps"], save_steps=10_000, resume="never")
    cfg = _config(values)
    validate(cfg)
    backend = load_backend(backend_name)
    backend.prepare_environment(cfg)  # `import unsloth` before anything imports trl/transformers/peft
    from pipeline.data.prepare import prepare_dataset
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.trainer.build import build_trainer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(cfg.model.model_name_or_path)
    prepared = prepare_dataset(cfg, tokenizer, report_dir=out)
    _free_memory()
    # Memory still held from an earlier case would count in this one's peak: record it to see a leak.
    held_before = round(torch.cuda.memory_allocated() / 2**30, 3) if cuda else None
    model, tokenizer = backend.load_for_training(cfg)
    load_peak = _peak_gib()
    trainer, _ = build_trainer(cfg, backend, model, tokenizer, prepared, backend.peft_config(cfg), out)
    forced = force_full_length(trainer, length)
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
    return {
        "backend": backend_name, "shape": shape, "precision": values["load_in_4bit"] and "nf4" or values["dtype"],
        "steps": len(timer.seconds), "samples_measured": len(step_times),
        "completion_length_target": length, "completion_mean_lengths": lengths, "forced_via": forced,
        "full_length": bool(lengths) and all(abs(n - length) < 0.5 for n in lengths),
        "step_times_s": [round(s, 4) for s in timer.seconds],
        "median_step_s": round(statistics.median(step_times), 4) if step_times else None,
        "generate_times_s": [round(s, 4) for s in generated.seconds],
        "rollout_tokens_per_s": round(tokens / sum(gen_times), 1) if gen_times and len(gen_times) == len(
            lengths[measured]) else None,
        "peak_vram_gib": _peak_gib(), "load_peak_vram_gib": load_peak, "held_before_load_gib": held_before,
        "completions_per_step": params["bench_batch"],
    }


def child_bench(args: argparse.Namespace, rec: Recorder) -> None:
    cuda = _cuda()
    for shape in args.shapes:
        step = f"bench/{args.backend}/{shape}"
        reason = skip_reason(step, cuda=cuda, dry_run=args.dry_run)
        if reason:
            rec.skip(step, reason)
            continue
        rec.write({"start": step})
        rec.run(step, lambda shape=shape: bench_case(args.backend, shape, args))
        _free_memory()


# ------------------------------------------------------------------------------------------ driver


def _versions() -> dict[str, Optional[str]]:
    from importlib import metadata

    names = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes", "unsloth",
             "unsloth_zoo", "triton", "math-verify", "vllm", "xformers")
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _gpu() -> dict[str, Any]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"nvidia_smi": f"unavailable: {err}"}
    if out.returncode != 0:
        return {"nvidia_smi": f"exit {out.returncode}: {out.stderr.strip()[-300:]}"}
    name, driver, memory = (part.strip() for part in out.stdout.strip().splitlines()[0].split(","))
    return {"name": name, "driver": driver, "memory": memory}


class Driver:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.deadline = time.time() + args.budget_s
        self.records: list[dict[str, Any]] = []
        self.log_path = args.out / LOG_NAME
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                                os.environ.get("PYTHONPATH")])),
                    "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true",
                    "GRPO_CACHE_DIR": str(args.work / "cache"),
                    # Unsloth fetches a README from the hub for usage statistics unless told not to.
                    "UNSLOTH_DISABLE_STATISTICS": "1"}

    def _dry_run_skip(self, unit: str) -> bool:
        """In a dry run, record a unit that needs CUDA as skipped here instead of starting a child for it."""
        reason = skip_reason(unit, cuda=False, dry_run=True) if self.args.dry_run else None
        if reason is None:
            return False
        for step in unit_steps(unit):
            self.skip(step, reason)
        return True

    def left(self) -> float:
        return self.deadline - time.time()

    def log(self, text: str) -> None:
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(text if text.endswith("\n") else text + "\n")

    def skip(self, step: str, reason: str) -> None:
        self.records.append({"step": step, "status": "skipped", "seconds": 0.0, "error": reason})
        print(f"[gpu-check] {step}: skipped - {reason}", flush=True)

    def env_step(self) -> None:
        start = time.time()
        done = subprocess.run([sys.executable, "-m", "pipeline", "env", "--json"], cwd=REPO_ROOT, env=self.env,
                              capture_output=True, text=True, timeout=max(10, min(120, self.left())))
        self.log(f"== grpo env --json (exit {done.returncode})\n{done.stdout}\n{done.stderr}")
        record: dict[str, Any] = {"step": "env", "seconds": time.time() - start, "exit_code": done.returncode}
        try:
            record["detail"] = json.loads(done.stdout)
            # `grpo env` exits 1 when versions drift from the matrix (the GPU machine's torch is 2.11, not
            # 2.13.0): that is its report, not a failure of the check; only an unreadable report fails.
            record["status"] = "pass"
        except json.JSONDecodeError:
            record.update(status="fail", error=_tail(done.stdout + done.stderr))
        self.records.append(record)
        print(f"[gpu-check] env: {record['status']} (grpo env exit {done.returncode})", flush=True)

    def child(self, step: str, extra: list[str], units: list[str]) -> None:
        """Run a child until every unit has records, restarting it for the units a crash left undone."""
        results = self.args.work / f"{step}.jsonl"
        todo = [unit for unit in units if not self._dry_run_skip(unit)]
        while todo:
            cap = CHILD_CAPS[step] if not self.args.dry_run else 300
            timeout = min(cap, self.left())
            if timeout < 15:
                for unit in todo:
                    self.skip(f"{step}:{unit}", f"out of the time budget ({self.args.budget_s:.0f} s)")
                return
            results.unlink(missing_ok=True)
            command = [sys.executable, str(Path(__file__).resolve()), "--child", step, "--work", str(self.args.work),
                       "--results", str(results), "--units", ",".join(todo)] + extra
            if self.args.dry_run:
                command.append("--dry-run")
            self.log(f"== {step}: {' '.join(command)}")
            start = time.time()
            with open(self.log_path, "a", encoding="utf-8") as log:
                try:
                    done = subprocess.run(command, cwd=self.args.work, env=self.env, stdout=log,
                                          stderr=subprocess.STDOUT, timeout=timeout)
                    exit_code = done.returncode
                except subprocess.TimeoutExpired:
                    exit_code = None
            lines = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
            finished = [line for line in lines if "status" in line]
            self.records.extend(finished)
            started = [line["start"] for line in lines if "start" in line]
            done_units = {unit for unit in todo if any(r["step"].startswith(unit) for r in finished)}
            if exit_code == 0:
                return
            # The child died (or ran out of time) inside the last unit it started.
            crashed = started[-1] if started else todo[0]
            why = (f"timed out after {timeout:.0f} s" if exit_code is None else f"child exited {exit_code}")
            self.records.append({"step": f"{crashed}/crashed", "status": "fail", "seconds": time.time() - start,
                                 "error": f"{why}; log tail:\n{_tail(self.log_path.read_text(), 30)}"})
            print(f"[gpu-check] {crashed}: fail ({why})", flush=True)
            todo = [unit for unit in todo if unit not in done_units and unit != crashed]
            if exit_code is None:
                for unit in todo:
                    self.skip(unit, f"not reached: {step} {why}")
                return

    def run(self) -> dict[str, Any]:
        args = self.args
        started = datetime.now(timezone.utc)
        wanted = set(args.only.split(",")) if args.only else set(STEPS)
        # A dry run trains the tiny model on CPU only; what needs CUDA is recorded as skipped without
        # starting a child (a child on a machine without CUDA would skip the same steps, slower).
        for step in (step for step in STEPS if step in wanted):
            if step == "env":
                self.env_step()
            elif step == "models":
                self.child("models", [], ["models"])
            else:
                kind, backend = step.split("-")
                if kind == "chain":
                    units = [f"chain/{backend}/{m}/{p}" for m in CHAIN_MODELS for p in PRECISIONS]
                else:
                    units = [f"bench/{backend}/{s}" for s in ((TINY_MODEL,) if args.dry_run else BENCH_SHAPES)]
                self.child(step, ["--backend", backend], units)
        finished = datetime.now(timezone.utc)
        return self.report(started, finished)

    def report(self, started: datetime, finished: datetime) -> dict[str, Any]:
        counts = {status: sum(r["status"] == status for r in self.records) for status in ("pass", "fail", "skipped")}
        bench = {r["detail"]["backend"] + "/" + r["detail"]["shape"]: r["detail"] for r in self.records
                 if r["step"].startswith("bench/") and r["status"] == "pass"}
        wheel_manifest = REPO_ROOT / ".gpu-wheels" / "manifest.json"
        return {
            "schema": 1,
            "kind": "gpu-check",
            "mode": "dry-run" if self.args.dry_run else "gpu",
            "date": started.date().isoformat(),
            "started_utc": started.isoformat(timespec="seconds"),
            "finished_utc": finished.isoformat(timespec="seconds"),
            "wall_s": round((finished - started).total_seconds(), 1),
            "gpu": _gpu(),
            "versions": _versions(),
            "wheel_set": json.loads(wheel_manifest.read_text()) if wheel_manifest.is_file() else None,
            "summary": counts,
            "steps": self.records,
            "bench": bench,
            "bench_rows": bench_rows(bench, counts),
            "anchor": ANCHOR,
            "not_covered": NOT_COVERED,
        }


def bench_rows(bench: dict[str, dict[str, Any]], counts: dict[str, int]) -> list[dict[str, Any]]:
    """The figures bench/run_all.py reads: {figure, value, target, holds}; holds is None when not measured.

    >>> rows = bench_rows({}, {"pass": 3, "fail": 1, "skipped": 0})
    >>> rows[0]["value"], rows[0]["holds"], rows[1]["holds"]
    ('3 passed, 1 failed, 0 skipped', False, None)
    """
    rows = [{"figure": "GPU check steps (plain + Unsloth without vLLM)",
             "value": f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped",
             "target": "all pass", "holds": counts["fail"] == 0 and counts["skipped"] == 0}]
    for shape in BENCH_SHAPES:
        plain, fast = bench.get(f"plain/{shape}"), bench.get(f"unsloth/{shape}")
        equal = bool(plain and fast and plain["full_length"] and fast["full_length"])
        length = (plain or fast or {}).get("completion_length_target", run_params(False)["bench_completion"])
        where = f"{shape} shape, 4-bit QLoRA GRPO, no vLLM, {length}-token completions"

        def ratio(key: str, numerator, denominator, fmt: str, unit: str, target: str, good) -> dict[str, Any]:
            a = numerator.get(key) if numerator else None
            b = denominator.get(key) if denominator else None
            if a is None or b is None or not b:
                return {"value": "not measured", "target": target, "holds": None}
            value = a / b
            return {"value": f"{value:.2f}x ({a:{fmt}} vs {b:{fmt}} {unit})" + ("" if equal else "; unequal lengths"),
                    "target": target, "holds": bool(good(value)) if equal else None}

        rows.append({"figure": f"peak VRAM, Unsloth / plain ({where})",
                     **ratio("peak_vram_gib", fast, plain, ".2f", "GiB",
                             "< 1 (Unsloth: ~90% less VRAM than TRL + FA2 for GRPO, with vLLM and long context; "
                             "unsloth.ai/blog/grpo)", lambda v: v < 1.0)})
        rows.append({"figure": f"GRPO step time, plain / Unsloth ({where})",
                     **ratio("median_step_s", plain, fast, ".3f", "s median", "> 1 (Unsloth faster)",
                             lambda v: v > 1.0)})
        rows.append({"figure": f"rollout tokens/s, Unsloth / plain ({where})",
                     **ratio("rollout_tokens_per_s", fast, plain, ".0f", "tokens/s", "> 1 (Unsloth faster)",
                             lambda v: v > 1.0)})
    return rows


def print_table(report: dict[str, Any]) -> None:
    print("\n[gpu-check] step results", flush=True)
    for record in report["steps"]:
        print(f"  {record['status']:8s} {record['step']}")
    print(f"[gpu-check] {report['summary']}")
    for row in report["bench_rows"]:
        print(f"  {row['figure']}: {row['value']} (target {row['target']}; holds: {row['holds']})")
    print(f"[gpu-check] {report['not_covered']}")


def child_main(args: argparse.Namespace) -> int:
    rec = Recorder(args.results)
    units = args.units.split(",") if args.units else []
    if args.child == "models":
        child_models(args, rec)
    elif args.child.startswith("chain-"):
        args.cases = [tuple(unit.split("/")[2:4]) for unit in units]
        child_chain(args, rec)
    else:
        args.shapes = [unit.split("/")[2] for unit in units]
        child_bench(args, rec)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="run_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="report + log folder (default: $OUT)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: $TMPDIR/gpu-check-work)")
    parser.add_argument("--dry-run", action="store_true", help="CPU: the tiny model, one step, no CUDA steps")
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop starting new steps after this long")
    parser.add_argument("--only", default=None, help=f"comma-separated steps: {','.join(STEPS)}")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--units", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.dry_run = args.dry_run or not _cuda()
        return child_main(args)
    unknown = set(args.only.split(",")) - set(STEPS) if args.only else set()
    if unknown:
        print(f"error: --only: unknown step(s) {sorted(unknown)}; choose from {', '.join(STEPS)}", file=sys.stderr)
        return 2
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None:
        print("error: --out is required (or set $OUT): the folder for gpu-report.json and gpu-check.log",
              file=sys.stderr)
        return 2
    args.out = out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work = (args.work or Path(tempfile.gettempdir()) / "gpu-check-work").resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    driver = Driver(args)
    report = driver.run()
    (args.out / REPORT_NAME).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    print_table(report)
    print(f"[gpu-check] report: {args.out / REPORT_NAME}; log: {args.out / LOG_NAME}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    raise SystemExit(main())
