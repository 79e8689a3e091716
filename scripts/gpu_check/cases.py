"""The GPU check's cases, run inside its child processes (run_check.py spawns them): the shapes and sizes,
the Recorder that writes each sub-step's result line, the random-weight model builder, and the chain
(train -> resume -> generate -> export) per backend, model and precision. The benchmark is in benchmark.py.

Nothing here imports torch, transformers or the pipeline at module level: the driver imports this module
for its names and must stay fast, and a child must `import unsloth` (the backend's prepare_environment)
before anything imports trl/transformers/peft.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
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
                    gen_tokens=4, warmup_steps=2)
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
    free_memory()
    return {"parameters": params, "shape": shape, "folder": str(folder)}


def child_models(args: argparse.Namespace, rec: Recorder) -> None:
    names = BENCH_SHAPES if not args.dry_run else ("qwen2.5-0.5b",)
    for name in names:
        rec.run(f"models/{name}", lambda name=name: build_shape(name, args.work / "models" / name,
                                                              dry_run=args.dry_run))


# ------------------------------------------------------------------------------------------ child: chain


def chain_values(label: str, model: str, precision: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The flat config of a chain case (`label`: plain, unsloth, or VLLM_LABEL)."""
    params = run_params(args.dry_run)
    values = base_mapping(label, model_path(model, args.work), precision, out, cuda=has_cuda())
    values.update(num_generations=params["chain_generations"], per_device_train_batch_size=params["chain_batch"],
                  max_completion_length=str(params["chain_completion"]), max_samples=params["chain_samples"],
                  max_steps=params["chain_steps"], save_steps=1, save_total_limit=None, resume="auto",
                  # GRPO on random weights scores every completion 0, so its advantages (and gradients) are 0 and
                  # the LoRA would stay exactly at its zero init: the SFT format warm-up moves it, so generate can
                  # show that the adapter is applied (its greedy output differs from the base model's).
                  sft_warmup_steps=params["warmup_steps"], sft_learning_rate=5e-2)
    if label == VLLM_LABEL:
        values.update(rollout_probe_steps=1)  # the stale-rollout probe on the real engine at every step
    return values


def greedy(out: Path, args: argparse.Namespace, which: list[str], use_backend: str, name: str, **options: str) -> str:
    """`grpo generate` of GENERATE_PROMPT, greedy; its one completion's text. The answers go beside the run, never
    into it (generate refuses to write inside a run it reads)."""
    from pipeline.cli import main as grpo

    answers = args.work / "answers" / f"{out.name}-{name}.jsonl"
    answers.parent.mkdir(parents=True, exist_ok=True)
    flags = [item for key, value in options.items() for item in (f"--{key}", value)]
    rc = grpo(["generate", *which, "--prompt", GENERATE_PROMPT, "--backend", use_backend, "--temperature", "0",
               "--max_tokens", str(run_params(args.dry_run)["gen_tokens"]), "--output", str(answers), *flags])
    if rc != 0:
        raise RuntimeError(f"grpo generate {' '.join(which)} exited {rc}")
    records = [json.loads(line) for line in answers.read_text().splitlines() if line.strip()]
    if len(records) != 1 or not isinstance(records[0].get("text"), str):
        raise RuntimeError(f"grpo generate wrote {records!r}")
    return records[0]["text"]


def trained(values: dict[str, Any], choice: Any, steps: int, out: Path) -> Any:
    """run_training to `steps`, which must complete there and leave checkpoint-`steps`."""
    from pipeline.train import run_training

    free_memory()
    result = run_training(make_config({**values, "max_steps": steps}), choice)
    if result.status != "completed" or result.steps != steps:
        raise RuntimeError(f"run {result.status} at step {result.steps}, expected completed at {steps}; "
                           f"summary: {result.summary}")
    if f"checkpoint-{steps}" not in {p.name for p in out.glob("checkpoint-*")}:
        raise RuntimeError(f"no checkpoint-{steps} in {out}: {sorted(p.name for p in out.glob('checkpoint-*'))}")
    return result


def step_metrics(out: Path, target: int) -> list[dict[str, Any]]:
    """The step logs of metrics.jsonl, which must log steps 1..target once each (a resume that restarted from
    scratch would log 1..N twice)."""
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [m for m in metrics if "reward" in m]
    if [m.get("step") for m in steps] != list(range(1, target + 1)):
        raise RuntimeError(f"metrics.jsonl should log steps 1..{target} once each; got {[m.get('step') for m in steps]}")
    return steps


