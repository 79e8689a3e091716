"""How much does the pipeline add per GRPO step over bare TRL? Target: ratio <= 1.05.

Runs the same tiny model, data, rewards and training arguments through
  (a) bare `trl.GRPOTrainer` (the five rewards, nothing else), and
  (b) our `grpo_pipeline.pipeline.trainer.build.build_trainer` (+ health observer, health rules, metrics.jsonl, progress bar),
in interleaved rounds so machine noise hits both alike. Equal work, checked rather than assumed:

- both sides get the `trl.GRPOConfig` that `grpo_pipeline.pipeline.trainer.build.grpo_training_args` makes (the one
  `build_trainer` uses); the bench compares the two configs field by field and stops if they differ
  in anything but the output folder and the observer's zero reward weight;
- the demo model is random here (no warm-up), so its garbled output would trip the garbled-output
  rule and end the pipeline's run early: every health rule is set to warn;
- the bench stops with an error if the sides complete different numbers of steps or generate
  completions of different mean length (a different amount of work per step).

A step's time is the gap between consecutive `on_step_end` calls, so it includes everything each
trainer does per step (generation, rewards, backward, callbacks, logging). Each step is timed twice:
wall clock, and the process's CPU time (`time.process_time`). On a machine shared with other jobs the
wall clock also counts waiting for a core, which swings a round's ratio by +-30%; CPU time counts only
this process's work (the demo model runs on one thread, and nothing here waits on I/O), so the target
is judged on it and the wall ratio is printed beside it. The pipeline's rewards run in worker processes of their
own (reward_timeout is set by default: rewards/worker.py); their CPU time is added to the trainer's, so work moved
into a worker is still counted. Printed: each side's median step time and
sample count, the ratios of medians, and the per-round ratios (the spread).

    python bench/overhead.py                 # 4 rounds x 20 steps each
    python bench/overhead.py --rounds 6 --steps 30
    python bench/overhead.py --tools         # a tool run: TRL's tool loop on both sides
    python bench/overhead.py --reward_timeout 0   # the pipeline's rewards in the trainer's process (no deadline)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = 1.05
# Fields that may differ between the two sides' GRPOConfig: where each writes, and the pipeline's
# extra zero weight for its health observer (bare TRL has no observer, so one weight fewer).
EXPECTED_CONFIG_DIFFERENCES = {"output_dir", "logging_dir", "reward_weights"}


class UnequalWork(RuntimeError):
    """The two sides did not do the same work: their step times are not comparable."""


@dataclass
class SideRun:
    intervals: list[float]  # seconds between consecutive step ends (wall clock)
    cpu_intervals: list[float]  # the process's CPU seconds over the same steps
    steps: int  # trainer.state.global_step at the end
    mean_completion_length: float  # TRL's completions/mean_length, averaged over the logged steps
    config: dict


def step_timer():
    from transformers import TrainerCallback

    from grpo_pipeline.rewards.worker import workers_cpu_seconds

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []
            self.cpu_ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())
            self.cpu_ends.append(time.process_time() + workers_cpu_seconds())

        def intervals(self, cpu: bool = False) -> list[float]:
            ends = self.cpu_ends if cpu else self.ends
            return [b - a for a, b in zip(ends, ends[1:])]

    return StepTimer()


def bench_config(steps: int, tools: bool = False, **overrides):
    """The demo config without warm-up or eval, every health rule set to warn (the model is random). `tools`: a
    tool run instead, on the tiny Qwen2 with Qwen2.5's template, steered (tests/agent_helpers.py) to call
    bench/agent_tools.py's `subtract` once per rollout (TRL's tool loop runs on both sides)."""
    from grpo_pipeline.pipeline.config import from_mapping
    from grpo_pipeline.pipeline.demo.registry import cpu_demo_config

    if tools:
        from grpo_pipeline.pipeline.assets import load_qwen_tokenizer
        from tests.agent_helpers import forced_text_bias, tool_call_text

        bias = forced_text_bias(load_qwen_tokenizer(), tool_call_text(("subtract", {"minuend": 5, "subtrahend": 3})))
        overrides = {"model_name_or_path": "tiny-qwen2.5", "dataset_name": "sample", "max_samples": 64,
                     "max_completion_length": "48", "num_generations": 4,
                     "per_device_train_batch_size": 4, "tools": ["bench.agent_tools:subtract"],
                     "max_tool_calling_iterations": 1, "generation_kwargs": {"sequence_bias": bias}, **overrides}
    return from_mapping({**cpu_demo_config(), "max_steps": steps, "sft_warmup_steps": 0, "eval_before": False,
                         "eval_after": False, "eval_steps": 0, "garbled_action": "warn", "repetition_action": "warn",
                         "kl_action": "warn", "save_steps": 10_000, **overrides})


def prepare(cfg):
    from grpo_pipeline.pipeline.data.prepare import prepare_dataset
    from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer

    with tempfile.TemporaryDirectory() as report_dir:
        return prepare_dataset(cfg, load_tokenizer(cfg.model.model_name_or_path), report_dir=Path(report_dir))


def _finish(trainer, timer) -> SideRun:
    lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
    return SideRun(timer.intervals(), timer.intervals(cpu=True), trainer.state.global_step,
                   statistics.mean(lengths) if lengths else float("nan"), trainer.args.to_dict())


def run_bare(cfg, prepared, callbacks=()) -> SideRun:
    import trl

    from grpo_pipeline.pipeline.backends import plain
    from grpo_pipeline.pipeline.trainer.agents import resolve_agents
    from grpo_pipeline.pipeline.trainer.build import grpo_training_args
    from grpo_pipeline.rewards import check_reward_weights, get_reward_funcs

    model, tokenizer = plain.load_for_training(cfg)
    timer = step_timer()
    g = cfg.grpo
    with tempfile.TemporaryDirectory() as out:
        args = grpo_training_args(plain, cfg, model, prepared, Path(out),
                                  check_reward_weights(list(g.reward_funcs), g.reward_weights))
        trainer = trl.GRPOTrainer(
            model=model, reward_funcs=get_reward_funcs(list(g.reward_funcs)), args=args,
            train_dataset=prepared.dataset, processing_class=tokenizer,
            peft_config=plain.peft_config(cfg),
            callbacks=[timer, *callbacks],
            **resolve_agents(cfg.grpo).trainer_kwargs())  # a tool run's tools, as TRL's
        trainer.train()
    return _finish(trainer, timer)


def run_pipeline(cfg, prepared, callbacks=()) -> SideRun:
    from grpo_pipeline.pipeline.backends import plain
    from grpo_pipeline.pipeline.trainer.agents import resolve_agents
    from grpo_pipeline.pipeline.trainer.build import build_trainer

    model, tokenizer = plain.load_for_training(cfg)
    timer = step_timer()
    with tempfile.TemporaryDirectory() as out:
        run_cfg = cfg.replace(output_dir=out)
        trainer, _ = build_trainer(resolve_agents(run_cfg.grpo), plain,
                                   run_cfg, model, tokenizer, prepared,
                                   plain.peft_config(cfg), Path(out))
        trainer.add_callback(timer)
        for callback in callbacks:
            trainer.add_callback(callback)
        trainer.train()
    return _finish(trainer, timer)


def check_equal_work(bare: SideRun, ours: SideRun, label: str) -> None:
    differing = sorted(k for k in set(bare.config) | set(ours.config)
                       if k not in EXPECTED_CONFIG_DIFFERENCES and bare.config.get(k) != ours.config.get(k))
    if differing:
        raise UnequalWork(f"{label}: the GRPOConfigs differ in {differing}")
    if bare.steps != ours.steps or len(bare.intervals) != len(ours.intervals):
        raise UnequalWork(f"{label}: bare TRL completed {bare.steps} steps, the pipeline {ours.steps}")
    # Same seed, same model, same data: the sampled completions should match; 1% leaves room for
    # floating-point order differences, not for a side that stops generating early.
    if abs(bare.mean_completion_length - ours.mean_completion_length) > 0.01 * bare.mean_completion_length:
        raise UnequalWork(f"{label}: mean completion length {bare.mean_completion_length:.2f} tokens (bare TRL) "
                          f"vs {ours.mean_completion_length:.2f} (pipeline)")


def measure(rounds: int, steps: int, log=print, tools: bool = False, reward_timeout: Optional[float] = None) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    cfg = bench_config(steps, tools=tools, **({} if reward_timeout is None else {"reward_timeout": reward_timeout}))
    prepared = prepare(cfg)
    bare: list[float] = []
    ours: list[float] = []
    bare_cpu: list[float] = []
    ours_cpu: list[float] = []
    round_ratios: list[float] = []
    round_cpu_ratios: list[float] = []
    lengths: list[float] = []
    for round_number in range(rounds):
        # Alternate which goes first, so warm caches favour neither.
        order = [("bare", run_bare), ("pipeline", run_pipeline)]
        if round_number % 2:
            order.reverse()
        runs = {name: runner(cfg, prepared) for name, runner in order}
        check_equal_work(runs["bare"], runs["pipeline"], f"round {round_number + 1}")
        bare.extend(runs["bare"].intervals)
        ours.extend(runs["pipeline"].intervals)
        bare_cpu.extend(runs["bare"].cpu_intervals)
        ours_cpu.extend(runs["pipeline"].cpu_intervals)
        lengths.append(runs["bare"].mean_completion_length)
        ratio = statistics.median(runs["pipeline"].intervals) / statistics.median(runs["bare"].intervals)
        round_ratios.append(ratio)
        cpu_ratio = statistics.median(runs["pipeline"].cpu_intervals) / statistics.median(runs["bare"].cpu_intervals)
        round_cpu_ratios.append(cpu_ratio)
        log(f"round {round_number + 1}/{rounds}: {runs['bare'].steps} steps each, mean completion "
            f"{runs['bare'].mean_completion_length:.1f} tokens; median step bare "
            f"{statistics.median(runs['bare'].intervals) * 1000:.1f} ms, pipeline "
            f"{statistics.median(runs['pipeline'].intervals) * 1000:.1f} ms, ratio {ratio:.3f} (CPU time {cpu_ratio:.3f})")
    return {"bare": bare, "ours": ours, "round_ratios": round_ratios, "rounds": rounds, "steps": steps,
            "ratio": statistics.median(ours) / statistics.median(bare),
            "bare_cpu": bare_cpu, "ours_cpu": ours_cpu, "round_cpu_ratios": round_cpu_ratios,
            "cpu_ratio": statistics.median(ours_cpu) / statistics.median(bare_cpu),
            "mean_completion_length": statistics.mean(lengths)}


def report(result: dict) -> None:
    bare, ours = result["bare"], result["ours"]
    print()
    print(f"{'':<10}{'samples':>8}{'median ms':>11}{'mean ms':>10}{'median CPU ms':>15}")
    for label, wall, cpu in (("bare TRL", bare, result["bare_cpu"]), ("pipeline", ours, result["ours_cpu"])):
        print(f"{label:<10}{len(wall):>8}{statistics.median(wall) * 1000:>11.1f}{statistics.mean(wall) * 1000:>10.1f}"
              f"{statistics.median(cpu) * 1000:>15.1f}")
    spread, cpu_spread = result["round_ratios"], result["round_cpu_ratios"]
    print(f"step-time ratio pipeline / bare TRL: {result['ratio']:.3f} wall (per round {min(spread):.3f}-"
          f"{max(spread):.3f}), {result['cpu_ratio']:.3f} CPU time (per round {min(cpu_spread):.3f}-"
          f"{max(cpu_spread):.3f}) over {result['rounds']} rounds; {len(ours)} + {len(bare)} step intervals "
          f"(target <= {TARGET}, on CPU time)")


def rows(rounds: int = 6, steps: int = 12) -> list[dict]:
    """bench/run_all.py's protocol: the figures of this bench, measured at run_all's size."""
    result = measure(rounds, steps, log=lambda line: print(line, file=sys.stderr, flush=True))
    spread, cpu_spread = result["round_ratios"], result["round_cpu_ratios"]
    samples = f"{len(result['ours'])}+{len(result['bare'])} steps"
    return [{"figure": "pipeline / bare TRL step time, CPU time", "value": f"{result['cpu_ratio']:.3f} "
             f"(rounds {min(cpu_spread):.3f}-{max(cpu_spread):.3f})", "target": f"<= {TARGET}",
             "holds": result["cpu_ratio"] <= TARGET, "samples": samples},
            {"figure": "pipeline / bare TRL step time, wall", "value": f"{result['ratio']:.3f} "
             f"(rounds {min(spread):.3f}-{max(spread):.3f})", "target": "(shared machine: noisy)",
             "holds": None, "samples": samples}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tools", action="store_true", help="a tool run (TRL's tool loop, a steered tiny Qwen2)")
    parser.add_argument("--reward_timeout", type=float, default=None,
                        help="the pipeline's reward_timeout (default: the recipe's, 600 s: each reward in a process "
                             "of its own; 0: every reward in the trainer's process, without a limit)")
    args = parser.parse_args()
    if args.steps < 3 or args.rounds < 1:
        parser.error("--steps must be at least 3 and --rounds at least 1")
    try:
        report(measure(args.rounds, args.steps, log=lambda line: print(line, flush=True), tools=args.tools,
                       reward_timeout=args.reward_timeout))
    except UnequalWork as err:
        print(f"error: unequal work, the ratio would mean nothing: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
