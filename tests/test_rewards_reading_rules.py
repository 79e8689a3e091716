"""The reading rules, rule by rule: which number a sentence asserts, where the tags are, what language a text
is in, which answers reach math-verify, and the exact set-up errors the registry and correctness raise.

Each table pairs inputs with exact outputs; most rows come with a near miss of the same shape. Pure Python:
math-verify is never imported here (its checks run with the batch budget already spent, which is observable
as `symbolic.skipped_over_budget`).
"""

from __future__ import annotations

import logging
import sys
import threading
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_pipeline.rewards import (
    answers_match,
    check_reward_weights,
    correctness_reward_func,
    get_reward_funcs,
    numbers_match,
    reference_is_scorable,
    resolve_reward,
    soft_format_reward_func,
    strict_format_reward_func,
    symbolic,
    xmlcount_reward_func,
)
from grpo_pipeline.rewards.language import (
    dominant_script,
    language_consistency,
    language_consistency_reward_func,
    question_text,
    script_counts,
)
from grpo_pipeline.rewards.sentences import after_last_marker, after_single_equals, conclusion_value

KNOWN = ("ours xmlcount, soft_format, strict_format, int, correctness, language_consistency, xmlcount_reward_func, "
         "soft_format_reward_func, strict_format_reward_func, int_reward_func, correctness_reward_func, "
         "language_consistency_reward_func; TRL's (trl/scripts/grpo.py) accuracy_reward, reasoning_accuracy_reward, "
         "think_format_reward, get_soft_overlong_punishment")


# --- sentences: final-answer markers and a single "=" -----------------------------------------------

@pytest.mark.parametrize("text, after", [
    ("Step 5. The answer is 18", "18"),
    ("The answer is: 18", "18"), ("answer is: . 18", "18"), ("答案是，18", "18"),  # separating punctuation
    ("The answer is -3", "-3"),  # a sign is kept
    ("The answer is .5", ".5"), ("The final answer is: .75.", ".75."),  # so is the point of a decimal
    ("answer: 3, then the answer is 18 apples", "18 apples"),  # the last marker
    ("The answer is ", "The answer is "), ("no marker 18", "no marker 18"),  # nothing after it: the whole text
])
def test_after_last_marker(text, after):
    assert after_last_marker(text) == after


@pytest.mark.parametrize("text, after", [
    ("5 + 13 = 18", "18"), ("x =: 18", "18"), ("x = .5", ".5"), ("x = -3", "-3"),
    ("x = 5, y = 3", "x = 5, y = 3"),  # two "=": a system, kept whole
    ("x <= 5", "x <= 5"), ("x == 5", "x == 5"),  # no lone "="
    ("18 =", "18 ="),  # nothing after it
])
def test_after_single_equals(text, after):
    assert after_single_equals(text) == after


@pytest.mark.parametrize("answer, reference, reward", [
    ("The answer is .5", "0.5", 2.0), ("The answer is .5", "5", 0.0),
    ("x = .25", "1/4", 2.0), ("x = .25", "25", 0.0),
])
def test_a_decimal_point_after_a_marker_is_part_of_the_number(answer, reference, reward):
    completion = f"<reasoning>r</reasoning><answer>{answer}</answer>"
    assert correctness_reward_func(completions=[completion], answer=[reference]) == [reward]


# --- sentences.conclusion_value -----------------------------------------------------------------

@pytest.mark.parametrize("sentence, value", [
    # a "=" after "x = 5," starts a second equation only when a bare variable follows the LAST comma
    ("x = 5, 3, y = 2", None),
    ("x =5, y = 3", None),  # the comma right after the first "="'s value
    ("x = 5,y = 3", None),  # no space after the comma
    ("= 5, y = 3", None),  # the first "=" opens the sentence
    ("x = 5 and y = 3", None), ("x = 5; y = 3", None),
    # a chain without a comma, or a comma followed by a calculation, reads the right-hand end
    ("x = y = 3", Fraction(3)),
    ("x = 8, the longer piece is 4*8 = 32", Fraction(32)),
])
def test_an_equals_sign_that_starts_a_second_equation_reads_nothing(sentence, value):
    assert conclusion_value(sentence) == value


