"""The answer forms a careful human grader accepts, one test per family, and the ones it never does.

Each family test pairs what must be read with a near miss of the same shape that must not.
The property tests at the end generate hedges, lists of alternatives and sentences that assert
a wrong number around the right one, and check that none is ever rewarded.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from grpo_pipeline.rewards import answers_match, correctness_reward_func, extract_xml_answer, int_reward_func
from grpo_pipeline.rewards import symbolic
from grpo_pipeline.rewards.sentences import conclusion_value


def score(answer_block: str, reference: str) -> float | None:
    completion = f"<reasoning>\nworking\n</reasoning>\n<answer>\n{answer_block}\n</answer>\n"
    return correctness_reward_func(completions=[completion], answer=[reference])[0]


def test_conclusion_sentences_are_read_at_the_number_they_assert():
    assert score("The orchard picked 48 + 27, which is 75 baskets in all.", "75") == 2.0
    assert score("So, the price of the larger box is 340.", "340") == 2.0
    assert score("Ben cycles a total of 910 km during the 35 days.", "910") == 2.0
    assert score("Tickets cost 6 * 4 + 3 = 24 + 3 = 27 dollars.", "27") == 2.0
    # the right-hand end of the chain, never a number in the middle of it
    assert score("6 * 4 + 3 = 24 + 3 = 27", "24") == 0.0
    # the result of a subtraction, never its operand
    assert score("52 - 17 = 35 stamps", "17") == 0.0
    assert score("The garden has 12 rows, and each row has 9 plants.", "9") == 0.0  # no assertion: not read


def test_a_closing_tag_cut_short_is_not_part_of_the_answer():
    for ending in ("</", "</ans", "</answer"):
        text = f"<reasoning>r</reasoning><answer>\n64{ending}"
        assert extract_xml_answer(text) == "64"
        assert correctness_reward_func(completions=[text], answer=["64"]) == [2.0]
    assert extract_xml_answer("<answer>\n$7200\n</") == "$7200"
    assert correctness_reward_func(completions=["<answer>64</"], answer=["6"]) == [0.0]


@pytest.mark.parametrize("answer, reference", [
    ("2,500 litres/day", "2500"), ("90 km/h", "90"), ("$22/hour", "22"), ("36 ft²", "36"), ("36 m^2", "36"),
    ("12cm", "12"), ("7m", "7"), ("\\boxed{48\\text{ pages}}", "48"), ("\\boxed{48\\textnormal{ cm}}", "48"),
])
def test_units_after_the_number_are_ignored(answer, reference):
    assert score(answer, reference) == 2.0


@pytest.mark.parametrize("answer, reference", [("15/x", "15"), ("36 x^2", "36"), ("5k", "5"), ("12x", "12")])
def test_algebra_that_looks_like_a_unit_is_not_a_number(answer, reference):
    assert score(answer, reference) == 0.0


def test_mixed_numbers():
    for answer in ("3 \\frac{1}{4}", "3\\frac{1}{4}", "3 1/4", "3\\frac14"):
        assert score(answer, "3.25") == 2.0, answer
        assert score(answer, "3") == 0.0, answer
    assert score("3 5/4", "3") == 0.0  # not a proper fraction: not a mixed number


def test_markdown_emphasis():
    assert score("**56**", "56") == 2.0
    assert score("The final answer is **56**.", "56") == 2.0
    assert score("**56**", "5") == 0.0


def test_a_parenthetical_of_words_after_the_number():
    assert score("56 (roughly)", "56") == 2.0
    assert score("56 (in euros)", "56") == 2.0
    assert score("56 (or 65)", "56") == 0.0


@pytest.mark.parametrize("answer, reference", [
    ("twenty-three", "23"), ("zero", "0"), ("one hundred and five", "105"), ("Two thousand", "2000"),
    ("二十三", "23"), ("一百零五", "105"), ("两千", "2000"), ("3.5 million", "3500000"),
])
def test_number_words(answer, reference):
    assert score(answer, reference) == 2.0


@pytest.mark.parametrize("answer, reference", [
    ("twenty and a half", "20"), ("minus seven", "7"), ("二十点五", "20"), ("负七", "7"), ("one or two", "1"),
])
def test_number_words_the_reader_does_not_fully_understand_are_not_read(answer, reference):
    assert score(answer, reference) == 0.0


def test_references_in_words_cannot_be_judged():
    assert score("\\boxed{23}", "twenty-three") is None
    assert score("twenty-three", "twenty-three") is None
    assert score("23", "not_a_number") is None


def test_latex_spacing_and_approximation():
    assert score("$45,\\! 600$", "45600") == 2.0
    assert score("$45,\\!600$", "45600") == 2.0
    assert score("$y \\approx 14$", "14") == 2.0
    assert score("$y = 2/7 \\approx 0.29$", "2/7") == 2.0  # the exact value before the approximation
    assert score("$14$", "$\\text{14}$") == 2.0
    assert score("$14$", "$\text{14}$") == 2.0  # a reference whose "\t" was read as a TAB


def test_decimal_commas_beside_thousands_commas():
    assert score("2500,75", "2500.75") == 2.0
    assert score("3,99 €", "3.99") == 2.0
    assert score("0,125", "0.125") == 2.0
    assert score("1,250", "1250") == 2.0  # GSM8K's own thousands shape stays thousands
    assert score("12,000,023", "12000023") == 2.0
    assert score("1,250", "1.25") == 0.0
    assert score("5,18", "5") == 0.0 and score("5,18", "18") == 0.0  # a list without a space is no integer


def test_chat_template_tokens_and_sign_offs_end_the_answer():
    new_turn = "<|im_start|>user\nWhat about 7 hours?"
    assert score(f"So the train covers a total of 420 km in 6 hours. {new_turn}", "420") == 2.0
    assert score("Final Answer: The final answer is 75. I hope it is correct. Next: 80, 90", "75") == 2.0


def test_a_long_answer_is_read_at_its_final_statement():
    working = "We add 3 and 4 and then 5 and 6 again. " * 60
    assert score(working + "The answer is 77.", "77") == 2.0
    assert score(working + "The answer is \\boxed{77}.", "77") == 2.0
    assert score(working, "6") == 0.0


def test_int_reward_reads_the_same_forms():
    assert int_reward_func(["<answer>eighteen</answer>", "<answer>**18**</answer>", "<answer>2 1/2</answer>"]) \
        == [0.5, 0.5, 0.0]


# --- the time budget and the verdict cache -----------------------------------------------------

def test_symbolic_checks_stop_when_the_batch_budget_is_spent(monkeypatch):
    monkeypatch.setattr("grpo_pipeline.rewards.correctness.SYMBOLIC_BUDGET_S", 0.0)
    symbolic._verdict.cache_clear()
    before = symbolic.skipped_over_budget
    assert score("\\sqrt{1369}", "37") == 0.0  # would be right, but no time was left to prove it
    assert symbolic.skipped_over_budget == before + 1
    monkeypatch.setattr("grpo_pipeline.rewards.correctness.SYMBOLIC_BUDGET_S", 2.0)
    assert score("\\sqrt{1369}", "37") == 2.0  # the skip was not cached as a verdict


def test_symbolic_verdicts_are_cached(monkeypatch):
    symbolic._verdict.cache_clear()
    assert score("\\sqrt{1444}", "38") == 2.0
    monkeypatch.setattr("grpo_pipeline.rewards.correctness.SYMBOLIC_BUDGET_S", 0.0)
    assert score("\\sqrt{1444}", "38") == 2.0  # answered from the cache, no budget needed


# --- properties: nothing that hedges or asserts a wrong number is rewarded ---------------------

numbers = st.integers(min_value=0, max_value=10**6)
subjects = st.sampled_from(["The total", "So the answer", "Therefore, the number of apples", "She", "It",
                            "The farmer's profit", "总数"])
hedges = st.sampled_from(["{a} or {b}", "either {a} or {b}", "{a}, {b}", "{a} and {b}", "{a}/{b} maybe",
                          "maybe {a}", "perhaps {a}", "it could be {a}", "between {a} and {b}", "{a} or maybe {b}",
                          "{a}; or {b}", "{a} but possibly {b}", "{a} (or {b})", "**{a}** or **{b}**",
                          "{a} 或 {b}", "可能是{a}", "\\boxed{{{a}}} or \\boxed{{{b}}}",
                          "$\\boxed{{{a}}}$, $\\boxed{{{b}}}$",
                          "at most {a}", "up to {a}", "{a}, not sure"])


@settings(max_examples=300, deadline=None)
@given(a=numbers, b=numbers, subject=subjects, hedge=hedges, verb=st.sampled_from(["is", "was", "=", "equals"]))
def test_hedges_and_alternative_lists_are_never_rewarded(a, b, subject, hedge, verb):
    assume(a != b)
    phrase = hedge.format(a=a, b=b)
    for text in (phrase, f"{subject} {verb} {phrase}.", f"The answer is {phrase}", f"\\boxed{{{phrase}}}"):
        assert score(text, str(a)) == 0.0, text
        assert score(text, str(b)) == 0.0, text


@settings(max_examples=300, deadline=None)
@given(a=numbers, b=numbers, c=numbers, op=st.sampled_from(["+", "-", "*"]))
def test_a_sentence_never_scores_a_number_it_does_not_conclude(a, b, c, op):
    """The operands of a calculation and numbers after the conclusion are never the answer."""
    sentence = f"She has {a} {op} {b} = {c} marbles."
    for wrong in {a, b} - {c}:
        assert score(sentence, str(wrong)) == 0.0, (sentence, wrong)
    assert score(sentence, str(c)) == 2.0
    chain = f"It costs {a} {op} {b} = {c} + 1 = {c + 1} dollars."
    for wrong in {a, b, c} - {c + 1}:
        assert score(chain, str(wrong)) == 0.0, (chain, wrong)
    contradiction = f"The total is {a}, not {b}."
    if a != b:
        assert score(contradiction, str(b)) == 0.0
    for system in (f"Let x = {a} and y = {b}.", f"Let x = {a}, y = {b}.", f"So p = {a}; q = {b} in total."):
        if a != b:
            assert score(system, str(a)) == 0.0 and score(system, str(b)) == 0.0, system
    listed = f"He bought {a} pens and {b} pencils."
    if a != b:
        assert score(listed, str(a)) == 0.0 and score(listed, str(b)) == 0.0


@settings(max_examples=200, deadline=None)
@given(a=numbers, b=numbers)
def test_conclusion_rule_returns_nothing_or_the_asserted_number(a, b):
    value = conclusion_value(f"First we find {b} boxes. The shop sold {a} boxes in total.")
    assert value is None
    value = conclusion_value(f"First we find {b} boxes. So the shop sold a total of {a} boxes.")
    assert value == a
    assert not answers_match(f"So the shop sold a total of {a} boxes or {b}.", str(a)) or a == b


# Every alternative of grpo_pipeline.rewards.sentences._HEDGE, placed in a concluding sentence that also carries a context
# number ("After 3 days"), so no single-number rule (UNSURE) or list rule can refuse it first.
SENTENCE_HEDGES = ["the total is maybe {a}", "the total is probably {a}", "the total is {a} or so",
                   "the total is actually {a}", "the total is perhaps {a}", "the total is possibly {a}",
                   "the total is {a}, I guess", "wait, the total is {a}", "the total is {a} instead",
                   "the total is rather {a}", "the total is {a}, not sure", "the total could be {a}",
                   "the total might be {a}", "the total may be {a}", "the total is at most {a}",
                   "the total is at least {a}", "the total is up to {a}", "the total is {a}, but",
                   "the total is {a}, however", "the total is either {a}", "I am unsure: the total is {a}",
                   "总数可能是{a}", "总数大概是{a}", "总数也许是{a}", "总数是{a}，但"]
contexts = st.sampled_from(["After {c} days", "In {c} weeks", "For {c} boxes", "On day {c},"])


@settings(max_examples=200, deadline=None)
@given(a=numbers, c=st.integers(min_value=1, max_value=60), context=contexts, hedge=st.sampled_from(SENTENCE_HEDGES))
def test_a_concluding_sentence_that_hedges_is_never_rewarded_beside_other_numbers(a, c, context, hedge):
    assume(a != c)
    lead = context.format(c=c)
    assert score(f"{lead} the total is {a}.", str(a)) == 2.0  # the same sentence without the hedge is read
    hedged = f"{lead} {hedge.format(a=a)}."
    assert score(hedged, str(a)) == 0.0, hedged
    assert conclusion_value(hedged) is None, hedged
