"""Behaviour of rewards/: the three format rewards, and all five functions on odd shapes, huge input, bounded time."""

from __future__ import annotations

import time

import pytest

from grpo_pipeline.rewards import (
    answers_match,
    correctness_reward_func,
    int_reward_func,
    normalize_answer,
    soft_format_reward_func,
    strict_format_reward_func,
    xmlcount_reward_func,
)
from tests.reward_helpers import as_chat, wrap

ALL_FUNCS = [xmlcount_reward_func, soft_format_reward_func, strict_format_reward_func, int_reward_func,
             correctness_reward_func]


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
