"""The demo's task and its warm-up data: what the CPU demo's before/after numbers rest on."""

import re

from grpo_pipeline.pipeline.demo.registry import builtin_source, cpu_demo_config
from grpo_pipeline.pipeline.demo.task import ARITHMETIC, SLOPPY_ANSWER_RATE, TEST_SIZE
from grpo_pipeline.rewards import correctness_reward_func, strict_format_reward_func

QUESTION = re.compile(r"What is (\d\d)\+(\d\d)\?")


def _operands(question: str) -> tuple[int, int]:
    a, b = QUESTION.fullmatch(question).groups()
    return int(a), int(b)


def test_every_problem_is_a_two_digit_sum_without_carries():
    for split in ("train", "test"):
        for problem in ARITHMETIC.rows(ARITHMETIC.split_size(split), split=split):
            a, b = _operands(problem["question"])
            assert problem["answer"] == str(a + b) and problem["solution"] == f"{a}+{b}={a + b}"
            assert a % 10 + b % 10 < 10 and a // 10 + b // 10 < 10, problem  # digit by digit, no carry


def test_held_out_problems_are_new_but_their_answers_are_not():
    train = ARITHMETIC.rows(ARITHMETIC.split_size("train"), split="train")
    test = ARITHMETIC.rows(TEST_SIZE, split="test")
    assert len(test) == TEST_SIZE and len(train) == 1880
    assert not {p["question"] for p in train} & {p["question"] for p in test}
    # Every held-out answer is a number the model wrote during training, in another sum.
    assert {p["answer"] for p in test} <= {p["answer"] for p in train}
    # The "next: grpo generate --prompt ..." hint suggests a question the model was not trained on.
    assert builtin_source("demo-arithmetic").example_question in {p["question"] for p in test}


def test_warmup_teacher_reasons_right_and_answers_sloppily_at_the_set_rate():
    system_prompt = cpu_demo_config()["system_prompt"]
    examples = ARITHMETIC.warmup_examples(2000, system_prompt, seed=7)
    assert all(e["prompt"][0] == {"role": "system", "content": system_prompt} for e in examples)
    sloppy = 0
    for example in examples:
        a, b = _operands(example["prompt"][-1]["content"])
        text = example["completion"][0]["content"]
        assert f"<reasoning>\n{a}+{b}={a + b}\n</reasoning>" in text  # the worked line is always right
        answer = re.search(r"<answer>\n(\d+)\n</answer>", text).group(1)
        assert answer in (str(a), str(a + b))
        sloppy += answer == str(a)
    assert abs(sloppy / len(examples) - SLOPPY_ANSWER_RATE) < 0.04, sloppy
    # The real rewards see the sloppy answers as well-formed and wrong, the others as right.
    completions = [e["completion"] for e in examples[:50]]
    answers = [str(sum(_operands(e["prompt"][-1]["content"]))) for e in examples[:50]]
    assert strict_format_reward_func(completions) == [0.5] * 50
    correct = correctness_reward_func(prompts=[e["prompt"] for e in examples[:50]], completions=completions,
                                      answer=answers)
    expected = [2.0 if f"<answer>\n{ans}\n" in e["completion"][0]["content"] else 0.0
                for e, ans in zip(examples[:50], answers)]
    assert correct == expected and 0 < sum(correct) < 100


def test_a_task_made_with_another_pool_under_the_same_name_reads_its_own_problems():
    """DemoTask.problems keeps each split once a process, by the task itself: not by its name alone."""
    import dataclasses

    one = {"question": "What is 11+22?", "answer": "33", "solution": "11+22=33", "first_operand": "11"}
    ARITHMETIC.rows(3, split="train")  # the built-in task's split, made and kept first
    other = dataclasses.replace(ARITHMETIC, pool=lambda split: [one])
    assert other.name == ARITHMETIC.name
    assert other.rows(1, split="train") == [ARITHMETIC.row(one)] and other.split_size("train") == 1
    assert ARITHMETIC.split_size("train") == 1880
