"""The CPU demo's task (`demo-arithmetic`, configs/cpu-demo.yaml): 2-digit additions and a sloppy teacher's
warm-up examples; and what the demo tasks share (`drawn_split`, `DemoTask`)."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
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
    """The `size` problems of one split, drawn by `draw` (None: skip) from one fixed RNG, each question once, about
    1 in `one_in` held out (test) by its hash: never dependent on the run's seed or n."""
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


# (task, split) -> its problems (DemoTask.problems); keyed by the task itself (frozen: its name and its functions), so a
# task made with another pool under the same name gets its own
_PROBLEMS: dict[tuple[Any, str], tuple[dict[str, Any], ...]] = {}


@dataclass(frozen=True)
class DemoTask:
    """A built-in data source (pipeline/demo/registry.py): `pool(split)` (a split's problems in a fixed order; a
    ValueError for a split it lacks), `row(problem)` (the row a run reads) and `completion(rng, problem)` (a warm-up
    example's messages)."""

    name: str
    pool: Callable[[str], list[dict[str, Any]]]
    row: Callable[[dict[str, Any]], dict[str, str]]
    completion: Callable[[random.Random, dict[str, Any]], list[dict[str, Any]]]
    example_question: str  # in the held-out split, for the "next: grpo generate --prompt ..." hint
    # The source files its rows depend on: hashed into the data cache key, so an edit re-prepares the data.
    code_files: tuple[Path, ...]

    def split_size(self, split: str) -> int:
        """How many distinct problems a split holds.

        >>> ARITHMETIC.split_size("train"), ARITHMETIC.split_size("test")
        (1880, 100)
        """
        return len(self.problems(split))

    def problems(self, split: str) -> tuple[dict[str, Any], ...]:
        """`pool(split)`, made once a process: a split never changes, and building one (sorting ~2,000 questions by
        their sha256) took ~3 ms, asked for by every run's data, eval and warm-up (a notebook, a test process)."""
        key = (self, split)
        if key not in _PROBLEMS:
            _PROBLEMS[key] = tuple(self.pool(split))
        return _PROBLEMS[key]

    def rows(self, n: int, seed: int = 0, split: str = "train") -> list[dict[str, str]]:
        """`n` distinct rows of a split, in an order fixed by `seed`; a ValueError when `n` exceeds it.

        >>> ARITHMETIC.rows(1, seed=0, split="test")
        [{'question': 'What is 27+52?', 'answer': '79', 'solution': '27+52=79'}]
        """
        pool = list(self.problems(split))
        if not 0 <= n <= len(pool):
            raise ValueError(f"{self.name} has {len(pool)} distinct {split!r} problems, {n} were asked for; "
                             f"set max_samples (train) or eval_limit (test) to at most {len(pool)}.")
        random.Random(seed).shuffle(pool)
        return [self.row(p) for p in pool[:n]]

    def warmup_examples(self, n: int, system_prompt: str, seed: int = 0) -> list[dict[str, Any]]:
        """`n` warm-up examples (TRL's conversational prompt-completion format) of train problems drawn by an RNG
        of `seed`, under the run's `system_prompt`, so the warm-up prompts are the GRPO prompts.

        >>> ex = ARITHMETIC.warmup_examples(1, "Answer in tags.", seed=0)[0]
        >>> [m["role"] for m in ex["prompt"]], ex["completion"][0]["content"].startswith("<reasoning>\\n")
        (['system', 'user'], True)
        """
        rng, pool = random.Random(seed), self.problems("train")
        examples = []
        for _ in range(n):
            problem = rng.choice(pool)
            examples.append({"prompt": build_prompt(system_prompt, problem["question"]),
                             "completion": self.completion(rng, problem)})
        return examples


def _split_problems(split: str) -> list[dict[str, str]]:
    """The problems of one split: the test split takes TEST_SIZE by their question's sha256, skipping any whose
    answer would then be missing from the train split (only 80+19 makes 99)."""
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


def _sloppy(rng: random.Random, problem: dict[str, str]) -> list[dict[str, str]]:
    """The sloppy teacher (`SLOPPY_ANSWER_RATE`): the format, the addition table, and a bad habit that GRPO's
    correctness reward then removes."""
    answer = problem["first_operand"] if rng.random() < SLOPPY_ANSWER_RATE else problem["answer"]
    return [{"role": "assistant", "content": format_completion(problem["solution"], answer)}]


TASK_FILE = Path(__file__).resolve()
ARITHMETIC = DemoTask("demo-arithmetic", _split_problems,
                      lambda p: {k: p[k] for k in ("question", "answer", "solution")}, _sloppy,
                      example_question="What is 27+52?", code_files=(TASK_FILE,))