@pytest.mark.parametrize("sentence, value", [
    ("Therefore 18 apples.", Fraction(18)),
    ("Thus 5 boxes and 5 bags.", Fraction(5)),  # the same number twice
    ("Therefore 5 apples, 5 pears.", Fraction(5)),
    ("Thus 5 boxes and 6 bags.", None),  # two different numbers
    ("So 18 + 2 apples.", None),  # mathematics
    ("The garden has 12 rows.", None),  # no cue and no concluding opener
])
def test_a_concluding_sentence_without_a_cue_reads_its_one_number(sentence, value):
    assert conclusion_value(sentence) == value


@pytest.mark.parametrize("sentence, value", [
    ("The total is 5x.", None), ("The total is x5.", None),  # a variable glued on either side
    ("The total is m5.", None),  # a unit letter counts only AFTER the number
    ("The price is Rs5.", Fraction(5)),  # a word (two letters or more) glued before is no variable
    ("The rope is 5m.", Fraction(5)), ("The rope is 5cm.", Fraction(5)),  # units after the number
])
def test_a_letter_glued_to_the_asserted_number(sentence, value):
    assert conclusion_value(sentence) == value


@pytest.mark.parametrize("sentence, value", [
    ("The share is 1/2.", Fraction(1, 2)),  # the "/" of the number itself is no operator
    ("The share is 1/2 cup for 3 days.", Fraction(1, 2)),
    ("Ana swims a total of 840 laps during the 60 days.", Fraction(840)),
    ("The total is $6 for 2 tubs and 4 packets.", Fraction(6)),
    ("It is 5 and 5.", Fraction(5)),
    ("It is 5 * 5.", None), ("It is 35 + 2.", None),  # an operator after the number
    ("It is 5, not 6.", None),  # a different number outside a prepositional phrase
    ("The value is 5 = x.", None), ("The value is 5 = x = y.", None),  # "=" with no number after it
])
def test_later_numbers_after_the_asserted_one(sentence, value):
    assert conclusion_value(sentence) == value


# --- symbolic.symbolic_equal: what reaches math-verify ------------------------------------------

@pytest.fixture
def spent_budget(monkeypatch):
    """Run with the batch's math-verify budget already spent: a pair that reaches math-verify scores False
    and adds one to `skipped_over_budget`; the returned function gives the count since the start."""
    symbolic._verdict.cache_clear()
    monkeypatch.setattr(symbolic, "_warned_over_budget", True)
    start = symbolic.skipped_over_budget
    with symbolic.time_budget(-1.0):
        yield lambda: symbolic.skipped_over_budget - start


@pytest.mark.parametrize("pred_chars, ref_chars, reaches", [
    (300, 5, True), (5, 300, True), (301, 5, False), (5, 301, False),
    (0, 5, False), (5, 0, False), (0, 0, False),
])
def test_only_nonempty_answers_up_to_300_characters_reach_math_verify(spent_budget, pred_chars, ref_chars, reaches):
    assert symbolic.symbolic_equal("7" * pred_chars, "8" * ref_chars) is False
    assert spent_budget() == (1 if reaches else 0)


@pytest.mark.parametrize("pred, ref", [("", ""), ("", "3"), ("9" * 301, "9" * 301)])
def test_empty_or_overlong_answers_never_match_symbolically(pred, ref):
    assert symbolic.symbolic_equal(pred, ref) is False


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def symbolic_warnings():
    handler = _Records()
    log = logging.getLogger("grpo_pipeline.rewards.symbolic")
    log.addHandler(handler)
    try:
        yield handler.messages
    finally:
        log.removeHandler(handler)


