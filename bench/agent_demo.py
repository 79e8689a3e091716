"""Does the CPU agent demo learn to call its `calculator` tool? configs/cpu-agent-demo.yaml, before and after GRPO.

Runs the recipe as `grpo train --config configs/cpu-agent-demo.yaml` does (format warm-up on tool conversations,
then GRPO with the correctness reward and TRL's tool loop live) and reads the run's own eval of the held-out split,
before GRPO (eval_before.json) and after (summary.json): `grpo train` answers each problem through TRL's tool loop
with the recipe's tools (pipeline/infer/tool_loop.py), greedy, scored with the run's correctness reward, and records
each row's calls. This script adds only the "right call" share, from those calls.

    python bench/agent_demo.py                 # seed 0, the recipe's (4-6 minutes on 2 shared cores)
    python bench/agent_demo.py --seeds 1 2

Prints, per seed and model: accuracy, the share of problems whose answer called the tool, the share that called it
right (its first call: calculator with the question's operands and `*`), tool calls per problem, and the run's wall
time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


RECIPE = ROOT / "configs" / "cpu-agent-demo.yaml"
OPERANDS = re.compile(r"(\d{3})\D+(\d{2})\D")


def _call_is_right(call: dict, question: str) -> bool:
    a, b = OPERANDS.search(question).groups()
    args = call.get("arguments") if isinstance(call.get("arguments"), dict) else {}
    return (call.get("name") == "calculator" and str(args.get("a")) == a and str(args.get("b")) == b
            and args.get("op") == "*")


def tool_use(result: dict, questions: dict[str, str]) -> dict:
    """An eval's accuracy and tool use, as shares of its problems; `questions`: each eval row's question by id."""
    calls = result["tool_calls"]
    n = len(calls)
    return {"accuracy": result["accuracy"], "calls_per_problem": result["tools"]["calls_per_rollout"],
            "tool_calls": sum(1 for made in calls.values() if made) / n,
            "right_tool_calls": sum(1 for row, made in calls.items()
                                    if made and _call_is_right(made[0], questions[row])) / n}


def eval_questions(cfg) -> dict[str, str]:
    """The run's eval rows' questions by row id, prepared as the run prepared them (its cache: a load)."""
    from grpo_pipeline.pipeline.data.run_data import load_eval_rows
    from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(cfg.model.model_name_or_path, cfg.model.trust_remote_code, cfg.model.model_source)
    return {row["id"]: row["prompt"][-1]["content"]
            for row in load_eval_rows(cfg, tokenizer, write_report=False)}


def one_seed(seed: int, work: Path, overrides: dict) -> dict:
    from grpo_pipeline.pipeline.config import from_mapping, read_recipe
    from grpo_pipeline.pipeline.train import run_training

    run_dir = work / f"seed-{seed}"
    cfg = from_mapping({**read_recipe(str(RECIPE)), "output_dir": str(run_dir), "seed": seed, **overrides})
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        run_training(cfg)
    seconds = time.monotonic() - started
    before = json.loads((run_dir / "eval_before.json").read_text())["result"]
    after = json.loads((run_dir / "summary.json").read_text())["eval_after"]
    questions = eval_questions(cfg)
    return {"train_seconds": seconds, "before": tool_use(before, questions), "after": tool_use(after, questions)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="recipe overrides to try (e.g. max_steps=80 learning_rate=3e-4)")
    args = parser.parse_args(argv)
    import yaml

    overrides = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.set)}
    with tempfile.TemporaryDirectory(prefix="agent-demo-") as tmp:
        for seed in args.seeds:
            f = one_seed(seed, Path(tmp), overrides)
            for label in ("before", "after"):
                m = f[label]
                print(f"seed {seed} {label:6s} GRPO: accuracy {m['accuracy']:.0%}, called the tool "
                      f"{m['tool_calls']:.0%}, right call {m['right_tool_calls']:.0%}, tool calls per problem "
                      f"{m['calls_per_problem']:.2f}", flush=True)
            print(f"seed {seed} grpo train: {f['train_seconds']:.0f} s (its eval before and after included)",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
