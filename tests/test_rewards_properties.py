"""Property tests: no reward function or helper raises, and every reward returns one value per completion."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_pipeline.rewards import (
    answers_match,
    correctness_reward_func,
    extract_hash_answer,
    extract_xml_answer,
    int_reward_func,
    normalize_answer,
    soft_format_reward_func,
    strict_format_reward_func,
    xmlcount_reward_func,
)

FORMAT_FUNCS = [xmlcount_reward_func, soft_format_reward_func, strict_format_reward_func, int_reward_func]
MAX_REWARD = {xmlcount_reward_func: 0.5, soft_format_reward_func: 0.5, strict_format_reward_func: 0.5,
              int_reward_func: 0.5}

# Pieces real (and broken) completions are made of: tags, numbers in many notations, LaTeX,
# Chinese prefixes, garbage characters. Joined with arbitrary text in between.
PIECES = ["<reasoning>", "</reasoning>", "<answer>", "</answer>", "\n", "\r\n", " ", "18", "-3", "1,234", "1 234",
          "0.5", "1/2", "50%", "$", "\\boxed{", "\\frac{1}{2}", "\\sqrt{", "{", "}", "(", ")", "答案：",
          "答案是", "元", "The answer is", "=", "x", "^", "\ufffd", "\u200b", "\x00", "\x1b[0m", "１８", "####", "e5", "."]

texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=12)), max_size=30).map("".join)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["assistant", "user", "tool"]),
                                            "content": st.one_of(texts, st.none(), st.integers())}), max_size=3)
odd = st.one_of(st.none(), st.integers(), st.floats(allow_nan=True), st.binary(max_size=10),
                st.lists(st.lists(texts, max_size=2), max_size=2),
                st.dictionaries(st.text(max_size=5), texts, max_size=2))
completion = st.one_of(texts, messages, st.builds(lambda t: {"content": t}, texts), odd)
completions = st.lists(completion, max_size=8)
references = st.one_of(texts, st.none(), st.integers(), st.sampled_from(["18", "1,234", "0.5", "\\frac{1}{2}", ""]))

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(completions)
def test_format_and_int_rewards_never_raise_and_keep_length(batch):
    for func in FORMAT_FUNCS:
        out = func(prompts=None, completions=batch, completion_ids=None, trainer_state=None)
        assert len(out) == len(batch)
        assert all(type(v) is float and 0.0 <= v <= MAX_REWARD[func] for v in out)


@PROPERTY_SETTINGS
@given(st.lists(st.tuples(completion, references), max_size=8))
def test_correctness_never_raises_and_keeps_length(pairs):
    batch, answers = [c for c, _ in pairs], [a for _, a in pairs]
    out = correctness_reward_func(prompts=None, completions=batch, answer=answers)
    assert len(out) == len(batch)
    assert all(v in (0.0, 2.0) or v is None for v in out)


@PROPERTY_SETTINGS
@given(st.one_of(texts, odd))
def test_helpers_never_raise(value):
    assert isinstance(extract_xml_answer(value), str)
    hashed = extract_hash_answer(value)
    assert hashed is None or isinstance(hashed, str)
    normalized = normalize_answer(value)
    assert normalized is None or isinstance(normalized, str)
    assert isinstance(answers_match(value, "18"), bool)


@PROPERTY_SETTINGS
@given(st.integers(min_value=-10**12, max_value=10**12))
def test_any_integer_written_with_separators_or_currency_matches_itself(n):
    for written in (f"{n:,}", f"{n}", f"{n:,}".replace(",", " "), f"答案：{n}", f"\\boxed{{{n}}}", f"{n} dollars"):
        assert answers_match(written, str(n)), written
        assert correctness_reward_func(completions=[f"<answer>{written}</answer>"], answer=[str(n)]) == [2.0]
    assert not answers_match(str(n), str(n + 1))
    assert not answers_match(str(n * 10 + 1), str(n))  # never a substring / prefix match


@PROPERTY_SETTINGS
@given(st.integers(min_value=-10**6, max_value=10**6), st.integers(min_value=1, max_value=1000))
def test_fractions_match_their_decimal_when_it_terminates(p, q):
    value = p / q
    if math.isclose(round(value, 6), value, rel_tol=0, abs_tol=1e-12):
        assert answers_match(f"{p}/{q}", repr(round(value, 6)))
    assert answers_match(f"\\frac{{{p}}}{{{q}}}", f"{p}/{q}")