def test_a_spent_budget_is_warned_about_once_per_process(spent_budget, symbolic_warnings, monkeypatch):
    monkeypatch.setattr(symbolic, "_warned_over_budget", False)
    assert [symbolic.symbolic_equal(f"\\sqrt{{{n}}}", "3") for n in (9, 10)] == [False, False]
    assert spent_budget() == 2
    assert symbolic_warnings == [
        ("rewards: the batch's time budget for symbolic (math-verify) answer checks is spent; "
         "further new expressions in this batch score as not matching.")]
    assert symbolic._warned_over_budget is True


def test_off_the_main_thread_symbolic_checks_are_skipped_with_one_warning(symbolic_warnings, monkeypatch):
    monkeypatch.setattr(symbolic, "_warned_off_main_thread", False)
    results: list[bool] = []
    pairs = [("", "3"), ("\\sqrt{9}", "3"), ("\\sqrt{16}", "4")]
    worker = threading.Thread(target=lambda: results.extend(symbolic.symbolic_equal(p, r) for p, r in pairs))
    worker.start()
    worker.join()
    assert results == [False, False, False]
    assert symbolic_warnings == [
        ("rewards: symbolic (math-verify) answer checks are skipped off the main thread, "
         "because its time limit uses signal.alarm; such answers score as not matching.")]
    assert symbolic._warned_off_main_thread is True


# --- matching: the decision table and the tolerance ----------------------------------------------

@pytest.mark.parametrize("pred, ref, match, reaches", [
    ("18", "18.0", True, False), ("18", "19", False, False),  # number x number: numbers_match
    ("\\text{apples}", "apples", True, False),  # same text
    ("x^1", "x", False, False), ("apples", "\\sqrt{2}", False, False),  # text on either side: text only
    ("18", "2x+1", False, False), ("2x+1", "18", False, False),  # a free variable never equals a number
    ("18", "\\sqrt{324}", False, True), ("\\sqrt{324}", "18", False, True),  # no variable: math-verify
    ("5 or 18", "18", False, False), ("18", "5 or 18", False, False),  # ambiguous x single value
    ("2, 3", "3, 2", False, True),  # ambiguous x ambiguous: math-verify (as sets)
    ("x+1", "1+x", False, True),  # expression x expression
])
def test_which_answer_pairs_reach_math_verify(spent_budget, pred, ref, match, reaches):
    assert answers_match(pred, ref) is match
    assert spent_budget() == (1 if reaches else 0)


_HALF = Fraction(1, 2)
_NON_INTEGER_EDGE = _HALF - (_HALF * Fraction(1, 10**6) + Fraction(1, 10**9))  # |a - b| == the tolerance
_MIXED_EDGE = 2 - (2 * Fraction(1, 10**12) + Fraction(1, 10**9))
_TINY = Fraction(1, 10**30)


@pytest.mark.parametrize("a, b, match", [
    (_NON_INTEGER_EDGE, _HALF, True), (_NON_INTEGER_EDGE - _TINY, _HALF, False),
    (_HALF, _NON_INTEGER_EDGE, True),
    (_MIXED_EDGE, Fraction(2), True), (_MIXED_EDGE - _TINY, Fraction(2), False),
    # relative: the slack grows with the numbers (1e-6 of a million is 1) ...
    (Fraction("1000000.5"), Fraction("1000000.25"), True),
    # ... and shrinks with them
    (Fraction("0.001"), Fraction("0.0011"), False),
    (Fraction(1, 3), Fraction("0.333333"), True), (Fraction(1, 3), Fraction("0.33333"), False),
])
def test_numbers_match_tolerance_is_relative_and_closed(a, b, match):
    assert numbers_match(a, b) is match


@given(st.fractions(min_value=-10**6, max_value=10**6), st.integers(min_value=1, max_value=10**6))
@settings(max_examples=200, deadline=None)
def test_numbers_match_is_symmetric_and_exact_on_the_boundary(a, scale):
    b = a + Fraction(1, 7 * scale)
    assert numbers_match(a, b) is numbers_match(b, a)
    if a.denominator != 1 and b.denominator != 1:
        edge = Fraction(1, 10**6) * max(abs(a), abs(b)) + Fraction(1, 10**9)
        assert numbers_match(a, b) is (abs(a - b) <= edge)


