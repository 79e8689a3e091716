"""Behaviour of rewards/: answer normalisation, extraction, the five reward functions, the registry."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import rewards
from rewards import (
    DEFAULT_REWARD_WEIGHTS,
    DEFAULT_REWARDS,
    REWARD_FUNCS,
    answers_match,
    check_reward_weights,
    correctness_reward_func,
    extract_hash_answer,
    extract_xml_answer,
    get_reward_funcs,
    int_reward_func,
    normalize_answer,
    resolve_reward,
    soft_format_reward_func,
    strict_format_reward_func,
    xmlcount_reward_func,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
ALL_FUNCS = [xmlcount_reward_func, soft_format_reward_func, strict_format_reward_func, int_reward_func,
             correctness_reward_func]


def wrap(answer: str) -> str:
    return f"<reasoning>\nwork\n</reasoning>\n<answer>\n{answer}\n</answer>\n"


def as_chat(text):
    return [{"role": "assistant", "content": text}]


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
    import rewards.matching

    calls = []
    monkeypatch.setattr(rewards.matching, "symbolic_equal", lambda p, r: calls.append((p, r)) or False)
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


# --- format rewards ---------------------------------------------------------------------------

STRICT_OK = [
    "<reasoning>\nstep 1\nstep 2\n</reasoning>\n<answer>\n18\n</answer>\n",  # the notebook's exact layout
    "<reasoning>r</reasoning><answer>18</answer>",  # no newlines
    "<reasoning>\r\nr\r\n</reasoning>\r\n<answer>\r\n18\r\n</answer>\r\n",  # CRLF
    "  \n<reasoning> r </reasoning>\n\n\n<answer> 18 </answer>\n\n",  # extra whitespace around
    "<reasoning>\nline 1\n\nline 3 with <b>html</b>\n</reasoning>\n<answer>\n18\n</answer>",  # no trailing newline
]
STRICT_BAD = [
    "Sure! <reasoning>r</reasoning><answer>18</answer>",  # text before
    "<reasoning>r</reasoning><answer>18</answer> Hope this helps",  # text after
    "<reasoning>r</reasoning> so <answer>18</answer>",  # text between
    "<answer>18</answer><reasoning>r</reasoning>",  # wrong order
    "<reasoning>r</reasoning><answer>18</answer><answer>18</answer>",  # repeated tag
    "<reasoning>r<reasoning>r</reasoning><answer>18</answer>",
    "<reasoning>r</reasoning><answer>  </answer>",  # empty answer
    "<reasoning></reasoning><answer>18</answer>",  # empty reasoning
    "<reasoning>r</reasoning><answer>18",  # unclosed
    "<reasoning>r<answer>18</answer>",
    "", "18",
]


@pytest.mark.parametrize("text", STRICT_OK)
def test_strict_format_accepts_whitespace_variants(text):
    assert strict_format_reward_func([text]) == [0.5]
    assert strict_format_reward_func(completions=[as_chat(text)], prompts=None) == [0.5]


@pytest.mark.parametrize("text", STRICT_BAD)
def test_strict_format_rejects_other_structure(text):
    assert strict_format_reward_func([text]) == [0.0]


@pytest.mark.parametrize("text, expected", [
    ("<reasoning>\nr\n</reasoning>\n<answer>\n18\n</answer>\n", 0.5),
    ("Sure!\n<reasoning>\nmulti\nline\n</reasoning> so then <answer>18</answer> bye", 0.5),
    ("<reasoning></reasoning><answer></answer>", 0.5),
    ("<answer>18</answer><reasoning>r</reasoning>", 0.0),
    ("<reasoning>r</reasoning><answer>18", 0.0),
    ("<reasoning>r<answer>18</answer>", 0.0),
    ("no tags", 0.0), ("", 0.0),
])
def test_soft_format(text, expected):
    assert soft_format_reward_func([text]) == [expected]
    assert soft_format_reward_func([as_chat(text)]) == [expected]


@pytest.mark.parametrize("text, expected", [
    ("<reasoning>\nr\n</reasoning>\n<answer>\n18\n</answer>\n", 0.5),
    ("<reasoning>r</reasoning><answer>18</answer>", 0.5),  # newlines around tags are not required
    ("<reasoning>r</reasoning><answer>18</answer>" + "x" * 10, 0.49),
    ("<reasoning>r</reasoning><answer>18</answer>" + "x" * 100_000, 0.375),  # penalty capped
    ("<reasoning>r</reasoning><answer>18</answer>\n\n   \n", 0.5),  # trailing whitespace is free
    ("<answer>18</answer>", 0.25),
    ("<reasoning>r</reasoning><reasoning>r</reasoning><answer>18</answer>", 0.25),  # repeated tags earn nothing
    ("</answer>" + "x" * 1000, 0.0),  # never negative
    ("plain text", 0.0),
])
def test_xmlcount(text, expected):
    assert xmlcount_reward_func([text]) == pytest.approx([expected])


def test_xmlcount_trailing_text_cannot_outweigh_the_tags():
    """The notebook's unbounded -0.001/char made long trailing text cost more than all tags earn."""
    scores = xmlcount_reward_func([wrap("18") + "y" * n for n in (0, 50, 125, 1_000, 1_000_000)])
    assert scores == sorted(scores, reverse=True)
    assert min(scores) == pytest.approx(0.375)


