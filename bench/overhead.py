"""How much does the pipeline add per GRPO step over bare TRL? Target: ratio <= 1.05.

Runs the same tiny model, data, rewards and GRPOConfig through
  (a) bare `trl.GRPOTrainer` (the five rewards, nothing else), and
  (b) our `pipeline.train.build_trainer` (+ health observer, health rules, metrics.jsonl, progress bar),
in interleaved rounds so machine noise hits both alike, and prints the median step time of each
and their ratio. A step's time is the gap between consecutive `on_step_end` calls, so it includes
everything each trainer does per step (generation, rewards, backward, callbacks, logging).

    python bench/overhead.py                 # 4 rounds x 20 steps each
    python bench/overhead.py --rounds 6 --steps 30
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def step_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def intervals(self) -> list[float]:
            return [b - a for a, b in zip(self.ends, self.ends[1:])]

    return StepTimer()


def grpo_args(cfg, output_dir: str, max_completion_length: int, extra: dict):
    import trl

    g = cfg.grpo
    return trl.GRPOConfig(
        output_dir=output_dir, learning_rate=g.learning_rate, num_generations=g.num_generations,
        per_device_train_batch_size=g.per_device_train_batch_size, max_steps=g.max_steps,
        max_completion_length=max_completion_length, beta=g.beta, loss_type=g.loss_type,
        temperature=g.temperature, logging_steps=1, save_strategy="no", report_to="none", seed=g.seed,
        disable_tqdm=True, reward_weights=None, **extra,
    )


def run_bare(cfg, prepared, steps: int) -> list[float]:
    import trl

    from pipeline.backends import plain
    from rewards import get_reward_funcs

    model, tokenizer = plain.load_for_training(cfg)
    timer = step_timer()
    with tempfile.TemporaryDirectory() as out:
        trainer = trl.GRPOTrainer(
            model=model, reward_funcs=get_reward_funcs(list(cfg.grpo.reward_funcs)),
            args=grpo_args(cfg, out, prepared.max_completion_length, plain.grpo_config_kwargs(cfg)),
            train_dataset=prepared.dataset, processing_class=tokenizer, peft_config=plain.peft_config(cfg),
            callbacks=[timer])
        trainer.train()
    return timer.intervals()


def run_pipeline(cfg, prepared, steps: int) -> list[float]:
    from pipeline.backends import plain
    from pipeline.train import build_trainer

    model, tokenizer = plain.load_for_training(cfg)
    timer = step_timer()
    with tempfile.TemporaryDirectory() as out:
        trainer, _ = build_trainer(cfg.replace(output_dir=out, save_steps=10_000), plain, model, tokenizer, prepared,
                                   plain.peft_config(cfg), Path(out))
        trainer.add_callback(timer)
        trainer.train()
    return timer.intervals()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pipeline.config import from_mapping
    from pipeline.data import prepare_dataset
    from pipeline.demo import DEMO_CONFIG
    from pipeline.tokenizer import load_tokenizer

    cfg = from_mapping({**DEMO_CONFIG, "max_steps": args.steps, "sft_warmup_steps": 0, "eval_before": False,
                        "eval_after": False})
    with tempfile.TemporaryDirectory() as report_dir:
        prepared = prepare_dataset(cfg, load_tokenizer(cfg.model.model_name_or_path), report_dir=Path(report_dir))

    bare: list[float] = []
    ours: list[float] = []
    for round_number in range(args.rounds):
        # Alternate which goes first, so warm caches favour neither.
        order = (("bare", run_bare), ("pipeline", run_pipeline)) if round_number % 2 == 0 else (
            ("pipeline", run_pipeline), ("bare", run_bare))
        for name, runner in order:
            times = runner(cfg, prepared, args.steps)
            (bare if name == "bare" else ours).extend(times)
            print(f"round {round_number + 1}/{args.rounds} {name:<8} median step {statistics.median(times) * 1000:7.1f} ms",
                  flush=True)

    bare_median, ours_median = statistics.median(bare), statistics.median(ours)
    print()
    print(f"{'':<10}{'steps':>7}{'median ms':>11}{'mean ms':>10}")
    print(f"{'bare TRL':<10}{len(bare):>7}{bare_median * 1000:>11.1f}{statistics.mean(bare) * 1000:>10.1f}")
    print(f"{'pipeline':<10}{len(ours):>7}{ours_median * 1000:>11.1f}{statistics.mean(ours) * 1000:>10.1f}")
    print(f"step-time ratio pipeline / bare TRL: {ours_median / bare_median:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