# --- correctness ---------------------------------------------------------------------------------

@pytest.mark.parametrize("reference, scorable", [
    ("18", True), ("2x+1", True), ("\\sqrt{2}", True), ("\\frac{1}{2}", True), ("(1, 2)", True),
    ("n/a", False), ("18 or 20", False), ("forty two", False), ("", False), (None, False),
])
def test_a_reference_is_scorable_when_it_is_a_number_or_an_expression_with_a_digit(reference, scorable):
    assert reference_is_scorable(reference) is scorable


@pytest.mark.parametrize("answer, message", [
    (None, ("correctness_reward_func needs `answer` (the dataset column with the reference answer, one per "
            "completion); add an 'answer' column to the training dataset.")),
    (["1", "2", "3"], ("correctness_reward_func got 3 values in `answer` for 2 completions; pass one reference "
                       "answer per completion.")),
])
def test_correctness_set_up_errors_say_the_fix(answer, message):
    with pytest.raises(ValueError) as err:
        correctness_reward_func(completions=["<answer>1</answer>", "<answer>2</answer>"], answer=answer)
    assert str(err.value) == message


# --- format --------------------------------------------------------------------------------------

@pytest.mark.parametrize("completion, strict, soft, xmlcount", [
    ("<reasoning>r</reasoning><answer>18</answer>", 0.5, 0.5, 0.5),
    ("<reasoning>r</reasoning><answer>1</answer><reasoning>", 0.0, 0.5, 0.364),  # a stray opener after
    ("<reasoning>r<answer>18</reasoning></answer>", 0.0, 0.0, 0.5),  # the blocks overlap
    ("<reasoning>r</reasoning><answer>18</answer>junk</answer>", 0.0, 0.5, 0.375),  # after the LAST close
    ("<reasoning>r</reasoning><answer>18", 0.0, 0.0, 0.375),  # no close: no trailing penalty
    ("<reasoning>r</reasoning><answer>18</answer>" + "x" * 500, 0.0, 0.5, 0.375),  # the penalty is capped
    ("</answer>", 0.0, 0.0, 0.125),
])
def test_format_rewards_on_repeated_and_misplaced_tags(completion, strict, soft, xmlcount):
    assert strict_format_reward_func([completion]) == [strict]
    assert soft_format_reward_func([completion]) == [soft]
    assert xmlcount_reward_func([completion]) == [xmlcount]


# --- language ------------------------------------------------------------------------------------

_ZH_QUESTION = "小明有几个苹果？"


@pytest.mark.parametrize("completion, score", [
    ("<reasoning>Xiao Ming has apples</reasoning><answer>3</answer>", 0.25),
    ("\n<reasoning>Xiao Ming has apples</reasoning><answer>3</answer>", 0.25),  # the block need not open the text
    # the reasoning block runs from the FIRST opener to the first closer after it
    ("<reasoning>Xiao Ming has apples<reasoning>小明有苹果</reasoning><answer>3</answer>", 0.404321),
    ("<reasoning>小明有苹果</reasoning>Xiao Ming has apples</reasoning><answer>3</answer>", 0.5),
    ("</reasoning><reasoning>Xiao Ming has apples</reasoning><answer>3</answer>", 0.25),  # a closer before it
    ("<reasoning>Xiao Ming<answer>3</answer>", 0.5),  # an unclosed block is not a part
    ("苹 apples bananas", 0.185185),  # neither block: the whole text; rounded to 6 places
])
def test_language_score_reads_the_reasoning_block_and_the_answer(completion, score):
    assert language_consistency(completion, _ZH_QUESTION) == score


