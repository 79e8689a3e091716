"""Behaviour of rewards/: answer normalisation, extraction, the correctness and int rewards.

The format rewards and every function's odd input are in tests/test_rewards_format.py; the registry and
module hygiene in tests/test_rewards_registry.py."""

from __future__ import annotations

import threading
import time

import pytest

from grpo_pipeline.rewards import (
    answers_match,
    correctness_reward_func,
    extract_hash_answer,
    extract_xml_answer,
    int_reward_func,
    normalize_answer,
)
from tests.reward_helpers import as_chat, wrap


# --- normalisation: each rule, right and wrong ------------------------------------------------

@pytest.mark.parametrize("pred, ref", [
    # thousands separators
    ("1,234", "1234"), ("1 234", "1234"), ("12,345,678", "12345678"), ("1,234.50", "1234.5"),
    ("1{,}234", "1234"), ("1\\,234", "1234"), ("1\u202f234", "1234"),
    # currency and unit words around one number
    ("$18", "18"), ("18 dollars", "18"), ("18元", "18"), ("¥18", "18"), ("￥18", "18"), ("18美元", "18"),
    ("US$18", "18"), ("-$3", "-3"), ("\\$18.00", "18"), ("18 km", "18"), ("18km", "18"),
    # a sentence with one final number
    ("The answer is 18.", "18"), ("So she has 18 apples left.", "18"),
    ("She had 5 apples and bought 13, so the answer is 18", "18"), ("5 + 13 = 18", "18"), ("x = 18", "18"),
    ("18 or 18", "18"),
    # percent is a unit
    ("50%", "50"), ("50\\%", "50"), ("50 percent", "50"), ("５０％", "50"),
    # full-width digits and punctuation
    ("１８", "18"), ("１，２３４", "1234"),
    # Chinese answer prefixes
    ("答案：18", "18"), ("答案是18", "18"), ("答：18元", "18"), ("答案为 18", "18"), ("答案: 18", "18"),
    ("第2步后，答案是18", "18"), ("答案是：-5", "-5"),
    # LaTeX
    ("\\boxed{18}", "18"), ("$18$", "18"), ("\\(18\\)", "18"), ("The answer is $\\boxed{18}$.", "18"),
    ("\\frac{1}{2}", "0.5"), ("\\dfrac{3}{4}", "0.75"), ("\\tfrac{1}{4}", "0.25"), ("\\frac12", "0.5"),
    ("$\\boxed{\\dfrac{1}{2}}$", "1/2"), ("-\\frac{1}{2}", "-0.5"), ("\\text{18 apples}", "18"),
    ("90^\\circ", "90"), ("90°", "90"),
    # temperatures: ℃ ℉ (°C °F after NFKC), glued or spaced, and the Chinese units
    ("-5℃", "-5"), ("20°C", "20"), ("68°F", "68"), ("20℉", "20"), ("-5 ℃", "-5"), ("37.5 °C", "37.5"),
    ("答案：-5℃", "-5"), ("It is 20°C today.", "20"), ("5摄氏度", "5"), ("20度", "20"),
    # garbage from a collapsing policy
    ("18\ufffd", "18"), ("1\u200b8", "18"), ("\ufeff18", "18"), ("18\x00\x07", "18"), ("\x1b[0m18", "18"),
    ("18\u202e", "18"),
    # tolerance and fractions vs decimals
    ("0.333333", "1/3"), ("12.344999999999999", "12.345"), ("18.00", "18"), ("1/2", "0.5"), ("-1/2", "-0.5"),
    ("½", "0.5"), ("−3", "-3"), ("1e3", "1000"), ("(18)", "18"), ("18", "18.000000000000004"),
    ("18.0000000001", "18"),
    # reference side gets the same treatment
    ("18", "$18.00"), ("1234", "#1,234 dollars"),
])
def test_answers_match_accepts_equivalent_forms(pred, ref):
    assert answers_match(pred, ref), (pred, ref)


