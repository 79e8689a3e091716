"""How does a GRPO step's time grow with num_generations and max_completion_length? The table to size a run.

Trains the tiny demo model (random, no warm-up; health rules set to warn) through the pipeline's
`build_trainer` on the CPU and splits each step into its parts:

- generation:          TRL's `_generate` (sampling the completions)
- rewards:             TRL's `_calculate_rewards` (the five rewards + the health observer)
- loss forward:        `compute_loss` (policy log-probs and the GRPO loss)
- backward:            `accelerator.backward`
- pipeline callbacks:  the pipeline's own TrainerCallbacks (health rules, metrics.jsonl, progress bar)
- other:               the rest of the step (old log-probs, optimizer step, TRL's bookkeeping)

Sweeps num_generations (4, 8, 16) at max_completion_length 64, and max_completion_length
(32, 64, 128) at num_generations 8, with a fixed number of prompts per step. Every completion is
forced to full length (`min_new_tokens`, so EOS cannot end it early; checked from TRL's logged mean
length: the bench stops if not, and if a part caught no time), so the work per step is exactly
prompts x generations x length tokens. The first step of each setting is a warm-up and is dropped;
the rest are the samples (median per part, and the spread of the step time). Then it fits step
time = a + b x completions per step (the generation sweep) and = a + b x completion tokens per step
(the length sweep) by least squares.

    python bench/scaling.py                  # 4 prompts per step, 5 steps per setting (~1-2 min on 2 cores)
    python bench/scaling.py --steps 8 --prompts 2

Timings are for the tiny CPU model: they show the shape (what grows with what), not GPU seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("generation", "rewards", "loss forward", "backward", "pipeline callbacks")
GENERATIONS_SWEEP = (4, 8, 16)
LENGTH_SWEEP = (32, 64, 128)
FIXED_GENERATIONS, FIXED_LENGTH = 8, 64


class PartClock:
    """Accumulates seconds per part; `step_end` closes a step and keeps its parts and total."""

    def __init__(self):
        self.running: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.last_end: float | None = None

    def timed(self, part: str, func):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.running[part] += time.perf_counter() - start
        return wrapper

    def step_end(self) -> None:
        now = time.perf_counter()
        if self.last_end is not None:
            parts = dict(self.running)
            parts["step"] = now - self.last_end
            parts["other"] = parts["step"] - sum(parts.get(p, 0.0) for p in PARTS)
            self.steps.append(parts)
        self.last_end = now
        self.running = defaultdict(float)


def instrument(trainer, clock: PartClock) -> None:
    """Time the step's parts by wrapping the trainer's own methods (the same call paths TRL takes)."""
    from transformers import TrainerCallback

    trainer._generate = clock.timed("generation", trainer._generate)
    trainer._calculate_rewards = clock.timed("rewards", trainer._calculate_rewards)
    trainer.compute_loss = clock.timed("loss forward", trainer.compute_loss)
    trainer.accelerator.backward = clock.timed("backward", trainer.accelerator.backward)
    for callback in trainer.callback_handler.callbacks:
        if type(callback).__module__.startswith("grpo_pipeline.pipeline."):
            for event in dir(TrainerCallback):
                if event.startswith("on_"):
                    setattr(callback, event, clock.timed("pipeline callbacks", getattr(callback, event)))

    class StepEnd(TrainerCallback):
        # Added last, so a step's pipeline callbacks are counted in that step.
        def on_step_end(self, args, state, control, **kwargs):
            clock.step_end()

    trainer.add_callback(StepEnd())


def run_setting(generations: int, length: int, prompts: int, steps: int) -> dict:
    import grpo_pipeline.pipeline.trainer.build as train_module
    from bench.overhead import bench_config, prepare
    from grpo_pipeline.pipeline.backends import plain
    from grpo_pipeline.pipeline.trainer.agents import Agents

    cfg = bench_config(steps, num_generations=generations, per_device_train_batch_size=prompts * generations,
                       max_completion_length=str(length), max_seq_length=128 + length)
    prepared = prepare(cfg)
    model, tokenizer = plain.load_for_training(cfg)
    original = train_module.grpo_training_args

    def full_length_args(*args, **kwargs):
        grpo_args = original(*args, **kwargs)
        # EOS is suppressed until the last token, so every completion is exactly `length` long.
        grpo_args.generation_kwargs = {**(grpo_args.generation_kwargs or {}), "min_new_tokens": length}
        return grpo_args

    clock = PartClock()
    train_module.grpo_training_args = full_length_args  # build_trainer reads it from the module
    try:
        with tempfile.TemporaryDirectory() as out:
            run_cfg = cfg.replace(output_dir=out)  # no tools: no agents
            trainer, _ = train_module.build_trainer(Agents(), plain, run_cfg,
                                                    model, tokenizer, prepared, plain.peft_config(cfg), Path(out))
            instrument(trainer, clock)
            trainer.train()
    finally:
        train_module.grpo_training_args = original
    lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
    if not lengths or min(lengths) < length:
        raise RuntimeError(f"completions were not forced to full length {length}: mean lengths {lengths}")
    # Step 1 has no start mark, so it is not among these: it carries first-call costs (lazy imports,
    # allocator growth) and is the warm-up the docstring mentions.
    measured = clock.steps
    if not measured:
        raise RuntimeError(f"--steps {steps} leaves no step after the warm-up one; use at least 2")
    step_times = [s["step"] for s in measured]
    result = {"generations": generations, "length": length, "completions": prompts * generations,
              "samples": len(measured), "step": statistics.median(step_times),
              "spread": (min(step_times), max(step_times)),
              **{part: statistics.median(s.get(part, 0.0) for s in measured) for part in (*PARTS, "other")}}
    untimed = [part for part in PARTS if result[part] <= 0]
    if untimed:
        raise RuntimeError(f"no time caught for {untimed}: the step no longer calls what `instrument` wraps")
    return result


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope (statistics.linear_regression, standard library)."""
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def measure(prompts: int, steps: int, log=print) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    settings = sorted({(g, FIXED_LENGTH) for g in GENERATIONS_SWEEP} | {(FIXED_GENERATIONS, n) for n in LENGTH_SWEEP})
    results = {}
    for generations, length in settings:
        results[(generations, length)] = run_setting(generations, length, prompts, steps)
        r = results[(generations, length)]
        log(f"num_generations {generations:>2}, max_completion_length {length:>3}: median step "
            f"{r['step'] * 1000:.0f} ms over {r['samples']} steps", flush=True)
    by_generations = [results[(g, FIXED_LENGTH)] for g in GENERATIONS_SWEEP]
    by_length = [results[(FIXED_GENERATIONS, n)] for n in LENGTH_SWEEP]
    per_completion = fit([r["completions"] for r in by_generations], [r["step"] * 1000 for r in by_generations])
    per_token = fit([r["completions"] * r["length"] for r in by_length], [r["step"] * 1000 for r in by_length])
    return {"by_generations": by_generations, "by_length": by_length, "per_completion": per_completion,
            "per_token": per_token, "prompts": prompts}