def export_checked(out: Path, backend: str, lora: Path, args: argparse.Namespace, adapter_text: Optional[str],
                   base_text: Optional[str]) -> dict[str, Any]:
    """merged16, then the merged model loaded by plain transformers (the plain backend) and generating."""
    from pipeline.cli import main as grpo

    merged = out / "merged16"
    rc = grpo(["export", "--lora", str(lora), "--to", "merged16", "--out", str(merged), "--backend", backend,
               "--overwrite"])
    if rc != 0:
        raise RuntimeError(f"grpo export exited {rc}")
    weights = sorted(p.name for p in merged.glob("*.safetensors"))
    if not (merged / "config.json").is_file() or not weights:
        raise RuntimeError(f"{merged} lacks config.json or *.safetensors: {sorted(os.listdir(merged))}")
    system_prompt = json.loads((out / "manifest.json").read_text())["system_prompt"]
    text = greedy(out, args, ["--base", "--model", str(merged)], "plain", "generate-merged", system_prompt=system_prompt)
    if adapter_text is not None and text == base_text != adapter_text:
        raise RuntimeError(f"the merged model generates the base model's {text!r}, not the adapter's "
                           f"{adapter_text!r}: the merge lost the LoRA")
    return {"files": sorted(os.listdir(merged)), "merged_text": text[:200], "same_as_adapter": text == adapter_text}


def run_chain_case(backend: str, model: str, precision: str, args: argparse.Namespace, rec: Recorder) -> None:
    """train -> resume -> generate -> export for one (backend, model, precision), in this process."""
    from pipeline.backends import BackendChoice

    params = run_params(args.dry_run)
    case = f"chain/{backend}/{model}/{precision}"
    out = args.work / "runs" / f"{backend}-{model}-{precision}"
    values = chain_values(backend, model, precision, out, args)
    choice = BackendChoice(backend, "the GPU check asks for it by name")
    state: dict[str, Any] = {}

    def train() -> dict[str, Any]:
        result = trained(values, choice, params["chain_steps"], out)
        state["lora"] = result.adapter_dir
        return {"steps": result.steps, "checkpoints": sorted(p.name for p in out.glob("checkpoint-*")),
                "peak_vram_gib": peak_gib()}

    def resume() -> dict[str, Any]:
        target = params["chain_steps"] + 1
        result = trained(values, choice, target, out)
        state["lora"] = result.adapter_dir
        return {"steps": result.steps, "logged_steps": [m["step"] for m in step_metrics(out, target)],
                "peak_vram_gib": peak_gib()}

    def generate() -> dict[str, Any]:
        """The trained adapter against the base model, both greedy: a LoRA that is not applied (or never moved
        from its zero init) gives the base model's text."""
        state["adapter_text"] = greedy(out, args, ["--lora", str(state["lora"])], backend, "generate")
        state["base_text"] = greedy(out, args, ["--base", "--run", str(out)], backend, "generate-base")
        if state["adapter_text"] == state["base_text"]:
            raise RuntimeError(f"the adapter did not change the greedy output: {state['base_text']!r} both ways")
        return {"adapter_text": state["adapter_text"][:200], "base_text": state["base_text"][:200]}

    def export() -> dict[str, Any]:
        return export_checked(out, backend, state["lora"], args, state.get("adapter_text"), state.get("base_text"))

    rec.write({"start": case})
    if not rec.run(f"{case}/train", train):
        for later in CHAIN_SUBSTEPS[1:]:
            rec.skip(f"{case}/{later}", "train failed")
        return
    rec.run(f"{case}/resume", resume)
    rec.run(f"{case}/generate", generate)
    rec.run(f"{case}/export", export)


def probe_gaps(out: Path, steps: list[int]) -> dict[str, Any]:
    """The stale-rollout probe's readings in metrics.jsonl (health/rollout_logp_gap, health/rollout_weights_step)
    at each of `steps`: each must be there, finite, within the stale rule's floor, and name the step itself as the
    weights the engine holds."""
    import math

    from pipeline.run.metric_names import ROLLOUT_LOGP_GAP, ROLLOUT_WEIGHTS_STEP
    from pipeline.health.stale import ROLLOUT_GAP_FLOOR

    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    probed = {m.get("step"): m for m in logged if ROLLOUT_LOGP_GAP in m}
    gaps = {step: probed.get(step, {}).get(ROLLOUT_LOGP_GAP) for step in steps}
    held = {step: probed.get(step, {}).get(ROLLOUT_WEIGHTS_STEP) for step in steps}
    bad = {step: gap for step, gap in gaps.items() if gap is None or not math.isfinite(gap) or gap > ROLLOUT_GAP_FLOOR}
    if bad:
        raise RuntimeError(f"{ROLLOUT_LOGP_GAP} missing or above {ROLLOUT_GAP_FLOOR} at steps {bad}: the engine does "
                           "not hold the trainer's weights")
    stale = {step: at for step, at in held.items() if at is not None and int(at) != step}
    if stale:
        raise RuntimeError(f"{ROLLOUT_WEIGHTS_STEP} names older weights than the step's own: {stale}")
    return {"rollout_logp_gap": gaps, "rollout_weights_step": held, "floor": ROLLOUT_GAP_FLOOR}


