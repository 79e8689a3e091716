"""The GPU check's chain child (run_check.py spawns it): train -> resume -> generate -> export per backend, model and
precision, and the vLLM chain's sub-steps, each recorded as it ends. The shapes, sizes and helpers it shares with
the other children are cases.py."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Optional

from cases import (
    CHAIN_SUBSTEPS,
    GENERATE_PROMPT,
    VLLM_GPU_MEMORY_UTILIZATION,
    VLLM_LABEL,
    Recorder,
    VllmCalls,
    base_mapping,
    free_memory,
    has_cuda,
    make_config,
    model_path,
    peak_gib,
    run_params,
    skip_reason,
    unit_steps,
)


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
    from grpo_pipeline.pipeline.cli import main as grpo

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
    from grpo_pipeline.pipeline.train import run_training

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
    from grpo_pipeline.pipeline.cli import main as grpo

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
    from grpo_pipeline.pipeline.backends import BackendChoice

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

    from grpo_pipeline.pipeline.run.metric_names import ROLLOUT_LOGP_GAP, ROLLOUT_WEIGHTS_STEP
    from grpo_pipeline.pipeline.health.rollout import ROLLOUT_GAP_FLOOR

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
    from grpo_pipeline.pipeline.backends import BackendChoice, load_backend

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
    # `import unsloth` before vllm is imported
    load_backend("unsloth").prepare_environment(make_config(values))
    rec.run(f"{case}/{substep}", actions[substep])


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