# --- all functions: shapes, lengths, odd input, bounded time ----------------------------------

ODD_COMPLETIONS = [None, 42, 3.5, b"<answer>18</answer>", [], [None], [[{"content": "x"}]], {"content": None},
                   {"role": "assistant"}, [{"role": "assistant", "content": 7}], "", "\x00\x01\x02",
                   "<answer>" * 50, "</answer>" * 50]


@pytest.mark.parametrize("func", ALL_FUNCS, ids=lambda f: f.__name__)
def test_odd_completions_score_zero(func):
    out = func(prompts=None, completions=ODD_COMPLETIONS, answer=["18"] * len(ODD_COMPLETIONS))
    assert len(out) == len(ODD_COMPLETIONS)
    assert all(v == 0.0 for v in out)


@pytest.mark.parametrize("func", ALL_FUNCS, ids=lambda f: f.__name__)
def test_completion_container_shapes(func):
    assert func(prompts=None, completions=[], answer=[]) == []
    assert func(prompts=None, completions=None, answer=[]) == []
    single = func(prompts=None, completions=wrap("18"), answer="18")  # a bare string is one completion
    assert len(single) == 1 and single[0] > 0
    assert func(prompts=None, completions=(wrap("18"), wrap("18")), answer=("18", "18")) == \
        func(prompts=None, completions=[wrap("18"), wrap("18")], answer=["18", "18"])


