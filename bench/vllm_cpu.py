"""vLLM's CPU build against transformers' generate: the same model, the same prompts, the same forced length.

The rollouts of a GRPO step are `prompts x generations` sampled completions; here both engines sample them at
temperature 1, every completion forced to exactly `--tokens` tokens (vLLM: min_tokens = max_tokens, ignore_eos;
transformers: min_new_tokens = max_new_tokens), in the same dtype, in alternating rounds (vLLM, transformers, vLLM,
...) so that a machine slowing down affects both. Printed: every round's tokens/s, the medians and their ratio.
The engine's start (import, build) is timed apart and left out of the rates, as a training run pays it once.

    python bench/vllm_cpu.py                   # the built-in tiny-demo-vllm, 4 prompts x 8, 64 tokens
    python bench/vllm_cpu.py --model /path/to/Qwen2.5-0.5B-Instruct --tokens 128 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["What is 27+52?", "Tom has 3 boxes of 12 pencils and gives away 5. How many are left?",
           "小明有5个苹果，又买了3个。他现在有几个苹果？", "A pen costs 3 dollars. How much do 4 pens cost?"]


def chat_ids(tokenizer, prompts: list[str]) -> list[list[int]]:
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) for p in prompts]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def vllm_side(model_path: str, dtype: str, ids: list[list[int]], generations: int, tokens: int):
    """(start seconds, a function running one round and returning the completion tokens it generated)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process, as TRL's colocated engine runs
    start = time.perf_counter()
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_path, dtype=dtype, enforce_eager=True, seed=0)
    params = SamplingParams(n=generations, temperature=1.0, max_tokens=tokens, min_tokens=tokens, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in ids]

    def one_round() -> int:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outputs for c in o.outputs)

    return time.perf_counter() - start, one_round


def transformers_side(model_path: str, dtype: str, ids: list[list[int]], generations: int, tokens: int, pad: int):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
    width = max(map(len, ids))
    batch = torch.tensor([[pad] * (width - len(p)) + p for p in ids])  # left-padded, as the trainer generates
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])

    def one_round() -> int:
        with torch.no_grad():
            out = model.generate(input_ids=batch, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 num_return_sequences=generations, max_new_tokens=tokens, min_new_tokens=tokens,
                                 pad_token_id=pad)
        return int((out.shape[1] - width) * out.shape[0])

    return one_round


def measure(model: str, dtype: str, generations: int, tokens: int, rounds: int) -> dict:
    """Both engines on the same rollouts, in alternating rounds: {start, rates: {engine: [tokens/s, ...]}, ratio}."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer, resolve_model_path

    path = str(resolve_model_path(model))
    tokenizer = load_tokenizer(model)
    ids = chat_ids(tokenizer, PROMPTS)
    start, vllm_round = vllm_side(path, dtype, ids, generations, tokens)
    hf_round = transformers_side(path, dtype, ids, generations, tokens, tokenizer.pad_token_id)
    rates: dict[str, list[float]] = {VLLM: [], HF: []}
    for _ in range(rounds):
        for name, run in ((VLLM, vllm_round), (HF, hf_round)):
            began = time.perf_counter()
            generated = run()
            rates[name].append(generated / (time.perf_counter() - began))
    return {"start": start, "rates": rates,
            "ratio": statistics.median(rates[VLLM]) / statistics.median(rates[HF])}


VLLM, HF = "vLLM (CPU build)", "transformers generate"


def rows() -> list[dict]:
    """bench/run_all.py's row: the ratio on the built-in tiny-demo-vllm (no target: at 0.36M parameters both
    engines are bound by their per-step overhead, not by the model; a real model's ratio is the script's to run)."""
    result = measure("tiny-demo-vllm", "bfloat16", generations=8, tokens=64, rounds=3)
    samples = "; ".join(f"{name}: " + ", ".join(f"{r:.0f}" for r in rates) for name, rates in result["rates"].items())
    return [{"figure": "vLLM CPU build / transformers generate, rollout tokens/s (tiny-demo-vllm, bf16)",
             "value": round(result["ratio"], 2), "target": "-", "holds": None, "samples": samples}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-demo-vllm", help="a built-in name or a local model folder")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt (num_generations)")
    parser.add_argument("--tokens", type=int, default=64, help="every completion's length, forced")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    result = measure(args.model, args.dtype, args.generations, args.tokens, args.rounds)
    print(f"{args.model}, {args.dtype}: {len(PROMPTS)} prompts x {args.generations} completions x {args.tokens} "
          f"tokens a round, {args.rounds} rounds each, alternating; vLLM engine start {result['start']:.1f} s "
          "(not counted)")
    for name, samples in result["rates"].items():
        print(f"{name:<24} tokens/s median {statistics.median(samples):8.1f}   samples "
              + ", ".join(f"{s:.1f}" for s in samples))
    print(f"vLLM / transformers: {result['ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
