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

from rewards import cleaning, normalize
from rewards.cleaning import (_boxed_at, _build_garbage_table, _last_boxed_content, clean_characters,
                              mixed_fraction, simplify_latex, simplify_prose)
from rewards.completions import completion_text, completion_texts
from rewards.normalize import normalize_answer, parse_answer


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
    assert f"1{chr(cp)}2".translate(_build_garbage_table()) == "1 2"


@pytest.mark.parametrize("cp", DROPPED, ids=hex)
def test_invisible_characters_are_dropped(cp):
    assert f"1{chr(cp)}2".translate(_build_garbage_table()) == "12"


@pytest.mark.parametrize("cp", KEPT, ids=hex)
def test_characters_next_to_the_garbage_ranges_are_kept(cp):
    assert f"1{chr(cp)}2".translate(_build_garbage_table()) == f"1{chr(cp)}2"


def test_the_garbage_table_holds_exactly_the_listed_ranges():
    table = _build_garbage_table()
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


# --- scale words -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("1.2 million", "1200000"), ("2 Thousand", "2000"), ("3 Billion", "3000000000"), ("0.5 thousand", "500"),
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
