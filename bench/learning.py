"""Does the CPU demo learn, and does a gamed reward really pull held-out accuracy down? Over several seeds.

These are claims about training trajectories, and a trajectory moves with the machine's floating-point kernels
and the package versions (the gamed-reward run measured 14% -> 8% -> 2%, then 26% -> 20% -> 15%, then 3% -> 0%
on three machines). So they live here, printed with their spread, and the suite tests the plumbing with a
certain signal instead (tests/test_demo_run.py).

For each seed, two runs on the demo's settings (format warm-up included):

- honest: the demo's own rewards, 40 GRPO steps; held-out accuracy before and after (20 problems), and the
  correctness reward's mean over the first and the last 10 steps;
- gamed:  train_helpers.first_operand_reward (pays for the sloppy teacher's wrong answer) at learning_rate
  6e-4, 30 steps, held-out accuracy on 100 problems every 5 steps, hacking_action: stop.

    python bench/learning.py                 # seeds 1 2 3 (about 5 minutes a seed on 2 cores)
    python bench/learning.py --seeds 7 8

Prints one line a seed and run, then the spread (min / median / max) of the honest gain, the reward rise and
the gamed fall, and how many gamed runs the hacking rule stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # train_helpers: the gamed reward


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def one_seed(seed: int, work: Path) -> dict:
    from grpo_pipeline.pipeline.config import from_mapping
    from grpo_pipeline.pipeline.demo.registry import cpu_demo_config
    from grpo_pipeline.pipeline.train import run_training

    honest_dir = work / f"honest-{seed}"
    cfg = from_mapping({**cpu_demo_config(), "output_dir": str(honest_dir), "max_steps": 40, "eval_limit": 20,
                        "save_steps": 100, "seed": seed})
    with contextlib.redirect_stdout(io.StringIO()):
        run_training(cfg)
    summary = json.loads((honest_dir / "summary.json").read_text())
    correctness = [r["rewards/correctness_reward_func/mean"] for r in _metrics(honest_dir) if "reward" in r]
    honest = {"before": summary["eval_before"]["accuracy"], "after": summary["eval_after"]["accuracy"],
              "reward_first10": sum(correctness[:10]) / 10, "reward_last10": sum(correctness[-10:]) / 10}

    gamed_dir = work / f"gamed-{seed}"
    shutil.copytree(honest_dir / "warmup", gamed_dir / "warmup")
    cfg = from_mapping({**cpu_demo_config(), "output_dir": str(gamed_dir), "max_steps": 30, "save_steps": 100,
                        "eval_steps": 5, "eval_limit": 100, "eval_before": False, "eval_after": False,
                        "hacking_window": 3, "hacking_action": "stop", "learning_rate": 6e-4, "seed": seed,
                        "reward_funcs": ["strict_format", "train_helpers:first_operand_reward"]})
    with contextlib.redirect_stdout(io.StringIO()):
        result = run_training(cfg)
    evals = [r["eval/accuracy"] for r in _metrics(gamed_dir) if "eval/accuracy" in r]
    gamed = {"evals": evals, "stopped": result.status == "stopped"}
    return {"seed": seed, "honest": honest, "gamed": gamed}


def spread(values: list[float]) -> str:
    return f"min {min(values):+.2f}  median {statistics.median(values):+.2f}  max {max(values):+.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            r = one_seed(seed, Path(tmp))
            h, g = r["honest"], r["gamed"]
            print(f"seed {seed}: honest accuracy {h['before']:.0%} -> {h['after']:.0%}, correctness reward "
                  f"{h['reward_first10']:.2f} -> {h['reward_last10']:.2f}; gamed evals "
                  f"{' -> '.join(f'{a:.0%}' for a in g['evals'])}, {'stopped' if g['stopped'] else 'completed'}",
                  flush=True)
            results.append(r)
    print("honest accuracy gain:  " + spread([r["honest"]["after"] - r["honest"]["before"] for r in results]))
    print("honest reward rise:    " + spread([r["honest"]["reward_last10"] - r["honest"]["reward_first10"]
                                              for r in results]))
    print("gamed accuracy change: " + spread([r["gamed"]["evals"][-1] - max(r["gamed"]["evals"]) for r in results]))
    print(f"gamed runs the hacking rule stopped: {sum(r['gamed']['stopped'] for r in results)}/{len(results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
