"""The GPU check's report read back (run_check.py writes it): the benchmark's rows, the memory planner against the
peak measured, the table printed at the end."""

from __future__ import annotations

import subprocess
from typing import Any, Optional
from benchmark import case_peak_gib
from cases import BENCH_SHAPES, VLLM_GPU_MEMORY_UTILIZATION, VLLM_LABEL, run_params
from gpu_image import installed_versions


ANCHOR = {
    "claim": "Unsloth GRPO uses about 90% less VRAM than Hugging Face TRL + Flash Attention 2",
    "source": "unsloth.ai/blog/grpo (2025-02-20); the same numbers on docs.unsloth.ai/basics/reasoning-grpo-and-rl",
    "their_setup": "Llama 3.1 8B, 20K context, 8 generations: 54.3 GB (Unsloth) vs 510.8 GB (TRL + FA2), with "
                   "Unsloth's vLLM rollouts and memory-efficient GRPO loss",
    "this_check": "no vLLM (fast_inference: false) on both sides, 4-bit QLoRA, short completions: the part of the "
                  "gap left without vLLM and long context",
}


def package_versions() -> dict[str, Optional[str]]:
    return installed_versions(("torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes",
                               "unsloth", "unsloth_zoo", "triton", "math-verify", "vllm", "xformers"))


def gpu_info() -> dict[str, Any]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"nvidia_smi": f"unavailable: {err}"}
    if out.returncode != 0:
        return {"nvidia_smi": f"exit {out.returncode}: {out.stderr.strip()[-300:]}"}
    name, driver, memory = (part.strip() for part in out.stdout.strip().splitlines()[0].split(","))
    return {"name": name, "driver": driver, "memory": memory}


def bench_rows(bench: dict[str, dict[str, Any]], counts: dict[str, int],
               image_outside: Optional[dict[str, str]] = None) -> list[dict[str, Any]]:
    """The figures bench/run_all.py reads: {figure, value, target, holds}; holds is None when not measured.

    >>> rows = bench_rows({}, {"pass": 3, "fail": 1, "skipped": 0}, {"fsspec": "2026.3.0, needs <=2026.2.0"})
    >>> rows[0]["value"], rows[0]["holds"], rows[1]["holds"], rows[-1]["value"], rows[-1]["holds"]
    ('3 passed, 1 failed, 0 skipped', False, None, '1 outside: fsspec', False)
    """
    rows = [{"figure": "GPU check steps",
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
        for name, case in (("plain", plain), ("unsloth", fast)):
            rows.append({"figure": f"grpo plan's peak estimate / measured peak VRAM, {name} ({where})",
                         **planned_vs_measured(case)})
        rows.append({"figure": f"GRPO step time, plain / Unsloth ({where})",
                     **ratio("median_step_s", plain, fast, ".3f", "s median", "> 1 (Unsloth faster)",
                             lambda v: v > 1.0)})
        rows.append({"figure": f"rollout tokens/s, Unsloth / plain ({where})",
                     **ratio("rollout_tokens_per_s", fast, plain, ".0f", "tokens/s", "> 1 (Unsloth faster)",
                             lambda v: v > 1.0)})
        engine = bench.get(f"{VLLM_LABEL}/{shape}")
        if engine is None:
            continue  # no vLLM row: vllm was not installed (the one-call set), or its case failed
        equal = bool(equal and engine["full_length"])
        utilization = engine.get("gpu_memory_utilization", VLLM_GPU_MEMORY_UTILIZATION)
        where = f"{shape} shape, 4-bit QLoRA GRPO, {length}-token completions"
        rows.append({"figure": f"rollout tokens/s, Unsloth + vLLM / Unsloth without vLLM ({where})",
                     **ratio("rollout_tokens_per_s", engine, fast, ".0f", "tokens/s", "> 1 (vLLM faster)",
                             lambda v: v > 1.0)})
        rows.append({"figure": f"rollout tokens/s, Unsloth + vLLM / plain ({where})",
                     **ratio("rollout_tokens_per_s", engine, plain, ".0f", "tokens/s", "> 1 (vLLM faster)",
                             lambda v: v > 1.0)})
        rows.append({"figure": f"GRPO step time, Unsloth without vLLM / Unsloth + vLLM ({where})",
                     **ratio("median_step_s", fast, engine, ".3f", "s median", "> 1 (vLLM faster)",
                             lambda v: v > 1.0)})
        rows.append({"figure": f"peak VRAM, Unsloth + vLLM at gpu_memory_utilization {utilization} ({where})",
                     "value": f"{engine.get('peak_vram_gib')} GiB allocated by torch, "
                              f"{engine.get('device_used_peak_gib')} GiB in use on the card",
                     "target": "reported: vLLM reserves its share of the card up front", "holds": None})
    if image_outside is not None:
        rows.append({"figure": "packages taken from the machine's image, within the ranges the kit needs",
                     "value": f"{len(image_outside)} outside: {', '.join(image_outside)}" if image_outside else
                     "all within", "target": "all within", "holds": not image_outside})
    return rows


def planned_vs_measured(case: dict[str, Any] | None) -> dict[str, Any]:
    """The planner's estimate against the peak one benchmark case allocated itself (benchmark.case_peak_gib).

    >>> planned_vs_measured({"planned_peak_gib": 2.2, "peak_vram_gib": 2.0})["value"]
    '1.10x (2.20 vs 2.00 GiB)'
    """
    from grpo_pipeline.pipeline.plan.estimate import UNCERTAINTY

    target = f"within ±{UNCERTAINTY:.0%} (the uncertainty grpo plan prints)"
    planned = (case or {}).get("planned_peak_gib")
    if planned is None or not (case or {}).get("peak_vram_gib"):
        return {"value": "not measured", "target": target, "holds": None}
    measured = case_peak_gib(case)
    ratio = planned / measured
    return {"value": f"{ratio:.2f}x ({planned:.2f} vs {measured:.2f} GiB)", "target": target,
            "holds": abs(ratio - 1) <= UNCERTAINTY}


def print_table(report: dict[str, Any]) -> None:
    print("\n[gpu-check] step results", flush=True)
    for record in report["steps"]:
        print(f"  {record['status']:8s} {record['step']}")
    print(f"[gpu-check] {report['summary']}")
    for row in report["bench_rows"]:
        print(f"  {row['figure']}: {row['value']} (target {row['target']}; holds: {row['holds']})")
    print(f"[gpu-check] {report['not_covered']}")