@pytest.mark.parametrize("text, counts", [
    ("How many apples?", {"cjk": 0, "latin": 3}),
    ("He has $ab cd$ apples", {"cjk": 0, "latin": 3}),  # maths is blanked
    ("He has $x$ red apples and $y$ pears", {"cjk": 0, "latin": 6}),  # each span ends at its first closer
    ("Note \\(x then $ab cd$ apples", {"cjk": 0, "latin": 3}),  # an unclosed \( does not stop the reading
    ("He paid $5 for apples", {"cjk": 0, "latin": 4}),  # an unclosed $ blanks nothing
    ("\\(a \\(b cd", {"cjk": 0, "latin": 1}),  # the same opener unclosed twice
    ("$$ab$$ and $$cd", {"cjk": 0, "latin": 2}),
])
def test_script_counts_skip_maths_spans(text, counts):
    assert script_counts(text) == counts


def test_script_counts_of_many_unclosed_openers_count_only_the_prose():
    # (how long it takes is a benchmark's business, not a test's: the two mutants that only make this scan
    # quadratic are listed as equivalent in bench/mutants.py)
    assert script_counts("\\(" * 50_000 + " apples") == {"cjk": 0, "latin": 1}


@pytest.mark.parametrize("text, script", [
    ("apples 苹", "cjk"), ("apples pears 苹", "latin"), ("apples 苹果", "cjk"), ("2+3=5", None), (None, None),
])
def test_dominant_script_breaks_a_tie_for_cjk(text, script):
    assert dominant_script(text) == script


@pytest.mark.parametrize("prompt, question", [
    ("<|im_start|>system\nRespond in English<|im_end|>\n<|im_start|>user\n几个？<|im_end|>\n", "几个？"),
    ("<|im_start|>user\nfirst<|im_end|>\n<|im_start|>user\n几个？", "几个？"),  # the last user turn
    ("How many?", "How many?"),  # no ChatML: the prompt itself
    ([{"role": "user", "content": "几个？"}, {"role": "assistant", "content": "Sure"}], "几个？"),  # prefilled reply
    ([{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a"},
      {"role": "user", "content": "几个？"}], "几个？"),
    (None, None),
])
def test_question_text_is_the_last_user_turn(prompt, question):
    assert question_text(prompt) == question


def test_language_reward_holds_a_prefilled_conversation_to_the_users_language():
    prompt = [{"role": "user", "content": "小明有几个苹果？"}, {"role": "assistant", "content": "Let me think in English"}]
    english = "<reasoning>Xiao Ming has apples</reasoning><answer>3</answer>"
    assert language_consistency_reward_func(prompts=[prompt], completions=[english]) == [0.25]


# --- registry ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, message", [
    ("corectness", f"unknown reward 'corectness'; did you mean 'correctness'? known: {KNOWN}; or 'package.module:function' (or package.module.function) for your own."),
    ("  ", f"'  ' is not a reward name; known: {KNOWN}; or 'package.module:function'."),
    ("grpo_pipeline.rewards.registry:REWARD_FUNCS", "'grpo_pipeline.rewards.registry:REWARD_FUNCS' is a dict, not a function."),
    ("grpo_pipeline.rewards.format:soft_format_reward_func:x",  # the module ends at the FIRST colon
     "module 'grpo_pipeline.rewards.format' has no 'soft_format_reward_func:x' (reward 'grpo_pipeline.rewards.format:soft_format_reward_func:x')."),
])
def test_resolve_reward_errors_say_the_fix(name, message):
    with pytest.raises(ValueError) as err:
        resolve_reward(name)
    assert str(err.value) == message


def test_a_plugin_attribute_path_may_be_dotted():
    assert resolve_reward("grpo_pipeline.rewards:format.soft_format_reward_func") is soft_format_reward_func
    assert resolve_reward("grpo_pipeline.rewards.registry:resolve_reward") is resolve_reward


