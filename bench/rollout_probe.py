"""What does the rollout probe cost beside a GRPO step? Target: one probe under 2% of a step on the CPU demo.

The probe (pipeline/health/rollout.py RolloutProbe.measure) scores a fixed prompt + continuation with the trainer's
model and with the rollout engine: here the real one, TRL's colocated vLLM on vLLM's CPU build (vllm_mode:
colocate, the built-in tiny-demo-vllm; each probe sends the weights as a rollout does, then scores). The probe runs
at every step (rollout_probe_steps: 1) of the pipeline's own trainer on the demo config (bench/overhead.py
bench_config), and each call is timed. A step's time is the gap between consecutive `on_step_end` calls less the
probe inside it; both are measured as wall clock and as this process's CPU time (the target is judged on CPU time,
see bench/overhead.py). Printed: samples, medians, the per-probe ratio, and the ratio amortised over the default
rollout_probe_steps.

    python bench/rollout_probe.py               # 30 steps
    python bench/rollout_probe.py --steps 60
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.overhead import bench_config, prepare, run_pipeline  # noqa: E402

TARGET = 0.02


def measure(steps: int) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from grpo_pipeline.pipeline.config import HealthArguments
    from grpo_pipeline.pipeline.health.rollout import RolloutProbe

    # min_p off: under TRL's vLLM rollouts a truncating sampler is refused (pipeline/config/validate.py)
    cfg = bench_config(steps, rollout_probe_steps=1, model_name_or_path="tiny-demo-vllm", vllm_mode="colocate",
                       min_p=None, lora_modules_to_save=[])
    prepared = prepare(cfg)
    probes: list[tuple[int, float, float]] = []  # (step, wall s, CPU s)
    measure_once = RolloutProbe.measure

    def timed(self, model, step):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return measure_once(self, model, step)
        finally:
            probes.append((step, time.perf_counter() - wall, time.process_time() - cpu))

    RolloutProbe.measure = timed
    try:
        run = run_pipeline(cfg, prepared)  # the pipeline's trainer exactly as bench/overhead.py times it
    finally:
        RolloutProbe.measure = measure_once
    by_step = {step: (wall, cpu) for step, wall, cpu in probes}
    # interval i runs from step i + 1's on_step_end to step i + 2's; step i + 1's log (and probe) ran inside it
    steps_wall = [gap - by_step.get(i + 1, (0.0, 0.0))[0] for i, gap in enumerate(run.intervals)]
    steps_cpu = [gap - by_step.get(i + 1, (0.0, 0.0))[1] for i, gap in enumerate(run.cpu_intervals)]
    probe_wall = [wall for _, wall, _ in probes]
    probe_cpu = [cpu for _, _, cpu in probes]
    every = HealthArguments().rollout_probe_steps
    ratio = statistics.median(probe_cpu) / statistics.median(steps_cpu)
    return {"steps": len(steps_cpu), "probes": len(probes), "step_ms": statistics.median(steps_wall) * 1000,
            "step_cpu_ms": statistics.median(steps_cpu) * 1000, "probe_ms": statistics.median(probe_wall) * 1000,
            "probe_cpu_ms": statistics.median(probe_cpu) * 1000, "ratio": ratio,
            "wall_ratio": statistics.median(probe_wall) / statistics.median(steps_wall),
            "every": every, "amortised": ratio / every}


def report(result: dict) -> None:
    print(f"{'':<8}{'samples':>8}{'median ms':>11}{'median CPU ms':>15}")
    print(f"{'step':<8}{result['steps']:>8}{result['step_ms']:>11.1f}{result['step_cpu_ms']:>15.1f}")
    print(f"{'probe':<8}{result['probes']:>8}{result['probe_ms']:>11.2f}{result['probe_cpu_ms']:>15.2f}")
    print(f"probe / step: {result['ratio']:.2%} CPU time ({result['wall_ratio']:.2%} wall) per probe; "
          f"{result['amortised']:.3%} per step at rollout_probe_steps={result['every']} (target < {TARGET:.0%} "
          "per probe, on CPU time)")


def rows(steps: int = 20) -> list[dict]:
    """bench/run_all.py's protocol."""
    result = measure(steps)
    return [{"figure": "rollout probe / GRPO step, CPU time", "value": f"{result['ratio']:.2%} per probe",
             "target": f"< {TARGET:.0%}", "holds": result["ratio"] < TARGET,
             "samples": f"{result['probes']} probes, {result['steps']} steps"}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    if args.steps < 3:
        parser.error("--steps must be at least 3")
    report(measure(args.steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