def run_vllm_substep(model: str, precision: str, substep: str, args: argparse.Namespace, rec: Recorder) -> None:
    """One sub-step of the Unsloth chain with fast_inference: true (VLLM_CHAIN_SUBSTEPS), in a process of its own;
    each reads what the earlier ones left in the run folder."""
    from pipeline.backends import BackendChoice, load_backend

    params = run_params(args.dry_run)
    case = f"chain/{VLLM_LABEL}/{model}/{precision}"
    out = args.work / "runs" / f"{VLLM_LABEL}-{model}-{precision}"
    values = chain_values(VLLM_LABEL, model, precision, out, args)
    choice = BackendChoice("unsloth", "the GPU check asks for it by name", fast_inference=True)
    lora, answers = out / "lora", args.work / "answers" / f"{out.name}-base.txt"

    def rollouts(calls: VllmCalls, steps: int) -> dict[str, Any]:
        summary = calls.summary()
        if summary["engines"] != 1 or summary["generate_calls"] < steps or summary["output_tokens"] == 0:
            raise RuntimeError(f"the rollouts did not come from one vLLM engine, a generate call (at least) per "
                               f"step: {summary} for {steps} steps")
        return summary

    def train() -> dict[str, Any]:
        with VllmCalls() as calls:
            result = trained(values, choice, params["chain_steps"], out)
        step_metrics(out, params["chain_steps"])
        return {"steps": result.steps, "vllm": rollouts(calls, params["chain_steps"]),
                "probe": probe_gaps(out, list(range(1, params["chain_steps"] + 1))), "peak_vram_gib": peak_gib(),
                "gpu_memory_utilization": VLLM_GPU_MEMORY_UTILIZATION}

    def resume() -> dict[str, Any]:
        target = params["chain_steps"] + 1
        with VllmCalls() as calls:
            result = trained(values, choice, target, out)
        steps = step_metrics(out, target)
        return {"steps": result.steps, "logged_steps": [m["step"] for m in steps],
                "vllm": rollouts(calls, 1), "probe": probe_gaps(out, [target])}

    def generate_base() -> dict[str, Any]:
        with VllmCalls() as calls:
            text = greedy(out, args, ["--base", "--run", str(out)], "unsloth", "generate-base")
        if calls.summary()["generate_calls"] == 0:
            raise RuntimeError(f"grpo generate --base made no vLLM call: {calls.summary()}")
        answers.write_text(text, encoding="utf-8")
        return {"base_text": text[:200], "vllm": calls.summary()}

    def generate() -> dict[str, Any]:
        """`grpo generate --lora` through fast_generate with the adapter's LoRARequest (load_lora): every vLLM
        call carries one, and the greedy answer differs from the base model's."""
        with VllmCalls() as calls:
            text = greedy(out, args, ["--lora", str(lora)], "unsloth", "generate")
        summary = calls.summary()
        if summary["generate_calls"] == 0 or summary["with_lora"] != summary["generate_calls"]:
            raise RuntimeError(f"grpo generate --lora did not go through vLLM with a LoRARequest: {summary}")
        base = answers.read_text(encoding="utf-8") if answers.is_file() else None
        if text == base:
            raise RuntimeError(f"the adapter did not change the greedy output: {base!r} both ways")
        (answers.with_name(f"{out.name}-adapter.txt")).write_text(text, encoding="utf-8")
        return {"adapter_text": text[:200], "base_text": (base or "")[:200], "vllm": summary}

    def export() -> dict[str, Any]:
        adapter = answers.with_name(f"{out.name}-adapter.txt")
        return export_checked(out, "unsloth", lora, args, adapter.read_text(encoding="utf-8") if adapter.is_file()
                              else None, answers.read_text(encoding="utf-8") if answers.is_file() else None)

    actions = {"train": train, "resume": resume, "generate-base": generate_base, "generate": generate,
               "export": export}
    rec.write({"start": f"{case}/{substep}"})
    if substep != "train" and not lora.is_dir():
        rec.skip(f"{case}/{substep}", f"train did not finish: {lora} is missing")
        return
    load_backend("unsloth").prepare_environment(make_config(values))  # `import unsloth` before vllm is imported
    rec.run(f"{case}/{substep}", actions[substep])


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


def child_chain(args: argparse.Namespace, rec: Recorder) -> None:
    cuda = has_cuda()
    for model, precision, *substep in args.cases:
        case = f"chain/{args.backend}/{model}/{precision}" + "".join(f"/{s}" for s in substep)
        reason = skip_reason(case, cuda=cuda, dry_run=args.dry_run)
        if reason:
            for step in unit_steps(case):
                rec.skip(step, reason)
            continue
        if args.backend == VLLM_LABEL:
            run_vllm_substep(model, precision, substep[0], args, rec)
        else:
            run_chain_case(args.backend, model, precision, args, rec)
