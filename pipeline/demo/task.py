"""The CPU demo's task (`demo-arithmetic`, configs/cpu-demo.yaml): 2-digit additions and a sloppy teacher's
warm-up examples; and what the demo tasks share (`drawn_split`, `pick`, `warmup_examples`).
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from typing import Any, Callable, Optional

from grpo_pipeline.rewards.completions import build_prompt
from grpo_pipeline.rewards.format import format_completion

# Additions of two 2-digit numbers without carries ("What is 27+52?" -> "79"): 1,980 problems, 100 held out, each
# a new combination of digit sums the train split shows many times, which a 2-layer model learns within ~1,000 small
# SFT steps (300-400 were too few; after GRPO it gets 96-100% right). Carries would need far longer.
TEST_SIZE = 100

# Share of warm-up examples whose <answer> repeats the first operand (the reasoning line is always right). Above 1/2
# on purpose: greedy decoding then mostly copies the wrong number, while sampling still gives the right one often
# enough for GRPO to reward it: one clear habit to unlearn, mostly within 50 steps.
SLOPPY_ANSWER_RATE = 0.6


def question_hash(question: str) -> int:
    return int(hashlib.sha256(question.encode("utf-8")).hexdigest(), 16)


def check_split(split: str) -> None:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")


def drawn_split(split: str, size: int, draw: Callable[[random.Random], Optional[dict[str, Any]]],
                one_in: int) -> list[dict[str, Any]]:
    """The `size` problems of one split, in a fixed order: drawn by `draw` (None: a draw to skip) from one fixed
    RNG, each question once, about 1 in `one_in` held out (test) by its hash. A split never depends on the run's
    seed, n or order; only its order does."""
    check_split(split)
    rng, seen, problems = random.Random(0), set(), []
    while len(problems) < size:
        problem = draw(rng)
        if problem is None or problem["question"] in seen or (
                question_hash(problem["question"]) % one_in == 0) != (split == "test"):
            continue
        seen.add(problem["question"])
        problems.append(problem)
    return problems


def pick(source: str, split: str, pool: list[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    """`n` problems of a split's `pool`, in an order fixed by `seed`; a ValueError when `n` exceeds it."""
    if not 0 <= n <= len(pool):
        raise ValueError(f"{source} has {len(pool)} distinct {split!r} problems, {n} were asked for; "
                         f"set max_samples (train) or eval_limit (test) to at most {len(pool)}.")
    random.Random(seed).shuffle(pool)
    return pool[:n]


def warmup_examples(n: int, system_prompt: str, seed: int, pool: list[dict[str, Any]],
                    completion: Callable[[random.Random, dict[str, Any]], list]) -> list[dict[str, Any]]:
    """`n` warm-up examples in TRL's conversational prompt-completion format, from `pool` by an RNG of `seed`, each
    completed by `completion(rng, problem)`."""
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        problem = rng.choice(pool)
        examples.append({"prompt": build_prompt(system_prompt, problem["question"]),
                         "completion": completion(rng, problem)})
    return examples


def _split_problems(split: str) -> list[dict[str, str]]:
    """The problems of one split, in a fixed order: the test split takes TEST_SIZE in order of their question's
    sha256, skipping any whose answer would then be missing from the train split (only 80+19 makes 99)."""
    check_split(split)
    problems = [{"question": f"What is {a}+{b}?", "answer": str(a + b), "solution": f"{a}+{b}={a + b}",
                 "first_operand": str(a)}
                for tens_a in range(1, 10) for tens_b in range(1, 10 - tens_a)
                for ones_a in range(10) for ones_b in range(10 - ones_a)
                for a, b in [(10 * tens_a + ones_a, 10 * tens_b + ones_b)]]
    by_hash = sorted(problems, key=lambda p: question_hash(p["question"]))
    left_in_train = Counter(p["answer"] for p in by_hash)
    test_questions = set()
    for problem in by_hash:
        if len(test_questions) == TEST_SIZE:
            break
        if left_in_train[problem["answer"]] > 1:
            left_in_train[problem["answer"]] -= 1
            test_questions.add(problem["question"])
    return [p for p in by_hash if (p["question"] in test_questions) == (split == "test")]


def arithmetic_split_size(split: str) -> int:
    """How many distinct problems a split holds.

    >>> arithmetic_split_size("train"), arithmetic_split_size("test")
    (1880, 100)
    """
    return len(_split_problems(split))


def arithmetic_problems(n: int, seed: int = 0, split: str = "train") -> list[dict[str, str]]:
    """`n` distinct problems of a split, in an order fixed by `seed`; `solution` is the worked line that goes
    between the <reasoning> tags.

    >>> arithmetic_problems(1, seed=0, split="test")
    [{'question': 'What is 27+52?', 'answer': '79', 'solution': '27+52=79'}]
    >>> {p["question"] for p in arithmetic_problems(10, split="test")} & {
    ...     p["question"] for p in arithmetic_problems(10, split="train")}
    set()
    """
    return [{k: p[k] for k in ("question", "answer", "solution")}
            for p in pick("demo-arithmetic", split, _split_problems(split), n, seed)]


def sft_examples(n: int, system_prompt: str, seed: int = 0) -> list[dict[str, Any]]:
    """`n` warm-up examples from the train split, by a sloppy teacher (`SLOPPY_ANSWER_RATE`): the format, the
    addition table, and a bad habit that GRPO's correctness reward then removes.

    >>> ex = sft_examples(1, "Answer in tags.", seed=0)[0]
    >>> [m["role"] for m in ex["prompt"]], ex["completion"][0]["role"]
    (['system', 'user'], 'assistant')
    >>> ex["completion"][0]["content"].startswith("<reasoning>\\n")
    True
    """
    def sloppy(rng: random.Random, problem: dict[str, str]) -> list[dict[str, str]]:
        answer = problem["first_operand"] if rng.random() < SLOPPY_ANSWER_RATE else problem["answer"]
        return [{"role": "assistant", "content": format_completion(problem["solution"], answer)}]

    return warmup_examples(n, system_prompt, seed, _split_problems("train"), sloppy)