@pytest.mark.parametrize("pred, ref", [
    # no substring matching
    ("142", "42"), ("42", "142"), ("4.2", "42"), ("420", "42"), ("-42", "42"), ("1.234", "1234"),
    # separators are only groups of three
    ("1,23", "123"), ("1 23", "123"),
    # two different numbers and no final marker
    ("5 apples and 18 pears", "18"), ("5 apples and 18 pears", "5"), ("18 or 20", "18"), ("3 1/2", "3"),
    # percent does not also mean a fraction
    ("50%", "0.5"),
    # tolerance does not reach real differences
    ("1234567.5", "1234567"), ("1234568", "1234567"), ("999999998", "999999999"), ("0.33", "1/3"),
    ("18.5", "18"), ("18.001", "18"),
    ("\\frac{1}{3}", "0.3"), ("1/2", "2"),
    # algebra is not a number
    ("2x", "2"), ("3\\sqrt{2}", "3"), ("x^2", "2"), ("3²", "32"), ("x+1", "1"), ("5k", "5"),
    ("x >= 3", "3"), ("x ≈ 3.14", "3"), ("x = 4, y = 3", "x = 5, y = 3"),
    # wrong answers in friendly clothes
    ("\\boxed{17}", "18"), ("$18", "180"), ("答案是18", "8"), ("The answer is 18.", "1"),
    # nothing to compare
    ("", "18"), (None, "18"), ("18", None), ("   ", "18"), ("eighteen", "80"), ("\ufffd\u200b", "18"),
])
def test_answers_match_rejects_different_answers(pred, ref):
    assert not answers_match(pred, ref), (pred, ref)


@pytest.mark.parametrize("text, expected", [
    ("1,234", "1234"), ("$18.00", "18"), ("答案：１８元", "18"), ("\\frac{1}{2}", "0.5"), ("1/3", "1/3"),
    ("-0.50", "-0.5"), ("50%", "50"), ("The answer is 18.", "18"), ("1e3", "1000"),
    ("  x + 1  ", "x + 1"), ("\\boxed{x^2}", "x^2"), ("5 or 18", "5 or 18"),
    ("", None), ("  \n ", None), (None, None), (18, "18"), (0.5, "0.5"), (True, None), ("x" * 1001, None),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_answers_match_accepts_numbers_as_references():
    assert answers_match("18", 18) and answers_match("0.5", 0.5) and not answers_match("18", 19)


# --- symbolic path (math-verify) --------------------------------------------------------------

@pytest.mark.parametrize("pred, ref", [
    ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2"), ("x^2+2x+1", "(x+1)^2"), ("\\sqrt{324}", "18"),
    ("2, 3", "3, 2"), ("\\pi", "\\pi"), ("0.866025", "\\frac{\\sqrt{3}}{2}"),
])
def test_symbolic_answers_match(pred, ref):
    assert answers_match(pred, ref)


@pytest.mark.parametrize("pred, ref", [
    ("x^2+2x+2", "(x+1)^2"), ("\\sqrt{325}", "18"), ("\\pi", "3.14159"), ("2, 4", "3, 2"), ("2x+1", "1"),
])
def test_symbolic_answers_differ(pred, ref):
    assert not answers_match(pred, ref)


def test_numeric_and_ambiguous_answers_never_reach_math_verify(monkeypatch):
    """The time budget depends on it: GSM8K-style answers must settle on the fast path."""
    import grpo_pipeline.rewards.matching

    calls = []
    monkeypatch.setattr(grpo_pipeline.rewards.matching, "symbolic_equal", lambda p, r: calls.append((p, r)) or False)
    for pred in ("$1,234", "1234.5", "答案：1234", "\\boxed{\\frac{1}{2}}", "5 or 18", "2x", "x+1", "eighteen", "", None):
        answers_match(pred, "1234")
    assert calls == []
    answers_match("\\sqrt{4}", "2")
    assert calls == [("\\sqrt{4}", "2")]


def test_symbolic_path_skipped_off_the_main_thread_numeric_path_still_works():
    results = {}

    def worker():
        results["symbolic"] = answers_match("\\sqrt{324}", "18")
        results["numeric"] = answers_match("$1,234", "1234")

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert results == {"symbolic": False, "numeric": True}
    assert answers_match("\\sqrt{324}", "18")  # the same check in the main thread


def test_symbolic_path_has_a_time_limit():
    start = time.perf_counter()
    assert not answers_match("10^{10^{10^{10}}}", "1")
    assert time.perf_counter() - start < 8  # 1 s parse + 1 s verify limits, with slack for a busy CI box


# --- extraction -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("<reasoning>r</reasoning>\n<answer>\n18\n</answer>", "18"),
    ("<answer>5</answer> no wait <answer>7</answer>", "7"),  # last block wins
    ("I'll write <answer> tags. <answer>9</answer>", "9"),
    ("<answer><answer>3</answer>", "3"),
    ("<answer>4</answer><answer> 42", "42"),  # unclosed final block runs to the end
    ("<answer>\r\n 18 \r\n</answer>", "18"),
    ("just 18", ""), ("</answer>18", ""), ("", ""), (None, ""), (42, ""), (["<answer>1</answer>"], ""),
])
def test_extract_xml_answer(text, expected):
    assert extract_xml_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips.\n#### 72", "72"),
    ("#### 1,234", "1234"), ("#### 答案：123\n", "123"), ("#### $18", "18"), ("#### -3", "-3"),
    ("#### 18.00", "18"), ("#### 0.5", "0.5"), ("steps\n####  7 \n", "7"), ("#### 1 #### 2", "2"),
    ("#### Monday", "Monday"),
    ("#### ", None), ("####\n  \n", None), ("no marker 72", None), ("", None), (None, None), (72, None),
])
def test_extract_hash_answer(text, expected):
    assert extract_hash_answer(text) == expected