def report(result: dict) -> None:
    header = (f"{'gens':>5}{'len':>5}{'compl.':>7}{'step ms':>9}{'spread ms':>13}" +
              "".join(f"{p:>12}" for p in ("generation", "rewards", "loss fwd", "backward", "callbacks", "other")) +
              f"{'samples':>9}")
    print(f"\n{result['prompts']} prompts per step; completions forced to full length; medians in ms")
    for title, key in (("num_generations sweep (max_completion_length 64)", "by_generations"),
                       ("max_completion_length sweep (num_generations 8)", "by_length")):
        print(title)
        print(header)
        for r in result[key]:
            spread = f"{r['spread'][0] * 1000:.0f}-{r['spread'][1] * 1000:.0f}"
            print(f"{r['generations']:>5}{r['length']:>5}{r['completions']:>7}{r['step'] * 1000:>9.0f}{spread:>13}" +
                  "".join(f"{r[p] * 1000:>12.1f}" for p in (*PARTS, "other")) + f"{r['samples']:>9}")
    a, b = result["per_completion"]
    print(f"fit (length 64): step = {a:.0f} ms + {b:.2f} ms per completion")
    a, b = result["per_token"]
    print(f"fit (8 generations): step = {a:.0f} ms + {b * 1000:.1f} us per completion token")


def rows(prompts: int = 4, steps: int = 5) -> list[dict]:
    """bench/run_all.py's protocol: the fitted costs, measured at run_all's size (no targets: they size runs)."""
    result = measure(prompts, steps, log=lambda line, **kw: print(line, file=sys.stderr, **kw))
    samples = sum(r["samples"] for r in result["by_generations"] + result["by_length"])
    (a, b), (c, d) = result["per_completion"], result["per_token"]
    callbacks = max(r["pipeline callbacks"] / r["step"] for r in result["by_generations"] + result["by_length"])
    return [
        {"figure": "CPU step time vs completions (len 64)", "value": f"{a:.0f} ms + {b:.2f} ms/completion",
         "target": "(sizing)", "holds": None, "samples": f"{samples} steps"},
        {"figure": "CPU step time vs completion tokens", "value": f"{c:.0f} ms + {d * 1000:.1f} us/token",
         "target": "(sizing)", "holds": None, "samples": f"{samples} steps"},
        {"figure": "pipeline callbacks, share of a step", "value": f"{callbacks:.1%} (worst setting)",
         "target": "< 5%", "holds": callbacks < 0.05, "samples": f"{samples} steps"},
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (each gets num_generations)")
    parser.add_argument("--steps", type=int, default=5, help="steps per setting; the first is dropped")
    args = parser.parse_args()
    if args.steps < 3 or args.prompts < 1:
        parser.error("--steps must be at least 3 (one warm-up, two timed) and --prompts at least 1")
    report(measure(args.prompts, args.steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