@pytest.mark.parametrize("func", ALL_FUNCS, ids=lambda f: f.__name__)
def test_megabyte_completions_take_bounded_time(func):
    megabyte = 1_000_000
    completions = [
        "<answer>" * (megabyte // 8),
        "<reasoning>" + "a" * megabyte + "</reasoning><answer>18</answer>",
        wrap("18") + "</answer>" * (megabyte // 9),
        "<answer>" + "1," * (megabyte // 2) + "</answer>",
        "<reasoning>" * 50_000 + "</reasoning>" * 50_000 + "<answer>" + "\\frac{" * 100_000,
        "\ufffd\u200b" * (megabyte // 2),
    ]
    start = time.perf_counter()
    out = func(prompts=None, completions=completions, answer=["18"] * len(completions))
    assert len(out) == len(completions)
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize("text", [
    "1," * 499, "1 " * 499, "answer is " * 99, "\\frac{" * 160, "\\boxed{" * 120, "{" * 999, "1" * 999,
    "-" * 999, "1/" * 499, "答案是" * 333, "=" * 999, "(" * 998 + ")", "1e" * 499, "\\text{" * 160,
])
def test_answer_reader_has_no_catastrophic_backtracking(text):
    start = time.perf_counter()
    normalize_answer(text)
    answers_match(text, "18")
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("func", ALL_FUNCS, ids=lambda f: f.__name__)
def test_returns_plain_floats(func):
    out = func(prompts=None, completions=[wrap("18"), "x"], answer=["18", "18"])
    assert all(type(v) is float for v in out)


# --- registry ---------------------------------------------------------------------------------

def test_registry_names_defaults_and_stable_dunder_names():
    assert list(REWARD_FUNCS) == ["xmlcount", "soft_format", "strict_format", "int", "correctness"]
    assert DEFAULT_REWARDS == ["xmlcount", "soft_format", "strict_format", "int", "correctness"]
    assert DEFAULT_REWARD_WEIGHTS == [1.0] * 5
    names = [f.__name__ for f in get_reward_funcs(DEFAULT_REWARDS)]
    assert names == ["xmlcount_reward_func", "soft_format_reward_func", "strict_format_reward_func",
                     "int_reward_func", "correctness_reward_func"]


def test_resolve_reward_aliases_and_callables():
    for short, func in REWARD_FUNCS.items():
        assert resolve_reward(short) is func
        assert resolve_reward(func.__name__) is func
        assert resolve_reward(f" {short} ") is func
    assert resolve_reward(len) is len


def test_resolve_reward_unknown_name_lists_known_ones():
    with pytest.raises(ValueError) as err:
        resolve_reward("corectness")
    message = str(err.value)
    assert "'corectness'" in message and "reward_funcs" not in message  # the config layer names the field
    for name in list(REWARD_FUNCS) + [f.__name__ for f in REWARD_FUNCS.values()]:
        assert name in message
    for bad in ("", "   ", None, 3):
        with pytest.raises(ValueError, match="not a reward name"):
            resolve_reward(bad)


def test_plugin_module_function(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    func = resolve_reward("test_rewards_plugin_helper:answer_length_reward")
    assert func.__name__ == "answer_length_reward"
    assert func(completions=[wrap("18"), "none"], prompts=None) == pytest.approx([0.2, 0.0])
    funcs = get_reward_funcs(["correctness", "test_rewards_plugin_helper:answer_length_reward"])
    assert [f.__name__ for f in funcs] == ["correctness_reward_func", "answer_length_reward"]


@pytest.mark.parametrize("spec, fragment", [
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("test_rewards_plugin_helper:missing", "has no 'missing'"),
    ("test_rewards_plugin_helper:NOT_A_FUNCTION", "not a function"),
    (":f", "package.module:function"), ("test_rewards_plugin_helper:", "package.module:function"),
])
def test_plugin_errors(monkeypatch, spec, fragment):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with pytest.raises(ValueError) as err:
        resolve_reward(spec)
    assert fragment in str(err.value) and "reward_funcs" not in str(err.value)


def test_get_reward_funcs_rejects_bad_lists():
    with pytest.raises(ValueError, match=r"expected a list"):
        get_reward_funcs("correctness")
    with pytest.raises(ValueError, match="empty"):
        get_reward_funcs([])
    with pytest.raises(ValueError, match="same reward"):
        get_reward_funcs(["correctness", "correctness_reward_func"])


def test_check_reward_weights():
    assert check_reward_weights(DEFAULT_REWARDS, None) == [1.0] * 5
    assert check_reward_weights(["int", "correctness"], [0.5, 2]) == [0.5, 2.0]
    assert check_reward_weights(["int"], [-1.0]) == [-1.0]  # a penalty is allowed
    for weights in ([1.0], [1.0, 2.0, 3.0], [1.0, math.nan], [1.0, math.inf], [1.0, "2"], [1.0, True], "1,1"):
        with pytest.raises(ValueError) as err:
            check_reward_weights(["int", "correctness"], weights)
        assert "reward_weights" not in str(err.value) and "config error" not in str(err.value)


# --- module hygiene ---------------------------------------------------------------------------

def test_import_is_light():
    code = ("import sys, time; t = time.perf_counter(); import rewards; dt = time.perf_counter() - t; "
            "heavy = [m for m in ('torch', 'math_verify', 'sympy', 'transformers', 'trl') if m in sys.modules]; "
            "print(heavy, dt)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    heavy, seconds = out.stdout.rsplit(" ", 1)
    assert heavy == "[]"
    assert float(seconds) < 1.0


def test_public_names():
    for name in ("correctness_reward_func", "int_reward_func", "strict_format_reward_func",
                 "soft_format_reward_func", "xmlcount_reward_func", "extract_xml_answer", "extract_hash_answer",
                 "normalize_answer", "answers_match", "REWARD_FUNCS", "get_reward_funcs", "resolve_reward",
                 "DEFAULT_REWARDS", "DEFAULT_REWARD_WEIGHTS", "check_reward_weights"):
        assert hasattr(rewards, name) and name in rewards.__all__



def test_config_layer_names_the_field_the_rewards_do_not():
    """rewards/ raises plain ValueErrors; pipeline.config wraps them once, naming the config field."""
    from pipeline.config import ConfigError, PipelineConfig, validate

    with pytest.raises(ConfigError, match=r"^config error in `reward_funcs`: unknown reward 'corectness'") as err:
        validate(PipelineConfig().replace(reward_funcs=["corectness"]), n_processes=1)
    assert str(err.value).count("config error") == 1
    with pytest.raises(ConfigError, match=r"^config error in `reward_weights`: 1 weights for 5 reward functions"):
        validate(PipelineConfig().replace(reward_weights=[1.0]), n_processes=1)
