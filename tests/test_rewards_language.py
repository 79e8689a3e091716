"""The language_consistency reward: Chinese, English and mixed text, questions answered in another language."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_pipeline.rewards import get_reward_funcs, resolve_reward
from grpo_pipeline.rewards.format import format_completion
from grpo_pipeline.rewards.language import (
    LANGUAGE_REWARD,
    LANGUAGE_THRESHOLD,
    dominant_script,
    language_consistency_reward_func,
    script_counts,
)

ZH_Q = "小明有 5 个苹果，又买了 3 个。他现在一共有多少个苹果？"
EN_Q = "Xiao Ming has 5 apples and buys 3 more. How many apples does he have now?"
ZH_REASONING = "小明原来有 5 个苹果，又买了 3 个，所以一共有 5 + 3 = 8 个。"
EN_REASONING = "He had 5 apples and bought 3 more, so he has 5 + 3 = 8 apples."
MIXED_REASONING = "小明原来有 5 个苹果。Then he buys 3 more, so the total is 8 apples."


def score(question, completion):
    return language_consistency_reward_func(prompts=[[{"role": "user", "content": question}]],
                                            completions=[completion])[0]


@pytest.mark.parametrize("question, reasoning, answer, expected", [
    (ZH_Q, ZH_REASONING, "8", LANGUAGE_REWARD),                  # Chinese in, Chinese out
    (EN_Q, EN_REASONING, "8", LANGUAGE_REWARD),                  # English in, English out
    (ZH_Q, ZH_REASONING, "8 个", LANGUAGE_REWARD),
    (ZH_Q, EN_REASONING, "8", LANGUAGE_REWARD / 2),              # drifted into English: the reasoning scores 0
    (ZH_Q, EN_REASONING, "8 apples", 0.0),                       # and the answer too
    (EN_Q, ZH_REASONING, "8", LANGUAGE_REWARD / 2),              # the other way round
    (EN_Q, ZH_REASONING, "8 个苹果", 0.0),
])
def test_each_part_in_the_questions_language_earns_its_half(question, reasoning, answer, expected):
    assert score(question, format_completion(reasoning, answer)) == pytest.approx(expected)


def test_mixed_reasoning_scores_between_all_and_nothing():
    mixed = score(ZH_Q, format_completion(MIXED_REASONING, "8"))
    assert (score(ZH_Q, format_completion(EN_REASONING, "8")) < mixed
            < score(ZH_Q, format_completion(ZH_REASONING, "8")))
    counts = script_counts(MIXED_REASONING)
    share = counts["cjk"] / (counts["cjk"] + counts["latin"])
    assert mixed == pytest.approx(LANGUAGE_REWARD * (min(1, share / LANGUAGE_THRESHOLD) + 1) / 2)


def test_numbers_formulas_latex_and_tags_do_not_count_as_english():
    text = "设 x 为苹果数，则 $x = \\frac{16}{2}$，即 2x+1=17，\\boxed{8}。<|im_end|>"
    assert script_counts(text) == {"cjk": len("设为苹果数则即"), "latin": 0}
    assert score(ZH_Q, format_completion(text, "\\boxed{8}")) == LANGUAGE_REWARD


def test_the_question_is_the_user_turn_not_the_english_system_prompt():
    conversation = [{"role": "system", "content": "Respond in the following format: <reasoning> ... </reasoning>"},
                    {"role": "user", "content": ZH_Q}]
    rendered = f"<|im_start|>system\nRespond in the following format<|im_end|>\n<|im_start|>user\n{ZH_Q}<|im_end|>\n"
    drifted = format_completion(EN_REASONING, "8")
    for prompt in (conversation, rendered):
        assert language_consistency_reward_func(prompts=[prompt], completions=[drifted]) == [LANGUAGE_REWARD / 2]


def test_without_a_question_only_mixing_costs():
    assert language_consistency_reward_func(prompts=None, completions=[format_completion(EN_REASONING, "8"),
                                                                       format_completion(ZH_REASONING, "8"),
                                                                       "8", None]) == [0.5, 0.5, 0.5, 0.0]
    mixed = language_consistency_reward_func(prompts=None, completions=[format_completion(ZH_REASONING, "eight")])
    assert mixed == [LANGUAGE_REWARD / 2]


def test_registered_by_name_and_off_by_default():
    from grpo_pipeline.pipeline.config import PipelineConfig

    assert resolve_reward("language_consistency") is language_consistency_reward_func
    assert resolve_reward("language_consistency_reward_func") is language_consistency_reward_func
    assert "language_consistency" not in PipelineConfig().grpo.reward_funcs
    assert get_reward_funcs(["correctness", "language_consistency"])[1] is language_consistency_reward_func


# --- properties over the class: any text in one script, any question in one script -------------------

han = st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=2, max_size=30)
english = st.lists(st.from_regex(r"[A-Za-z]{2,8}", fullmatch=True), min_size=1, max_size=12).map(" ".join)
noise = st.lists(st.sampled_from(["18", " 3.5 ", "$x^2$", "\\frac{1}{2}", "<answer>", "2x+1=7", "，", "。", "?"]),
                 max_size=6).map(" ".join)


@settings(max_examples=100, deadline=None)
@given(question=st.one_of(han, english), same=st.booleans(), body=st.data(), extra=noise)
def test_same_language_full_marks_other_language_none(question, same, body, extra):
    question_script = dominant_script(question)
    wanted = question_script if same else ("latin" if question_script == "cjk" else "cjk")
    strategy = han if wanted == "cjk" else english
    reasoning, answer = body.draw(strategy), body.draw(strategy)
    reward = score(question, format_completion(f"{reasoning} {extra}", f"{extra} {answer}"))
    assert reward == (LANGUAGE_REWARD if same else 0.0)


@settings(max_examples=100, deadline=None)
@given(prompts=st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(), han, english,
                                                        st.lists(st.fixed_dictionaries({"role": st.just("user"),
                                                                                        "content": han}))))),
       completions=st.lists(st.one_of(st.none(), st.integers(), han, english, st.text(max_size=40)), max_size=6))
def test_never_raises_and_keeps_one_float_per_completion(prompts, completions):
    out = language_consistency_reward_func(prompts=prompts, completions=completions, answer=None)
    assert len(out) == len(completions)
    assert all(type(v) is float and 0.0 <= v <= LANGUAGE_REWARD for v in out)
