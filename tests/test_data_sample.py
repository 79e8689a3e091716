"""The bundled GSM8K-format sample (pipeline/assets/gsm8k_sample.jsonl) is well-formed and its arithmetic is right."""

import ast
import json
import operator
import re

import pytest

from grpo_pipeline.pipeline.data.source_spec import SAMPLE_PATH
from grpo_pipeline.rewards import extract_hash_answer

# GSM8K's calculator annotations: <<48/2=24>>
ANNOTATION = re.compile(r"<<([^<>=]+)=([^<>]+)>>")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(node):
    """Arithmetic only (numbers, + - * /, unary minus, brackets); anything else fails the test."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -evaluate(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](evaluate(node.left), evaluate(node.right))
    raise AssertionError(f"not plain arithmetic: {ast.dump(node)}")


@pytest.fixture(scope="module")
def sample_rows():
    with open(SAMPLE_PATH, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_sample_has_fifty_distinct_problems_with_question_and_answer(sample_rows):
    assert len(sample_rows) == 50
    assert all(set(row) == {"question", "answer"} for row in sample_rows)
    assert len({row["question"] for row in sample_rows}) == 50
    assert all(row["question"].strip() and row["answer"].strip() for row in sample_rows)


def test_every_answer_line_is_one_integer(sample_rows):
    for row in sample_rows:
        assert row["answer"].count("####") == 1, row
        final = extract_hash_answer(row["answer"])
        assert final is not None and re.fullmatch(r"-?\d+", final), (row["answer"], final)
        # The raw text after #### (less a Chinese "答案：" prefix) is that same integer.
        raw = row["answer"].split("####")[1].strip().removeprefix("答案：")
        assert int(raw) == int(final)


def test_every_calculator_annotation_is_correct_and_repeated_in_the_text(sample_rows):
    checked = 0
    for row in sample_rows:
        for match in ANNOTATION.finditer(row["answer"]):
            expr, result = match.groups()
            value = evaluate(ast.parse(expr, mode="eval"))
            assert value == pytest.approx(float(result), abs=1e-9), (expr, result)
            # As in GSM8K, the worked solution states the result right after the annotation.
            assert row["answer"][match.end():].startswith(result), row["answer"]
            checked += 1
    assert checked >= 100  # every solution shows its work


def test_sample_mixes_english_and_chinese_including_daan_answers(sample_rows):
    chinese = [row for row in sample_rows if re.search(r"[\u4e00-\u9fff]", row["question"])]
    daan = [row for row in sample_rows if "#### 答案：" in row["answer"]]
    assert 5 <= len(chinese) < 50
    assert len(daan) >= 3
    assert {extract_hash_answer(row["answer"]) for row in daan} >= {"2400", "15"}
