"""Time the five reward functions on 10k realistic completions, beside the notebook's originals.

    python bench/rewards.py [--n 10000] [--batch 64] [--seed 0]

Completions are generated (seeded): well-formed XML with multi-line reasoning, missing or
reordered newlines, currency/units/thousands in the answer, Chinese answers, LaTeX
(\\boxed, \\frac, $..$), malformed tags (missing, unclosed, repeated, trailing text), long
rambling or truncated outputs, garbage characters from a collapsing policy, a few symbolic
expressions that need math-verify (--symbolic-share, default 0.3%: GSM8K answers from Qwen2.5
are almost always plain numbers; raise it to see the slow path's cost, roughly 5-25 ms per
call), and odd entries (None, numbers). Each completion knows
whether its answer is right, so the table also shows how often each correctness function
agrees with the truth.

The notebook's functions (Unsloth Qwen2.5 GRPO notebook, see shared docs upstream-apis §6)
are re-implemented below verbatim in logic. They crash on None/non-string content, so they
get "" in place of those; ours get the raw batch. math_verify is imported and warmed up
before timing (its one-off import cost is printed separately): a training run pays it once.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rewards  # noqa: E402
from rewards import matching, symbolic  # noqa: E402
from rewards.normalize import _parse_text  # noqa: E402


# --- the notebook's originals ---------------------------------------------------------------

def nb_extract_xml_answer(text: str) -> str:
    answer = text.split("<answer>")[-1]
    answer = answer.split("</answer>")[0]
    return answer.strip()


def nb_correctness_reward_func(prompts, completions, answer, **kwargs) -> list[float]:
    responses = [completion[0]["content"] for completion in completions]
    extracted_responses = [nb_extract_xml_answer(r) for r in responses]
    # (the notebook also prints one sample per call; left out so printing is not timed)
    return [2.0 if r == a else 0.0 for r, a in zip(extracted_responses, answer)]


def nb_int_reward_func(completions, **kwargs) -> list[float]:
    responses = [completion[0]["content"] for completion in completions]
    extracted_responses = [nb_extract_xml_answer(r) for r in responses]
    return [0.5 if r.isdigit() else 0.0 for r in extracted_responses]


def nb_strict_format_reward_func(completions, **kwargs) -> list[float]:
    pattern = r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$"
    responses = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, r) for r in responses]
    return [0.5 if match else 0.0 for match in matches]


def nb_soft_format_reward_func(completions, **kwargs) -> list[float]:
    pattern = r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>"
    responses = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, r) for r in responses]
    return [0.5 if match else 0.0 for match in matches]


def nb_count_xml(text) -> float:
    count = 0.0
    if text.count("<reasoning>\n") == 1:
        count += 0.125
    if text.count("\n</reasoning>\n") == 1:
        count += 0.125
    if text.count("\n<answer>\n") == 1:
        count += 0.125
        count -= len(text.split("\n</answer>\n")[-1]) * 0.001
    if text.count("\n</answer>") == 1:
        count += 0.125
        count -= (len(text.split("\n</answer>")[-1]) - 1) * 0.001
    return count


def nb_xmlcount_reward_func(completions, **kwargs) -> list[float]:
    contents = [completion[0]["content"] for completion in completions]
    return [nb_count_xml(c) for c in contents]


# --- realistic completions ------------------------------------------------------------------

STEPS_EN = ["She buys {a} apples at ${b} each.", "That costs {a} * {b} = {c} dollars.", "Then he walks {a} km.",
            "Half of {a} is {b}.", "Adding {a} and {b} gives {c}.", "So far we have {a} items."]
STEPS_ZH = ["小明买了{a}个苹果。", "每个{b}元，一共{c}元。", "再加上{a}个，得到{c}个。"]
GARBAGE = ["\ufffd", "\u200b", "\x00", "\x1b[0m", "\ufeff", "\u202e"]


def _reasoning(rng: random.Random, chinese: bool, lines: int) -> str:
    steps = STEPS_ZH if chinese else STEPS_EN
    return "\n".join(rng.choice(steps).format(a=rng.randint(1, 99), b=rng.randint(1, 20), c=rng.randint(10, 999))
                     for _ in range(lines))


def _render_answer(rng: random.Random, value: int) -> str:
    """The same integer written the ways models write it."""
    styles = [str(value), f"{value:,}", f"${value:,}", f"{value} dollars", f"{value}元", f"答案：{value}",
              f"The answer is {value}.", f"\\boxed{{{value}}}", f"${value}$", f"{value}.00",
              f"{value:,}".replace(",", " ")]
    weights = [50, 6, 6, 4, 3, 4, 6, 6, 3, 3, 1]
    return rng.choices(styles, weights)[0]


def make_completion(rng: random.Random, reference: int, symbolic_share: float) -> tuple[object, bool]:
    """One completion (TRL conversational shape) and whether its answer is right."""
    correct = rng.random() < 0.6
    value = reference if correct else reference + rng.choice([-10, -1, 1, 2, 100])
    kind = rng.choices(
        ["strict", "no_newlines", "crlf", "chinese", "latex_frac", "malformed", "long", "garbage", "symbolic", "odd"],
        [45, 12, 5, 10, 4, 12, 5, 4, 100 * symbolic_share, 2],
    )[0]
    answer = _render_answer(rng, value)
    if kind == "strict":
        body = _reasoning(rng, False, rng.randint(2, 8))
        text = f"<reasoning>\n{body}\n</reasoning>\n<answer>\n{answer}\n</answer>\n"
    elif kind == "no_newlines":
        text = f"<reasoning>{_reasoning(rng, False, 3)}</reasoning> <answer>{answer}</answer>"
    elif kind == "crlf":
        text = f"<reasoning>\r\n{_reasoning(rng, False, 3)}\r\n</reasoning>\r\n<answer>\r\n{answer}\r\n</answer>\r\n"
    elif kind == "chinese":
        text = f"<reasoning>\n{_reasoning(rng, True, 4)}\n</reasoning>\n<answer>\n答案：{value}\n</answer>"
    elif kind == "latex_frac":
        # a fraction that equals the value: \frac{2v}{2}, "2v/2"
        text = rng.choice([f"<reasoning>x</reasoning><answer>$\\frac{{{2 * value}}}{{2}}$</answer>",
                           f"<reasoning>x</reasoning><answer>{2 * value}/2</answer>"])
    elif kind == "malformed":
        body = _reasoning(rng, False, 3)
        variant = rng.randrange(6)
        text = [
            f"{body}\nThe answer is {value}.",  # no tags at all: no answer to judge
            f"<reasoning>\n{body}\n</reasoning>\n<answer>\n{answer}",  # unclosed final answer block
            f"<answer>{value - 1}</answer>\n<reasoning>{body}</reasoning>\n<answer>{answer}</answer>",  # repeated
            f"<reasoning>\n{body}\n</reasoning>\n<answer>\n{answer}\n</answer>\nHope this helps!",  # trailing
            f"<reasoning>{body}<answer>{answer}</answer>",  # unclosed reasoning
            f"<reasoning>\n{body}\n</reasoning>\n<answer>\n{value} or {value + 3}\n</answer>\n",  # two numbers
        ][variant]
        correct = correct and variant not in (0, 5)
    elif kind == "long":
        body = _reasoning(rng, rng.random() < 0.3, rng.randint(100, 600))
        truncated = rng.random() < 0.5
        text = f"<reasoning>\n{body}\n</reasoning>\n<answer>\n{answer}\n</answer>\n"
        if truncated:
            text = f"<reasoning>\n{body}"
        correct = correct and not truncated
    elif kind == "garbage":
        noise = "".join(rng.choice(GARBAGE) for _ in range(3))
        text = f"<reasoning>\n{_reasoning(rng, False, 2)}{noise}\n</reasoning>\n<answer>\n{value}{noise}\n</answer>\n"
    elif kind == "symbolic":
        expr = rng.choice([f"\\sqrt{{{value * value}}}", f"{value} \\cdot 1", f"({value})", f"2x + {value}"])
        text = f"<reasoning>x</reasoning><answer>{expr}</answer>"
        correct = correct and "x" not in expr
    else:  # odd shapes from a broken pipeline
        return rng.choice([None, 42, [{"role": "assistant", "content": None}], {"content": None}]), False
    return [{"role": "assistant", "content": text}], correct


def build_batch(n: int, seed: int, symbolic_share: float = 0.003) -> tuple[list, list[str], list[bool]]:
    rng = random.Random(seed)
    completions, answers, truth = [], [], []
    for _ in range(n):
        reference = rng.choice([rng.randint(1, 200), rng.randint(1000, 99999)])
        completion, correct = make_completion(rng, reference, symbolic_share)
        completions.append(completion)
        answers.append(str(reference))
        truth.append(correct)
    return completions, answers, truth


def notebook_safe(completions: list) -> list:
    """The notebook functions crash on non-string content; give them "" there."""
    safe = []
    for c in completions:
        text = c[0].get("content") if isinstance(c, list) and c and isinstance(c[0], dict) else None
        safe.append([{"role": "assistant", "content": text if isinstance(text, str) else ""}])
    return safe


# --- timing ---------------------------------------------------------------------------------

def time_function(func, completions: list, answers: list[str], batch: int) -> tuple[float, float, list]:
    """Wall and CPU seconds for scoring all completions in TRL-sized batches, and the scores.
    CPU time is shown too because wall time on a shared box includes other processes' load."""
    prompts = [[{"role": "user", "content": "q"}]] * batch
    out: list = []
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(0, len(completions), batch):
        chunk = completions[i:i + batch]
        out.extend(func(prompts=prompts[:len(chunk)], completions=chunk, answer=answers[i:i + batch],
                        completion_ids=None, trainer_state=None))
    return time.perf_counter() - start, time.process_time() - cpu_start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=64, help="completions per reward call (TRL calls per batch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--symbolic-share", type=float, default=0.003,
                        help="share of answers written as expressions that need math-verify, e.g. \\sqrt{324}")
    parser.add_argument("--repeats", type=int, default=3,
                        help="time each function this often (caches cleared) and keep the best")
    args = parser.parse_args()

    completions, answers, truth = build_batch(args.n, args.seed, args.symbolic_share)
    total_chars = sum(len(c[0]["content"]) for c in notebook_safe(completions))

    start = time.perf_counter()
    symbolic.symbolic_equal("\\sqrt{4}", "2")  # one-off: import math_verify + sympy, first parse
    symbolic.symbolic_equal("\\sqrt{5}", "2")  # sympy loads more on the first unequal comparison
    warmup = time.perf_counter() - start

    calls = {"n": 0}
    original = symbolic.symbolic_equal

    def counting(pred: str, ref: str) -> bool:
        calls["n"] += 1
        return original(pred, ref)

    rows = []
    pairs = [("xmlcount", rewards.xmlcount_reward_func, nb_xmlcount_reward_func),
             ("soft_format", rewards.soft_format_reward_func, nb_soft_format_reward_func),
             ("strict_format", rewards.strict_format_reward_func, nb_strict_format_reward_func),
             ("int", rewards.int_reward_func, nb_int_reward_func),
             ("correctness", rewards.correctness_reward_func, nb_correctness_reward_func)]
    safe = notebook_safe(completions)
    matching.symbolic_equal = counting  # count slow-path calls; restored below
    try:
        for name, ours, theirs in pairs:
            t_ours, cpu_ours, t_nb = float("inf"), float("inf"), float("inf")
            for _ in range(args.repeats):
                _parse_text.cache_clear()  # each repeat starts cold, as a new batch of new answers would
                symbolic._parse.cache_clear()
                calls["n"] = 0
                elapsed, cpu, out_ours = time_function(ours, completions, answers, args.batch)
                t_ours, cpu_ours = min(t_ours, elapsed), min(cpu_ours, cpu)
                elapsed, _, out_nb = time_function(theirs, safe, answers, args.batch)
                t_nb = min(t_nb, elapsed)
            assert len(out_ours) == len(completions)
            rows.append((name, t_ours, cpu_ours, t_nb, sum(v or 0.0 for v in out_ours) / len(out_ours),
                         sum(out_nb) / len(out_nb), out_ours, out_nb))
    finally:
        matching.symbolic_equal = original

    print(f"{args.n} completions ({total_chars / 1e6:.1f} M chars), batches of {args.batch}, best of {args.repeats}; "
          f"math_verify warm-up (once per process, not in the table): {warmup:.2f} s")
    print(f"{'reward':<15}{'ours (s)':>10}{'ours cpu (s)':>14}{'notebook (s)':>14}{'ours mean':>11}{'nb mean':>9}")
    for name, t_ours, cpu_ours, t_nb, m_ours, m_nb, _, _ in rows:
        print(f"{name:<15}{t_ours:>10.3f}{cpu_ours:>14.3f}{t_nb:>14.3f}{m_ours:>11.3f}{m_nb:>9.3f}")
    totals = [sum(r[i] for r in rows) for i in (1, 2, 3)]
    print(f"{'total':<15}{totals[0]:>10.3f}{totals[1]:>14.3f}{totals[2]:>14.3f}")
    print("(ours on the raw batch; the notebook's on a copy with None/non-string content replaced by \"\", "
          "since its functions crash on those)")

    ours_correct, nb_correct = rows[-1][6], rows[-1][7]
    agree_ours = sum((v == 2.0) == t for v, t in zip(ours_correct, truth)) / len(truth)
    agree_nb = sum((v == 2.0) == t for v, t in zip(nb_correct, truth)) / len(truth)
    right = sum(truth)
    print(f"correctness agrees with the truth: ours {agree_ours:.1%}, notebook {agree_nb:.1%} "
          f"({right} right answers; accepted: ours {sum(v == 2.0 for v in ours_correct)}, "
          f"notebook {sum(v == 2.0 for v in nb_correct)}); math-verify calls: {calls['n']}")


if __name__ == "__main__":
    main()
