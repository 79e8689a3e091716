"""`grpo eval` scores with the correctness the run trained with (pipeline/infer/scoring.py): over answer styles x
scorers, the eval verdict agrees with the training reward on every row; without a correctness reward the built-in
reading takes <answer>, the recipe's own tags, \\boxed{} and `####`."""

from __future__ import annotations

import re
import sys
import types

import pytest

from grpo_pipeline.pipeline.infer.scoring import build_scorer, format_tags, score_with
from grpo_pipeline.rewards import correctness_reward_func
from grpo_pipeline.rewards.contract import call_reward
from grpo_pipeline.rewards.trl_source import trl_reward

QWEN3_SYSTEM = ("You are given a problem.\nThink about the problem and provide your working out.\nPlace it between "
                "<start_working_out> and <end_working_out>.\nThen, provide your solution between <SOLUTION></SOLUTION>")


def check_answer(prompts, completions, answer, **kwargs):
    """The Unsloth Qwen3 notebook's check_answer, as it writes it (5 exact, 3.5 stripped, ratio-close partial)."""
    match_format = re.compile(r"<end_working_out>.*?<SOLUTION>(.+?)</SOLUTION>[\s]{0,}$", flags=re.MULTILINE | re.DOTALL)
    scores = []
    for completion, true_answer in zip(completions, answer):
        found = match_format.search(completion[0]["content"])
        guess = found.group(1) if found else None
        if guess is None:
            scores.append(-2.0)
        elif guess == true_answer:
            scores.append(5.0)
        elif guess.strip() == true_answer.strip():
            scores.append(3.5)
        else:
            try:
                ratio = float(guess) / float(true_answer)
                scores.append(2.0 if 0.9 <= ratio <= 1.1 else 1.5 if 0.8 <= ratio <= 1.2 else -2.5)
            except ValueError:
                scores.append(-4.5)
    return scores


check_answer.correctness_reward = True  # marked as the run's correctness


@pytest.fixture(scope="module")
def users_module():
    module = types.ModuleType("eval_scoring_rewards")
    module.check_answer = check_answer
    sys.modules[module.__name__] = module
    yield module.__name__
    del sys.modules[module.__name__]


def styles(value: str) -> dict[str, str]:
    return {"ours": f"<reasoning>\nr\n</reasoning>\n<answer>\n{value}\n</answer>\n",
            "boxed": f"So the total is \\boxed{{{value}}}.", "gsm8k": f"5 + 4 = {value}\n#### {value}",
            "qwen3": f"<start_working_out>r<end_working_out><SOLUTION>{value}</SOLUTION>",
            "near": f"<start_working_out>r<end_working_out><SOLUTION> {value} </SOLUTION>"}


def rows_and_texts():
    rows, texts = [], []
    for value in ("9", "8", "8.5"):
        for text in styles(value).values():
            rows.append({"prompt": [{"role": "system", "content": QWEN3_SYSTEM}, {"role": "user", "content": "4+5?"}],
                         "answer": "9", "id": f"r{len(rows)}", "columns": {"answer": "9", "solution": "$9$"}})
            texts.append(text)
    return rows, texts


def keywords(columns, texts):
    return {key: values for key, values in columns.items() if key != "prompt"}


@pytest.mark.parametrize("rewards, reward, top", [
    (["xmlcount", "correctness"], correctness_reward_func, 2.0),
    (["think_format_reward", "accuracy_reward"], trl_reward("accuracy_reward"), 1.0),
    (["strict_format", "eval_scoring_rewards:check_answer"], check_answer, 5.0),
], ids=["builtin", "trl_accuracy", "qwen3_check_answer"])
def test_the_eval_verdict_is_the_training_rewards_top_score_on_every_row(users_module, rewards, reward, top):
    rows, texts = rows_and_texts()
    scorer = build_scorer(rewards, keywords)
    verdicts, means = score_with(scorer, rows, texts)
    from grpo_pipeline.pipeline.data.prompts import completion_like

    trained = call_reward(reward, [r["prompt"] for r in rows],
                          [completion_like(r["prompt"], t) for r, t in zip(rows, texts)],
                          keywords({"answer": ["9"] * len(rows), "solution": ["$9$"] * len(rows)}, texts))
    assert [v["correct"] for v in verdicts] == [value == top for value in trained]
    assert any(v["correct"] for v in verdicts) and not all(v["correct"] for v in verdicts)
    assert set(means) == {f.__name__ for f in scorer.funcs}  # every reward's mean, the scorer's beside the others


def test_without_a_correctness_reward_the_builtin_reading_takes_every_answer_style():
    rows, texts = rows_and_texts()
    verdicts, _ = score_with(build_scorer(["xmlcount"], keywords), rows, texts)
    expected = [value == "9" for value in ("9", "8", "8.5") for _ in styles(value)]
    assert [v["correct"] for v in verdicts] == expected
    assert format_tags(QWEN3_SYSTEM) == ("<SOLUTION>", "</SOLUTION>")


@pytest.mark.parametrize("system", [QWEN3_SYSTEM, None], ids=["recipe's own tags", "no system message"])
def test_generate_and_rewards_read_each_answer_as_eval_does(system):
    """`grpo generate` and `grpo rewards` show a completion's answer through score_completions; `grpo eval` reads it
    in score_with. Over every answer style (our tags, the recipe's tags, \\boxed{}, ####), with and without the
    system message that names the tags, the three commands read the same answer: `The answer is \\boxed{9}` is 9
    everywhere, not '' in two of them."""
    from grpo_pipeline.pipeline.backends import Completion
    from grpo_pipeline.pipeline.infer.evaluate import score_completions

    rows, texts = rows_and_texts()
    for row in rows:
        row["prompt"] = [m for m in row["prompt"] if system or m["role"] != "system"]
    verdicts, _ = score_with(build_scorer(["xmlcount", "correctness"], keywords), rows, texts)
    shown = score_completions([Completion(t, 5, [1] * 5) for t in texts], ["9"] * len(rows),
                              [row["prompt"] for row in rows])
    assert [s["extracted_answer"] for s in shown] == [v["extracted_answer"] for v in verdicts]
    assert "9" in [s["extracted_answer"] for s, t in zip(shown, texts) if "boxed" in t]
    assert all("correct" not in s for s in shown)  # right or wrong is the scorer's verdict, never a second reading


def test_the_eval_table_keeps_a_space_after_a_long_reward_name():
    """Found trying eval as a new user: `mean correctness_reward_func0.250` ran the name into its mean."""
    from grpo_pipeline.pipeline.infer.evaluate import format_table

    table = format_table({"n": 8, "accuracy": 0.125, "format_rate": 1.0, "mean_completion_length": 57.0,
                          "garbled_rate": 0.0, "rewards": {"correctness_reward_func": 0.25, "brevity": 1.0}}, "eval")
    assert "mean correctness_reward_func 0.250" in table.splitlines()
    assert "mean brevity            1.000" in table.splitlines()  # short names keep the column
