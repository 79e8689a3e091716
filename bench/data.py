"""Time the length check on 7.5k GSM8K-sized prompts with the real Qwen2.5 tokenizer (offline).

    python bench/data.py [--n 7500] [--seed 0] [--repeats 3] [--loop] [--full]

Questions are generated (seeded): 50-100 words each, a mix of English, Chinese and mixed
sentences with numbers, about the size of GSM8K's train split (7,473 questions). Reported:

- render:   apply_chat_template(tokenize=False) for every chat (jinja, per row)
- tokenize: ONE batched call of the fast tokenizer on all rendered texts
- --loop:   the same counts from a Python loop of per-prompt tokenizer calls, for comparison
- --full:   prepare_dataset end to end on a JSONL of these questions (cold), then the cache hit

The tokenizer load itself (a few seconds, once per run) is timed separately. CPU time is
printed beside wall time: on a shared machine the wall time includes waiting for a core.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_pipeline.pipeline.config import DEFAULT_SYSTEM_PROMPT, PipelineConfig
from grpo_pipeline.pipeline.data.prompts import build_prompt, count_prompt_tokens, length_stats

TARGET_S = 3.0  # seconds for the length check on a GSM8K-sized train split

EN_NAMES = ["Natalia", "Weng", "Betty", "James", "Albert", "Mrs. Lee", "Carlos"]
ZH_NAMES = ["小明", "小红", "王老师", "李阿姨"]
EN_THINGS = ["clips", "apples", "dollars", "pages", "eggs", "books", "marbles"]
ZH_THINGS = ["元", "千克面粉", "张邮票", "个苹果", "本书"]
EN_TEMPLATES = [
    "{name} sold {a} {thing} in April, and then she sold half as many {thing} in May.",
    "{name} earns ${a} an hour for babysitting and worked {b} minutes yesterday.",
    "A store had {a} {thing} on Monday and received {b} more boxes with {c} in each box.",
    "If {name} reads {a} pages today and twice as many tomorrow, {b} pages are left for the weekend.",
    "Each of the {a} students brings {b} {thing}, but {c} of them forget.",
]
ZH_TEMPLATES = [
    "{name}有{a}{thing}，送给同学{b}{thing}以后，又买了{c}{thing}。",
    "一个果园有{a}行树，每行{b}棵，其中{c}棵是梨树。",
    "{name}每天读{a}页书，读了{b}天以后还剩{c}页没有读。",
    "商店上午卖出{a}{thing}，下午卖出的是上午的{b}倍。",
]
EN_ASKS = ["How many {thing} are left?", "How much money did {name} make in total?", "What is the answer?"]
ZH_ASKS = ["一共有多少{thing}？", "还剩多少{thing}？", "这本书一共有多少页？"]


def synthetic_question(rng: random.Random) -> str:
    """50-100 words: English, Chinese (a Chinese character counts as a word here) or a mix."""
    style = rng.choice(["en", "en", "zh", "mixed"])
    target = rng.randint(50, 100)
    parts: list[str] = []
    words = 0
    while words < target:
        use_zh = style == "zh" or (style == "mixed" and rng.random() < 0.5)
        template = rng.choice(ZH_TEMPLATES if use_zh else EN_TEMPLATES)
        values = dict(name=rng.choice(ZH_NAMES if use_zh else EN_NAMES),
                      thing=rng.choice(ZH_THINGS if use_zh else EN_THINGS),
                      a=rng.randint(2, 999), b=rng.randint(2, 99), c=rng.randint(2, 50))
        sentence = template.format(**values)
        parts.append(sentence)
        words += len(sentence) // 2 if use_zh else len(sentence.split())
    use_zh = style == "zh" or (style == "mixed" and rng.random() < 0.5)
    ask = rng.choice(ZH_ASKS if use_zh else EN_ASKS)
    parts.append(ask.format(name=rng.choice(ZH_NAMES if use_zh else EN_NAMES),
                            thing=rng.choice(ZH_THINGS if use_zh else EN_THINGS)))
    return "".join(parts) if style == "zh" else " ".join(parts)


def measure_length_check(n: int, seed: int, repeats: int) -> dict:
    """Time count_prompt_tokens on `n` generated chats `repeats` times (after one warm-up call)."""
    rng = random.Random(seed)
    questions = [synthetic_question(rng) for _ in range(n)]
    chats = [build_prompt(DEFAULT_SYSTEM_PROMPT, q) for q in questions]

    start = time.perf_counter()
    from grpo_pipeline.pipeline.assets import load_qwen_tokenizer

    tokenizer = load_qwen_tokenizer()
    load_s = time.perf_counter() - start
    count_prompt_tokens(tokenizer, chats[:8])  # warm-up: jinja compiles the template once

    runs = []
    for _ in range(repeats):
        cpu_start = time.process_time()
        lengths = count_prompt_tokens(tokenizer, chats)
        cpu_s = time.process_time() - cpu_start  # all threads of this process: the cost without other load
        runs.append({"render": lengths.render_s, "tokenize": lengths.tokenize_s,
                     "wall": lengths.render_s + lengths.tokenize_s, "cpu": cpu_s})
    middle = sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]  # the median run, parts and all
    return {"questions": questions, "chats": chats, "tokenizer": tokenizer, "load_s": load_s, "runs": runs,
            "median": middle, "stats": length_stats(lengths.counts), "counts": lengths.counts}


def rows(n: int = 7500, repeats: int = 3) -> list[dict]:
    """bench/run_all.py's protocol: the length check's time on GSM8K-sized data."""
    result = measure_length_check(n, 0, repeats)
    walls = [r["wall"] for r in result["runs"]]
    return [{"figure": f"length check, {n} prompts (Qwen2.5 tokenizer)",
             # CPU time beside wall: on a shared machine the wall time includes waiting for a core.
             "value": f"{result['median']['wall']:.2f} s wall (runs {min(walls):.2f}-{max(walls):.2f}), "
                      f"{result['median']['cpu']:.2f} s CPU",
             "target": f"< {TARGET_S:g} s", "holds": result["median"]["wall"] < TARGET_S,
             "samples": f"{repeats} runs x {n} prompts"}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=7500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="time the length check this often; the median is shown")
    parser.add_argument("--loop", action="store_true", help="also time a Python loop of per-prompt tokenizer calls")
    parser.add_argument("--full", action="store_true", help="also time prepare_dataset end to end, cold and cached")
    args = parser.parse_args()

    result = measure_length_check(args.n, args.seed, args.repeats)
    questions, chats, tokenizer = result["questions"], result["chats"], result["tokenizer"]
    stats, run = result["stats"], result["median"]
    walls = [r["wall"] for r in result["runs"]]
    print(f"prompts: {args.n} (50-100 words, English/Chinese/mixed)   tokenizer load: {result['load_s']:.2f} s (once)")
    print(f"prompt tokens: p50 {stats['p50']}  p90 {stats['p90']}  p99 {stats['p99']}  max {stats['max']}")
    print(f"length check (median of {args.repeats} runs, spread {min(walls):.2f}-{max(walls):.2f} s): render "
          f"{run['render']:.2f} s + tokenize (one batched call) {run['tokenize']:.2f} s = {run['wall']:.2f} s wall, "
          f"{run['cpu']:.2f} s CPU   [target < {TARGET_S:g} s]")

    if args.loop:
        texts = tokenizer.apply_chat_template(chats, tokenize=False, add_generation_prompt=True)
        start = time.perf_counter()
        looped = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
        loop_s = time.perf_counter() - start
        assert looped == result["counts"]
        print(f"for comparison, a Python loop of {args.n} tokenizer calls: {loop_s:.2f} s")

    if args.full:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "questions.jsonl"
            with open(path, "w", encoding="utf-8") as f:
                for i, q in enumerate(questions):
                    f.write(json.dumps({"question": q, "answer": f"#### {i}"}, ensure_ascii=False) + "\n")
            from grpo_pipeline.pipeline.data.prepare import prepare_dataset

            cfg = PipelineConfig().replace(dataset_name=str(path), data_cache_dir=str(Path(tmp) / "cache"),
                                           output_dir=str(Path(tmp) / "run"))
            for label in ("cold", "cache hit"):
                start = time.perf_counter()
                data = prepare_dataset(cfg, tokenizer)
                elapsed = time.perf_counter() - start
                print(f"prepare_dataset ({label}): {elapsed:.2f} s, {data.report['rows_kept']} rows, "
                      f"max_prompt_length {data.max_prompt_length}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
