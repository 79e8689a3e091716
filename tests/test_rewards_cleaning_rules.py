"""The reading rules of rewards/cleaning.py and rewards/completions.py, checked at the functions themselves.

The end-to-end tests (test_rewards_forms.py and friends) go through `parse_answer`, whose results are
cached, and through tables built at import time; these tests call the rules directly so that every
rule is pinned down on its own: which characters are garbage, which box is the answer, when
"2 1/2" is a mixed number, how scale words multiply, and which message parts are text.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_pipeline.rewards import cleaning, normalize
from grpo_pipeline.rewards.cleaning import (_GARBAGE, _boxed_at, _last_boxed_content, clean_characters,
                              mixed_fraction, simplify_latex, simplify_prose)
from grpo_pipeline.rewards.completions import completion_text, completion_texts
from grpo_pipeline.rewards.extract import extract_xml_answer
from grpo_pipeline.rewards.normalize import normalize_answer, parse_answer


@pytest.fixture(autouse=True)
def _fresh_parse_cache():
    normalize._parse_text.cache_clear()
    yield
    normalize._parse_text.cache_clear()


# --- step 1: the garbage table ---------------------------------------------------------------

BLANKED = [0x00, 0x01, 0x09, 0x0A, 0x0D, 0x1F, 0x7F, 0x80, 0x9F, 0x2028, 0x2029]
DROPPED = [0xFFFD, 0x00AD, 0xFEFF, 0x200B, 0x200D, 0x200F, 0x202A, 0x202C, 0x202E, 0x2060, 0x2066, 0x206F]
# The neighbours of every range: ordinary characters the table must leave alone.
KEPT = [0x20, 0x41, 0x7E, 0xA0, 0xAC, 0xAE, 0x2010, 0x2027, 0x202F, 0x205F, 0x2070, 0xFEFE, 0xFF00, 0xFFFC, 0xFFFE]


@pytest.mark.parametrize("cp", BLANKED, ids=hex)
def test_control_characters_and_line_separators_become_a_space(cp):
    assert f"1{chr(cp)}2".translate(_GARBAGE) == "1 2"


@pytest.mark.parametrize("cp", DROPPED, ids=hex)
def test_invisible_characters_are_dropped(cp):
    assert f"1{chr(cp)}2".translate(_GARBAGE) == "12"


@pytest.mark.parametrize("cp", KEPT, ids=hex)
def test_characters_next_to_the_garbage_ranges_are_kept(cp):
    assert f"1{chr(cp)}2".translate(_GARBAGE) == f"1{chr(cp)}2"


def test_the_garbage_table_holds_exactly_the_listed_ranges():
    table = _GARBAGE
    blanked = {*range(0x00, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029}
    dropped = {0xFFFD, 0x00AD, 0xFEFF, *range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2060, 0x2070)}
    assert set(table) == blanked | dropped
    assert {cp for cp, to in table.items() if to == " "} == blanked
    assert {cp for cp, to in table.items() if not to} == dropped
    assert table == cleaning._GARBAGE


@pytest.mark.parametrize("text, expected", [
    ("1\u20282", "1 2"), ("1\u20292", "1 2"), ("1\x002", "1 2"), ("1\x7f2", "1 2"), ("1\x852", "1 2"),
    ("1\u200b8", "18"), ("1\ufffd8", "18"), ("1\u00ad8", "18"), ("\ufeff18", "18"), ("1\u202e8", "18"),
])
def test_clean_characters_blanks_controls_and_drops_invisibles(text, expected):
    assert clean_characters(text) == expected


# --- step 2: the box ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, start, expected", [
    ("\\boxed{18}", 0, ("18", 0, 10)),
    ("\\fbox{18}", 0, ("18", 0, 9)),
    ("x = \\boxed{18}.", 4, ("18", 4, 14)),
    ("\\boxed {18}", 0, ("18", 0, 11)),  # a space between the command and its brace
    ("{a} \\boxed{1}", 4, ("1", 4, 13)),  # a brace before the box is not its brace
    ("\\boxed{\\frac{1}{2}} more", 0, ("\\frac{1}{2}", 0, 19)),  # braces balance
    ("\\boxed{18", 0, ("18", 0, 9)),  # unclosed: the rest of the text
    ("\\boxed{{1}", 0, ("{1}", 0, 10)),
    ("\\boxed{}", 0, ("", 0, 8)),
])
def test_boxed_at_reads_the_brace_balanced_content(text, start, expected):
    assert _boxed_at(text, start) == expected


@pytest.mark.parametrize("text, start", [
    ("no box", -1),
    ("\\boxed", 0),  # no brace at all
    ("\\boxed x", 0),
    ("\\boxed 18", 0),
    ("\\boxed 5 {x}", 0),  # the next brace belongs to something else
    ("\\boxedx{1}", 0),
    ("{", -1),
    ("a{", -1),
])
def test_boxed_at_gives_none_without_a_box_command_before_the_brace(text, start):
    assert _boxed_at(text, start) is None


@settings(max_examples=60, deadline=None)
@given(prefix=st.text(alphabet="ab 1{}", max_size=8), content=st.text(alphabet="xy 12+", max_size=8),
       suffix=st.text(alphabet="ab 1{}", max_size=8), command=st.sampled_from(["\\boxed", "\\fbox"]))
def test_boxed_at_returns_the_content_and_its_span(prefix, content, suffix, command):
    text = f"{prefix}{command}{{{content}}}{suffix}"
    end = len(prefix) + len(command) + len(content) + 2
    assert _boxed_at(text, len(prefix)) == (content, len(prefix), end)


@pytest.mark.parametrize("text, expected", [
    ("\\boxed{18}", "18"),
    ("x \\boxed{18}", "18"),
    ("First \\boxed{5}, then \\boxed{18}", "18"),  # far apart: the last box is the answer
    ("\\boxed{18} or \\boxed{20}", "18 or 20"),
    ("\\boxed{18}or\\boxed{20}", "18 or 20"),
    ("\\boxed{18}, \\boxed{18}", "18"),  # the same box twice is no alternative
    ("\\boxed{1}, \\boxed{2} or \\boxed{3}", "2 or 3"),  # the box just before the last one
    ("\\fbox{7} / \\boxed{8}", "7 or 8"),
    ("\\boxed 5", None),
    ("no box here", None),
])
def test_last_boxed_content(text, expected):
    assert _last_boxed_content(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("The answer is \\boxed{18}", "18"),
    ("\\boxed{\\frac{1}{2}}", "1/2"),
    ("\\boxed{18} or \\boxed{20}", "18 or 20"),
    ("$x = \\boxed{42}$", "42"),
])
def test_simplify_latex_keeps_the_box(text, expected):
    assert simplify_latex(text) == expected


# --- mixed numbers -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("2 1/2", "5/2"), ("10 3/4", "43/4"), ("0 1/3", "1/3"), ("1 2/3 cups", "5/3 cups"),
    ("2 0/3", "2 0/3"), ("2 3/3", "2 3/3"), ("2 4/3", "2 4/3"), ("2   4/3", "2 4/3"),
    ("1,5 1/2", "1,5 1/2"), ("1/2 1/2", "1/2 1/2"),
])
def test_mixed_numbers_in_prose(text, expected):
    assert simplify_prose(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("2\\frac{1}{2}", "5/2"), ("2 \\frac12", "5/2"), ("3\\dfrac{1}{4}", "13/4"), ("3 \\tfrac{ 2 }{ 5 }", "17/5"),
    ("2\\frac{3}{2}", "2 3/2"), ("2\\frac32", "2 3/2"), ("2\\frac{0}{5}", "2 0/5"), ("2\\frac{2}{2}", "2 2/2"),
])
def test_mixed_numbers_in_latex(text, expected):
    assert simplify_latex(text) == expected


@pytest.mark.parametrize("regex, text, expected", [
    (cleaning._MIXED_NUMBER, "2 1/2", "5/2"),
    (cleaning._MIXED_NUMBER, "2   4/3", "2 4/3"),
    (cleaning._MIXED_LATEX, "2\\frac{1}{2}", "5/2"),
    (cleaning._MIXED_LATEX, "2\\frac12", "5/2"),
    (cleaning._MIXED_LATEX, "2  \\frac{3}{2}", "2 \\frac{3}{2}"),
    (cleaning._MIXED_LATEX, "2\\frac32", "2 \\frac32"),
])
def test_mixed_fraction_rewrites_one_match(regex, text, expected):
    assert mixed_fraction(regex.search(text)) == expected


@settings(max_examples=80, deadline=None)
@given(whole=st.integers(0, 999), num=st.integers(0, 60), den=st.integers(1, 60))
def test_a_mixed_number_is_its_whole_plus_a_proper_fraction(whole, num, den):
    for text in (f"{whole} {num}/{den}", f"{whole}\\frac{{{num}}}{{{den}}}"):
        read = simplify_latex(text) if "\\" in text else simplify_prose(text)
        if 0 < num < den:
            assert read == f"{whole * den + num}/{den}"
            assert Fraction(read) == whole + Fraction(num, den)
        else:
            assert read == f"{whole} {num}/{den}"


@pytest.mark.parametrize("text", ["2\\frac{3}{2}", "$2\\frac{0}{5}$", "2\\frac32"])
def test_an_improper_mixed_number_is_never_read_as_one_glued_number(text):
    assert parse_answer(text).kind == "ambiguous"
    assert normalize_answer(text) not in ("11.5", "4")


# --- a whole number and a fraction in words ----------------------------------------------------------------

_FRACTIONS = {"a half": Fraction(1, 2), "one half": Fraction(1, 2), "a third": Fraction(1, 3),
              "two thirds": Fraction(2, 3), "a quarter": Fraction(1, 4), "three quarters": Fraction(3, 4),
              "one fourth": Fraction(1, 4), "an half": Fraction(1, 2), "two halves": Fraction(1)}


@settings(max_examples=120, deadline=None)
@given(whole=st.integers(0, 10**6), words=st.sampled_from(sorted(_FRACTIONS)),
       form=st.sampled_from(["{n} and {w}", "{n} And {w} hours", "It took {n} and {w} days.",
                             "The answer is {n} and {w}.", "{n} AND {W}", "{n}个半", "{n}个半小时", "{n}又1/2"]))
def test_a_whole_number_and_a_fraction_in_words_is_one_number_never_the_whole_alone(whole, words, form):
    """"2 and a half hours" is 2.5: read as 2 it was rewarded against a reference of 2. As a prediction and as a
    reference, whatever the case, the words around it and the language ("2个半" = 2.5, "2又1/2" = 5/2)."""
    from grpo_pipeline.rewards.matching import answers_match

    text = form.format(n=whole, w=words, W=words.upper())
    value = whole + (Fraction(1, 2) if "半" in form or "又" in form else _FRACTIONS[words])
    for prediction in (True, False):
        parsed = parse_answer(text, prediction=prediction)
        assert parsed.kind == "number" and parsed.value == value, (text, prediction)
    if value != whole:
        assert not answers_match(text, str(whole)) and not answers_match(str(whole), text)
    assert answers_match(text, str(value.numerator / value.denominator if value.denominator in (2, 4)
                                   else f"{value.numerator}/{value.denominator}"))


@pytest.mark.parametrize("text", ["Tom and a half", "2 and 1/2", "2,5 and a half", "1/2 and a half", "两个半",
                                  "2 and a halfway point", "2.5 and a half"])
def test_a_fraction_word_not_after_a_whole_number_is_left_as_it_is(text):
    assert simplify_prose(text) == " ".join(text.split())


# --- scale words -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("1.2 million", "1200000"), ("2 Thousand", "2000"), ("3 Billion", "3000000000"), ("3 BILLION", "3000000000"), ("2 THOUSAND", "2000"), ("0.5 thousand", "500"),
    ("12thousand", "12000"), ("1.25 million people", "1250000 people"), ("2.5 billion", "2500000000"),
])
def test_scale_words_multiply_the_number(text, expected):
    assert simplify_prose(text) == expected


# --- completions ---------------------------------------------------------------------------------

@pytest.mark.parametrize("completion, expected", [
    ({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, "ab"),
    ({"content": [{"type": "image"}, {"type": "text", "text": "18"}]}, "18"),
    ({"content": ["raw", {"type": "text", "text": "18"}]}, "18"),
    ({"content": [{"type": "text", "text": 18}, {"type": "text", "text": "x"}]}, "x"),
    ({"content": [{"type": "image"}]}, None),
    ({"content": []}, None),
    ({"content": ["raw"]}, None),
    ([{"role": "assistant", "content": ({"text": "1"}, {"text": "2"})}], "12"),
    ([{"role": "assistant", "content": [{"type": "image"}]}], None),
    ([{"role": "tool", "content": [{"text": "7"}]}, {"role": "user", "content": [{"type": "image"}]}], "7"),
])
def test_message_content_parts_are_joined_text_parts_only(completion, expected):
    assert completion_text(completion) == expected


def test_completion_texts_reads_every_shape():
    assert completion_texts([{"content": [{"text": "a"}, {"text": "b"}]}, {"content": [{"type": "x"}]}]) \
        == ["ab", None]


# --- normalize_answer ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("1,234", "1234"), ("5 apples and 18 pears", "5 apples and 18 pears"), ("\\sqrt{2}", "\\sqrt{2}"),
    ("Monday", "Monday"), ("2 1/2", "2.5"),
])
def test_normalize_answer_gives_a_number_only_for_numbers(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize("completion, expected", [
    ([{"role": "assistant", "content": "18"}, {"role": "user", "content": "and now?"}], "18"),
    ([{"role": "assistant", "content": "5"}, {"role": "tool", "content": "x"}, {"role": "assistant", "content": "18"},
      {"role": "user", "content": "ok"}], "18"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "7"}], "7"),  # no assistant: the last text
])
def test_the_last_assistant_message_wins_over_later_turns(completion, expected):
    assert completion_text(completion) == expected


def test_role_picks_the_last_message_of_that_role():
    messages = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"},
                {"role": "assistant", "content": "b"}]
    assert completion_text(messages, role="user") == "q2"
    assert completion_text(messages, role="assistant") == completion_text(messages) == "b"


# --- extract_xml_answer ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("<answer>18</answer> more </answer>", "18"),  # the first closing tag after the last <answer>
    ("<answer>5</answer><answer> 18 </answer> </answer>", "18"),
    ("<answer>64</\n", "64"),  # a cut closing tag followed by whitespace
    ("<answer>64</ans  \n", "64"),
    ("<answer>\n 64 </answer", "64"),
    ("<answer>64 <", "64 <"),  # one "<" is not a closing tag yet
    ("<answer>a</b", "a</b"),
])
def test_extract_xml_answer_ends_at_the_first_closing_tag_or_a_cut_one(text, expected):
    assert extract_xml_answer(text) == expected


# --- clean_characters, simplify_latex, simplify_prose: each rewrite exactly -----------------------

def test_terminal_colour_codes_are_removed():
    assert clean_characters("\x1b[31m18\x1b[0m") == "18"
    assert clean_characters("\x1b[1;32manswer\x1b[0m: 7") == "answer: 7"


@pytest.mark.parametrize("text, expected", [
    ("1{,}234", "1,234"), ("90°", "90"), ("5~cm", "5 cm"), ("$18", "18"), ("\\$18", "18"), ("50\\%", "50%"),
    ("\\text{18}", "18"), ("\\textbf{18} apples", "18 apples"), ("\\text{\\text{\\text{18}}}", "18"),
    ("\\text{\\text{\\text{\\text{18}}}}", "\\text{ 18 }"),  # three levels of wrappers are unwrapped, no more
    ("90^\\circ", "90"), ("90^{\\circ}", "90"), ("\\frac{3}{4}", "3/4"), ("\\dfrac34", "3/4"),
    ("11,\\! 111", "11,111"), ("\\left( 2 \\right)", "( 2 )"), ("x \\approx 3", "x ≈ 3"),
    ("a  b", "a  b"), ("plain  text 18", "plain  text 18"),  # nothing LaTeX-like: returned as is
])
def test_simplify_latex_rewrites(text, expected):
    assert simplify_latex(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("\\boxed{5}. The answer is \\boxed{18}", "18"),  # the marker is before the last box: the box is the answer
    ("\\boxed{5}. The answer is 18", "\\boxed{5}. The answer is 18"),  # a marker after the box restates the answer
])
def test_a_final_marker_after_the_last_box_keeps_the_whole_text(text, expected):
    assert simplify_latex(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("**18**", "18"), ("__18__", "18"), ("a_b", "a_b"), ("x*y", "x*y"), ("56 (roughly)", "56"),
    ("f(x)", "f(x)"), ("90 km/h", "90 km"), ("60 km / h", "60 km"), ("$22/hour", "$22"), ("15/x", "15/x"),
    ("36 m^2", "36 m"), ("36 x^2", "36 x^2"), ("x = 1/3 ≈ 0.33", "x = 1/3"), ("x ≈ 11", "x = 11"),
    ("a  b", "a b"),
])
def test_simplify_prose_rewrites(text, expected):
    assert simplify_prose(text) == expected


# --- the answer window -----------------------------------------------------------------------------

MAX = normalize.MAX_ANSWER_CHARS


def test_an_answer_of_exactly_the_cap_is_read_whole():
    text = "18" + " " * (MAX - 2)
    assert normalize._prediction_window(text) == text
    assert parse_answer(text).value == 18 and parse_answer(text, prediction=True).value == 18
    assert parse_answer(text + " ") is None  # one over the cap: a reference is not read


def test_a_long_answer_without_marker_or_box_is_read_at_its_tail_cut_after_a_space():
    tail = "a " + "b" * (MAX - 4) + " 7"
    assert len(tail) == MAX
    assert normalize._prediction_window("q" * 500 + tail) == "b" * (MAX - 4) + " 7"
    assert normalize._prediction_window("q" * 500 + "c" * MAX) == "c" * MAX  # no space: the tail as is


def test_a_long_answer_is_read_from_its_last_marker_or_box():
    filler = "z " * 600
    marked = "The answer is 18. " + filler
    assert normalize._prediction_window(marked) == marked[len("The "):][:MAX]
    boxed = "\\boxed{1} " + filler + "\\boxed{2} end"
    assert normalize._prediction_window(boxed) == "\\boxed{2} end"
    both = "The answer is 3. " + filler + "\\boxed{4} " + filler
    assert normalize._prediction_window(both) == both[both.index("\\boxed{4}"):][:MAX]


def test_a_chat_template_token_ends_the_window():
    assert normalize._prediction_window("18 <|im_end|> 20") == "18 "
    assert normalize._prediction_window("18. I hope it is correct. 20") == "18. "


@pytest.mark.parametrize("text, value", [("3 MILLION", 3_000_000), ("3 Million", 3_000_000), ("4 THOUSAND", 4000)])
def test_a_scale_word_in_capitals_is_never_dropped(text, value):
    assert parse_answer(text).value == value


@pytest.mark.parametrize("padding", [" " * 999, "\n" * 1500, " \t" * 2000])
def test_trailing_whitespace_never_pushes_the_answer_out_of_the_window(padding):
    from grpo_pipeline.rewards.normalize import parse_answer

    parsed = parse_answer("The total is 18" + padding, prediction=True)
    assert parsed is not None and parsed.value == 18