# --- correctness_reward_func ------------------------------------------------------------------

def test_correctness_both_completion_shapes_and_dict():
    completions_str = [wrap("$1,234"), wrap("1234.5"), wrap("答案：1234")]
    completions_chat = [as_chat(c) for c in completions_str]
    completions_dict = [{"role": "assistant", "content": c} for c in completions_str]
    for completions in (completions_str, completions_chat, completions_dict):
        assert correctness_reward_func(prompts=None, completions=completions, answer=["1234"] * 3) == [2.0, 0.0, 2.0]


def test_correctness_judges_last_assistant_message_and_text_parts():
    tool_turn = [{"role": "assistant", "content": "<answer>1</answer>"}, {"role": "tool", "content": "result"},
                 {"role": "assistant", "content": "<answer>18</answer>"}]
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "<answer>18</answer>"}]}]
    assert correctness_reward_func(completions=[tool_turn, parts], answer=["18", "18"]) == [2.0, 2.0]


def test_correctness_last_block_wins_and_unclosed_final_block_counts():
    completions = ["<answer>18</answer> hmm <answer>20</answer>", "<answer>20</answer> hmm <answer>18</answer>",
                   "<reasoning>r</reasoning><answer>18", "<answer>18</answer><answer>"]
    assert correctness_reward_func(completions=completions, answer=["18"] * 4) == [0.0, 2.0, 2.0, 0.0]


def test_correctness_no_answer_block_is_wrong_not_unjudged():
    completions = ["The answer is 18.", "<answer></answer>", "", None, 42, [["nested"]], {"no": "content"}]
    assert correctness_reward_func(completions=completions, answer=["18"] * 7) == [0.0] * 7


def test_correctness_missing_reference_cannot_be_judged():
    out = correctness_reward_func(completions=[wrap("18")] * 4, answer=[None, "", "  ", "x" * 5000])
    assert out == [None, None, None, None]


def test_correctness_accepts_trl_kwargs_and_numeric_or_single_references():
    out = correctness_reward_func(
        prompts=[[{"role": "user", "content": "q"}]] * 2, completions=[wrap("18"), wrap("19")], answer=[18, 18],
        completion_ids=[[1, 2], [3]], trainer_state=object(), log_metric=lambda *a: None,
        log_extra=lambda *a: None, question=["q", "q"], environments=None)
    assert out == [2.0, 0.0]
    assert correctness_reward_func(completions=[wrap("18"), wrap("7")], answer="18") == [2.0, 0.0]
    assert correctness_reward_func([None], [wrap("18")], ["18"]) == [2.0]  # the notebook's positional call


def test_correctness_set_up_errors_name_answer():
    with pytest.raises(ValueError, match="`answer`"):
        correctness_reward_func(completions=[wrap("18")])
    with pytest.raises(ValueError, match="`answer`.*2 completions|2 completions"):
        correctness_reward_func(completions=[wrap("18"), wrap("18")], answer=["18"])


def test_correctness_scale_matches_notebook():
    assert correctness_reward_func(completions=[wrap("18")], answer=["18"]) == [2.0]


# --- int_reward_func --------------------------------------------------------------------------

@pytest.mark.parametrize("answer, expected", [
    ("18", 0.5), ("-3", 0.5), ("1,234", 0.5), ("$18", 0.5), ("18.00", 0.5), ("答案：18", 0.5), ("\\boxed{18}", 0.5),
    ("The answer is 18.", 0.5), ("１８", 0.5),
    ("18.5", 0.0), ("1/2", 0.0), ("x+1", 0.0), ("5 or 18", 0.0), ("", 0.0), ("eighteen and a half", 0.0), ("²", 0.0),
])
def test_int_reward(answer, expected):
    assert int_reward_func([wrap(answer)]) == [expected]
    assert int_reward_func(completions=[as_chat(wrap(answer))], prompts=None, answer=["1"]) == [expected]


def test_int_reward_without_answer_block():
    assert int_reward_func(["18", None, 7, "<reasoning>18</reasoning>"]) == [0.0] * 4