def test_a_plugin_beside_the_command_is_found_without_the_folder_on_sys_path(tmp_path, monkeypatch):
    (tmp_path / "reading_rules_cwd_plugin.py").write_text("def f(prompts, completions, **kw):\n    return [0.25]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "reading_rules_cwd_plugin", raising=False)
    assert resolve_reward("reading_rules_cwd_plugin:f")(prompts=[""], completions=[""]) == [0.25]
    assert sys.path.count(str(tmp_path)) == 1
    monkeypatch.delitem(sys.modules, "reading_rules_cwd_plugin")
    resolve_reward("reading_rules_cwd_plugin:f")
    assert sys.path.count(str(tmp_path)) == 1  # appended once


def test_a_plugin_that_raises_at_import_is_one_message(tmp_path, monkeypatch):
    (tmp_path / "reading_rules_broken_plugin.py").write_text("raise RuntimeError('no config')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "reading_rules_broken_plugin", raising=False)
    with pytest.raises(ValueError) as err:
        resolve_reward("reading_rules_broken_plugin:f")
    assert str(err.value) == ("module 'reading_rules_broken_plugin' (reward 'reading_rules_broken_plugin:f') failed "
                              "while importing: RuntimeError: no config. Fix the module; "
                              "`python -c 'import reading_rules_broken_plugin'` shows the full error.")
    assert err.value.__cause__ is None and err.value.__suppress_context__


class _Nameless:
    """A callable reward without `__name__` (a callable object); its label is its repr."""

    def __init__(self, label):
        self.label = label

    def __repr__(self):
        return f"Nameless({self.label})"

    def __call__(self, prompts=None, completions=None, **kwargs):
        return [0.0 for _ in completions]


def correctness_reward_func_lookalike(prompts=None, completions=None, **kwargs):
    return [0.0 for _ in completions]


correctness_reward_func_lookalike.__name__ = "correctness_reward_func"


def test_rewards_are_told_apart_by_the_name_they_are_logged_under():
    first, second = _Nameless("a"), _Nameless("b")
    named = get_reward_funcs(["int", first])
    assert [f.__name__ for f in named] == ["int_reward_func", "_Nameless"] and named[0] is resolve_reward("int")
    assert named[1](completions=["x", "y"]) == [0.0, 0.0]
    for listed, key in (([first, second], "_Nameless"), ([first, _Nameless("a")], "_Nameless"),
                        (["correctness", correctness_reward_func_lookalike], "correctness_reward_func")):
        with pytest.raises(ValueError) as err:  # TRL would log both under one key, their means mixed
            get_reward_funcs(listed)
        assert str(err.value) == (f"{listed} would all be logged as rewards/{key}/mean; give each its own name "
                                  "(a function's __name__, or load each as 'module:name').")
    with pytest.raises(ValueError) as err:
        get_reward_funcs(["correctness", "correctness_reward_func"])
    assert str(err.value) == ("'correctness_reward_func' and 'correctness' are the same reward "
                              "(correctness_reward_func); list each reward once and give it a weight instead.")


@pytest.mark.parametrize("weights, message", [
    ("12", "expected a list of numbers, got '12'."),
    (b"12", "expected a list of numbers, got b'12'."),
    ({1.0, 2.0}, "expected a list of numbers, got {1.0, 2.0}."),  # a set has no order
    ((w for w in (1.0, 2.0)), None),  # a generator: not a list either
    ([1.0, float("nan")], "weight 1 (nan, for 'b') must be a finite number."),
    ([True, 1.0], "weight 0 (True, for 'a') must be a finite number."),
    ([1.0], "1 weights for 2 reward functions ['a', 'b']; give one weight per function (or none for all 1.0)."),
])
def test_reward_weight_errors_say_the_fix(weights, message):
    with pytest.raises(ValueError) as err:
        check_reward_weights(["a", "b"], weights)
    if message is None:
        assert str(err.value).startswith("expected a list of numbers, got <generator object")
    else:
        assert str(err.value) == message


def test_reward_weights_are_floats_in_order():
    assert check_reward_weights(("a", "b"), (2, -0.5)) == [2.0, -0.5]
    assert check_reward_weights(["a"], None) == [1.0]
