"""demo-word-problems: disjoint, deterministic splits, and every answer right by an independent reading."""

from __future__ import annotations

import re

import pytest

from grpo_pipeline.pipeline.demo.registry import builtin_source
from grpo_pipeline.pipeline.demo.word_problems import (
    TEMPLATES,
    TEST_SIZE,
    TRAIN_SIZE,
    WORD_PROBLEMS,
    _split_problems,
)
from grpo_pipeline.rewards import strict_format_reward_func

# Each template's answer from the question's numbers, read in order: a solver of our own, not the generator's.
SOLVERS = {
    "groups_minus": lambda a, b, c: a * b - c,
    "buy_change": lambda a, p, b, q, m: m - (a * p + b * q),
    "weeks_reading": lambda p, w, e: p * 7 * w + e,
    "share_equally": lambda a, b, k: (a + b) / k,
    "earn_save": lambda h, r, s: h * r - s,
    "rows_of_seats": lambda r, s, t, g: r * s - t - g,
    "twice_as_many": lambda a, k: a + k * a,
    "trips": lambda c, n, d: n / c * 2 * d,
}


def test_the_splits_are_disjoint_sized_and_the_same_every_time():
    train, test = _split_problems("train"), _split_problems("test")
    assert len(train) == TRAIN_SIZE and len(test) == TEST_SIZE
    train_q, test_q = {p["question"] for p in train}, {p["question"] for p in test}
    assert len(train_q) == TRAIN_SIZE and len(test_q) == TEST_SIZE  # distinct within a split
    assert not train_q & test_q
    assert _split_problems("test") == test  # deterministic: no run state enters the pool
    # The run's seed orders a split, never changes it.
    assert {p["question"] for p in WORD_PROBLEMS.rows(TEST_SIZE, seed=1, split="test")} == test_q
    assert WORD_PROBLEMS.rows(5, seed=3, split="test") == WORD_PROBLEMS.rows(5, seed=3, split="test")
    assert WORD_PROBLEMS.rows(5, seed=3, split="test") != WORD_PROBLEMS.rows(5, seed=4, split="test")
    assert {lang for p in test for lang in [p["language"]]} == {"en", "zh"}
    assert {p["template"] for p in test} == set(TEMPLATES)


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_answer_is_right_and_its_worked_steps_add_up(split):
    for problem in _split_problems(split):
        numbers = [int(n) for n in re.findall(r"\d+", problem["question"])]
        expected = SOLVERS[problem["template"]](*numbers)
        assert expected == int(expected) and int(problem["answer"]) == expected > 0, problem
        for expression, result in re.findall(r"<<([^=]+)=(\d+)>>", problem["solution"]):
            a, op, b = re.fullmatch(r"(\d+)([-+*/])(\d+)", expression).groups()
            value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) / int(b)}[op]
            assert value == int(result), problem
        assert problem["solution"].rstrip(".").endswith(problem["answer"])


def test_the_source_reads_as_gsm8k_and_its_warmup_teaches_the_strict_format():
    source = builtin_source("demo-word-problems")
    assert source.split_size("test") == TEST_SIZE
    assert source.example_question in {p["question"] for p in _split_problems("test")}
    row = source.rows(1, 0, "test")[0]
    assert row["answer"].rsplit("#### ", 1)[1].isdigit()
    examples = WORD_PROBLEMS.warmup_examples(4, "Answer in tags.", seed=0)
    assert strict_format_reward_func([e["completion"] for e in examples]) == [0.5] * 4
    assert {e["prompt"][1]["content"] for e in examples} <= {p["question"] for p in _split_problems("train")}
    with pytest.raises(ValueError, match="eval_limit"):
        WORD_PROBLEMS.rows(TEST_SIZE + 1, split="test")
