"""`grpo plan --gpus N --nodes M`: the first of configs/accelerate/ that fits, with the plain backend (Unsloth's is
single-GPU), and the memory each GPU needs: DDP (every GPU holds the one-GPU plan), ZeRO-2 (gradients and optimizer
states sharded) or ZeRO-3 (the 16-bit base weights too; it takes no 4-bit weights). Server mode gives one GPU to
`trl vllm-serve`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grpo_pipeline.pipeline.backends import planned_backend
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, validate
from grpo_pipeline.pipeline.plan.cards import Card
from grpo_pipeline.pipeline.plan.estimate import Estimate
from grpo_pipeline.pipeline.plan.fit import plan

SERVER_GPUS = 1  # GPUs `trl vllm-serve` takes in server mode (one engine; more for tensor parallel)


@dataclass
class ScalePlan:
    gpus: int
    nodes: int
    processes: int
    global_batch: int
    engine: Optional[str]  # "DDP", "ZeRO-2", "ZeRO-3"; None when nothing fits
    accelerate_config: Optional[str]
    per_gpu_gib: float
    usable_gib: float
    notes: list[str]

    @property
    def fits(self) -> bool:
        return self.engine is not None


def _sharded(result: Estimate, parts: tuple[str, ...], processes: int) -> float:
    """The peak with `parts` divided over the processes (each process holds 1/processes of them)."""
    held = sum(result.part(name) for name in parts)
    return result.peak_gib - held + held / processes


def scale_plan(cfg: PipelineConfig, card: Card, gpus: int, nodes: int) -> ScalePlan:
    """The Accelerate config and per-GPU memory for `gpus` GPUs on each of `nodes` machines (each >= 1: gpu_counts)."""
    server = cfg.model.vllm_mode == "server"
    processes = gpus * nodes - (SERVER_GPUS if server else 0)  # the server's GPU trains nothing
    if processes < 1:
        raise ConfigError("gpus", f"vllm_mode: server gives {SERVER_GPUS} GPU to `trl vllm-serve`, which leaves no "
                          "GPU to train: plan at least 2 GPUs, or use vllm_mode: colocate.")
    plain = cfg.replace(backend="plain")
    validate(plain, n_processes=processes, backend="plain", run_user_code=False)  # batch arithmetic for `processes`
    global_batch = plain.grpo.per_device_train_batch_size * plain.grpo.gradient_accumulation_steps * processes
    notes = []
    if not planned_backend(cfg.model.backend).MULTI_GPU and gpus * nodes > 1:
        notes.append("the Unsloth backend trains on one GPU: several GPUs train with --backend plain")
    if server:
        notes.append(f"{SERVER_GPUS} GPU serves (CUDA_VISIBLE_DEVICES=0 trl vllm-serve ...); {processes} train "
                     "(docs/scale-out.md)")
    ddp_config = "configs/accelerate/ddp.yaml" if nodes == 1 else "configs/accelerate/multinode.yaml"
    machines = "" if nodes == 1 else f", with num_machines {nodes}, num_processes {processes}"
    ddp = plan(plain, card)
    choices: list[tuple[str, str, float, Estimate]] = [
        ("DDP", ddp_config, ddp.peak_gib, ddp),
        ("ZeRO-2", "configs/accelerate/zero2.yaml" + machines, _sharded(ddp, ("gradients", "optimizer"), processes),
         ddp),
    ]
    if processes > 1:
        full = plan(plain.replace(load_in_4bit=False), card)  # ZeRO-3 shards 16-bit weights, not 4-bit ones
        choices.append(("ZeRO-3", "configs/accelerate/zero3.yaml" + machines + " and --load_in_4bit false",
                        _sharded(full, ("weights", "lora", "gradients", "optimizer"), processes), full))
    for engine, config, per_gpu, result in choices:
        if result.blocker is None and per_gpu <= result.usable_gib:
            if engine == "ZeRO-3":
                notes.append("FSDP2 shards the weights the same way (no config ships for it yet)")
            return ScalePlan(gpus, nodes, processes, global_batch, engine, config, per_gpu, result.usable_gib, notes)
    smallest = min(per_gpu for _, _, per_gpu, _ in choices)
    blocker = next((r.blocker for *_, r in choices if r.blocker), None)
    notes.append(blocker or f"even sharded over {processes} processes, {smallest:.1f} GiB per GPU exceeds the "
                 f"{ddp.usable_gib:.1f} GiB usable: more GPUs, a larger card, or a smaller model/batch")
    return ScalePlan(gpus, nodes, processes, global_batch, None, None, smallest, ddp.usable_gib, notes)


def render_scale(result: ScalePlan, card: Card) -> str:
    where = f"{result.gpus} GPU(s) x {result.nodes} machine(s) of {card.name}"
    lines = [f"scale: {where}: {result.processes} training process(es), global batch {result.global_batch} "
             "completions (batch arithmetic checked)"]
    if result.fits:
        lines.append(f"  {result.engine}: {result.accelerate_config}; {result.per_gpu_gib:.1f} GiB per GPU of "
                     f"{result.usable_gib:.1f} GiB usable")
    else:
        lines.append(f"  DOES NOT FIT on {where}: {result.per_gpu_gib:.1f} GiB per GPU at best")
    lines += [f"  note: {note}" for note in result.notes]
    return "\n".join(lines)


def scale_dict(result: ScalePlan) -> dict:
    return {"gpus": result.gpus, "nodes": result.nodes, "processes": result.processes,
            "global_batch": result.global_batch, "engine": result.engine,
            "accelerate_config": result.accelerate_config, "per_gpu_gib": round(result.per_gpu_gib, 2),
            "usable_gib": round(result.usable_gib, 2), "fits": result.fits, "notes": result.notes}
