"""The number rules underneath the answer reader, called directly: number words (rewards/number_words.py)
and numbers, glued letters and canonical number text (rewards/numbers.py).

The reader's entry point caches its verdicts (normalize._parse_text is an lru_cache), so these tests call
the rules themselves: every case here runs the rule, whatever ran before it in the same process.
"""

from __future__ import annotations

import sys
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_pipeline.rewards.number_words import number_words_to_digits
from grpo_pipeline.rewards.numbers import NUMBER, format_number, glued_single_letter, number_value, read_numbers, strip_lone_brackets


# --- number words: English -----------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("zero", "0"), ("nine", "9"), ("eighteen", "18"), ("forty-two", "42"), ("twenty three", "23"),
    ("Twenty-Three", "23"), ("EIGHTEEN", "18"), ("twenty zero", "20"), ("ninety-nine", "99"),
    ("hundred", "100"), ("one hundred", "100"), ("one hundred and five", "105"), ("one hundred twenty five", "125"),
    ("twenty five hundred", "2500"), ("thousand", "1000"), ("two thousand", "2000"), ("two thousand five", "2005"),
    ("two thousand three hundred forty-five", "2345"), ("hundred thousand", "100000"),
    ("one million two hundred thousand five", "1200005"), ("three billion", "3000000000"),
    ("The answer is eighteen apples.", "The answer is 18 apples."), ("a hundred", "a 100"),
    ("one, two", "1, 2"), ("one or two", "1 or 2"),
])
def test_english_number_words_become_their_digits(text, expected):
    assert number_words_to_digits(text) == expected


@pytest.mark.parametrize("text", [
    "three twenty", "five six", "one two three", "nineteen eighty-four", "ten five", "twenty ten",
    "twenty-five six", "one hundred twelve three", "eleven twenty", "five zero",
])
def test_english_words_that_are_not_one_number_are_left_unread(text):
    assert number_words_to_digits(text) == text


def _english(n: int, hyphen: bool, and_: bool) -> str:
    small = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
             "sixteen seventeen eighteen nineteen").split()
    tens = "twenty thirty forty fifty sixty seventy eighty ninety".split()

    def below_thousand(k: int) -> list[str]:
        words = []
        if k >= 100:
            words += [small[k // 100], "hundred"] + (["and"] if and_ and k % 100 else [])
            k %= 100
        if k >= 20:
            words.append(tens[k // 10 - 2] + ((("-" if hyphen else " ") + small[k % 10]) if k % 10 else ""))
        elif k or not words:
            words.append(small[k])
        return words

    if n == 0:
        return "zero"
    words: list[str] = []
    for scale, name in ((10**9, "billion"), (10**6, "million"), (10**3, "thousand"), (1, "")):
        group = n // scale % 1000
        if group:
            words += below_thousand(group) + ([name] if name else [])
    return " ".join(words)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**12 - 1), st.booleans(), st.booleans())
def test_any_number_below_a_trillion_written_in_english_words_reads_back(n, hyphen, and_):
    assert number_words_to_digits(_english(n, hyphen, and_)) == str(n)


# --- number words: Chinese -----------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("零", "0"), ("九", "9"), ("十", "10"), ("十八", "18"), ("一十八", "18"), ("二十", "20"), ("二十三", "23"),
    ("一百", "100"), ("一百二十", "120"), ("一百零五", "105"), ("两千", "2000"), ("一千二百", "1200"),
    ("一万", "10000"), ("三万", "30000"), ("十万", "100000"), ("二十万", "200000"), ("三万五千", "35000"),
    ("一万零一", "10001"), ("一亿", "100000000"), ("一亿五千万", "150000000"), ("两亿三千万", "230000000"),
    ("一亿零五万", "100050000"), ("〇", "0"),
    ("答案是十八个", "答案是18个"), ("二十个苹果", "20个苹果"),
])
def test_chinese_number_words_become_their_digits(text, expected):
    assert number_words_to_digits(text) == expected


@pytest.mark.parametrize("text", ["十五六", "三四十", "两三", "一二三", "二〇二四", "五零", "七八十个"])
def test_chinese_digits_in_a_row_are_a_range_and_left_unread(text):
    assert number_words_to_digits(text) == text


_ZH_DIGITS = "零一二三四五六七八九"


def _chinese(n: int, two: str) -> str:
    def section(k: int) -> str:  # 1..9999
        out, zero, started = "", False, False
        for digit, unit in ((k // 1000, "千"), (k // 100 % 10, "百"), (k // 10 % 10, "十"), (k % 10, "")):
            if digit:
                out += ("零" if zero else "") + (two if digit == 2 and unit else _ZH_DIGITS[digit]) + unit
                zero, started = False, True
            elif started:
                zero = True
        return out

    if n == 0:
        return "零"
    out = ""
    for scale, name in ((10**8, "亿"), (10**4, "万"), (1, "")):
        group = n // scale % 10**4
        if group:
            out += ("零" if out and group < 1000 else "") + section(group) + name
        elif out and not out.endswith("零"):
            out += "零"
    return out.rstrip("零")


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**12 - 1), st.sampled_from("二两"))
def test_any_number_below_a_trillion_written_in_chinese_reads_back(n, two):
    assert number_words_to_digits(_chinese(n, two)) == str(n)


# --- number words: what is never read ----------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    # a word the reader does not understand leaves that language's words unread, and only that language's
    ("eighteen and a half", "eighteen and a half"), ("minus five", "minus five"), ("three point five", "three point five"),
    ("two dozen", "two dozen"), ("二十点五", "二十点五"), ("负七", "负七"), ("十多", "十多"), ("三分之一", "三分之一"),
    ("half of 十八", "half of 18"), ("负 eighteen", "负 18"), ("几 twenty", "几 20"), ("a third of 一百", "a third of 100"),
    # any digit in the text: words are left alone
    ("eighteen 18", "eighteen 18"), ("一共120元", "一共120元"), ("each one costs 5", "each one costs 5"),
])
def test_number_words_the_reader_cannot_read_safely_stay_words(text, expected):
    assert number_words_to_digits(text) == expected


# --- numbers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("18", Fraction(18)), ("-3", Fraction(-3)), (".5", Fraction(1, 2)), ("-.5", Fraction(-1, 2)),
    ("2.75", Fraction(11, 4)), ("1,234", Fraction(1234)), ("1 234", Fraction(1234)), ("1,234.5", Fraction(2469, 2)),
    ("1000,99", Fraction(100099, 100)), ("12,5", Fraction(25, 2)), ("1 234,5", Fraction(2469, 2)),
    ("1e3", Fraction(1000)), ("2.5E-2", Fraction(1, 40)), ("1e300", Fraction(10**300)), ("1e-300", Fraction(1, 10**300)),
    ("3/4", Fraction(3, 4)), ("1/2.5", Fraction(2, 5)), ("-6/4", Fraction(-3, 2)),
    ("1e301", None), ("1e-301", None), ("1/0", None), ("5/0.0", None),
])
def test_number_literals_are_read_exactly(text, value):
    match = NUMBER.fullmatch(text)
    assert match is not None
    assert number_value(match) == value


@pytest.mark.parametrize("text, values, is_math", [
    ("answer -5", [Fraction(-5)], False), ("costs $-5", [Fraction(-5)], False), ("3-5", [3, -5], True),
    ("x-3", [Fraction(-3)], True), ("(2)-3", [2, -3], True),
    ("x2", [2], True), ("2x", [2], True), ("3i", [3], True), ("2π", [2], True), ("2 x", [2], False),
    ("7m", [7], False), ("3h", [3], False), ("2L", [2], False), ("5cm", [5], False), ("ab2", [2], False),
    ("2xy", [2], False), ("5é", [5], False), ("三-5", [-5], False), ("1e999", [], True),
])
def test_letters_and_signs_next_to_a_number_mark_mathematics(text, values, is_math):
    assert read_numbers(text) == (values, is_math)


@pytest.mark.parametrize("text, values, is_math", [
    # a mathematics character anywhere outside the numbers: before, between or after them
    ("*5", [5], True), ("(5", [5], True), ("5)", [5], True), ("2*3", [2, 3], True), ("2 = 3", [2, 3], True),
    ("2 and 3", [2, 3], False), ("5 apples", [5], False), ("", [], False), ("no numbers", [], False), ("x = y", [], True),
    # a fraction or a sign is part of the number, not an operator
    ("3/4", [Fraction(3, 4)], False), ("+5", [5], False), ("-5 and 3/4", [-5, Fraction(3, 4)], False),
])
def test_mathematics_is_a_math_character_outside_the_numbers(text, values, is_math):
    assert read_numbers(text) == (values, is_math)


@pytest.mark.parametrize("text, expected", [
    ("(18)", "18"), ("[18]", "18"), ("( 18 )", "18"), ("(5)", "5"), ("(X)", "X"), ("[x + 1]", "x + 1"),
    ("()", "()"), ("[]", "[]"), ("(", "("), ("18", "18"), ("(18", "(18"), ("18)", "18)"), ("(18]", "(18]"), ("{18}", "{18}"),
    ("(1, 2)", "(1, 2)"), ("[1; 2]", "[1; 2]"), ("((18))", "((18))"), ("(1)(2)", "(1)(2)"), ("[1]+[2]", "[1]+[2]"),
])
def test_only_a_lone_bracketed_term_loses_its_brackets(text, expected):
    assert strip_lone_brackets(text) == expected


@pytest.mark.parametrize("letter, glued", [
    ("x", True), ("a", True), ("Z", True), ("k", True), ("\u0370", True), ("π", True), ("\u03ff", True),
    ("m", False), ("g", False), ("h", False), ("s", False), ("L", False), ("l", False),  # unit letters
    ("\u036f", False), ("\u0400", False), ("é", False), ("三", False), ("_", False), ("5", False), (" ", False),
])
def test_a_lone_latin_or_greek_letter_after_a_number_is_glued_unless_a_unit(letter, glued):
    assert glued_single_letter(f"2{letter}", 1, +1) is glued
    assert glued_single_letter(f"2{letter} ", 1, +1) is glued


@pytest.mark.parametrize("text, index, step, glued", [
    ("x2", 0, -1, True), ("m2", 0, -1, True),  # a unit letter only counts after the number
    ("ab2", 1, -1, False), (" b2", 1, -1, True), ("2xy", 1, +1, False), ("2x", 1, +1, True),
    ("2x", 2, +1, False), ("2x", -1, -1, False), ("x2", -1, -1, False), ("2", 1, +1, False),
    ("2 ", 1, +1, False),
])
def test_glued_letter_runs_are_single_letters_inside_the_text(text, index, step, glued):
    assert glued_single_letter(text, index, step) is glued


# --- canonical number text -----------------------------------------------------------------

@pytest.mark.parametrize("value, text", [
    (Fraction(0), "0"), (Fraction(18), "18"), (Fraction(-3), "-3"),
    (Fraction(1, 2), "0.5"), (Fraction(1, 5), "0.2"), (Fraction(1, 4), "0.25"), (Fraction(1, 20), "0.05"),
    (Fraction(1, 8), "0.125"), (Fraction(7, 40), "0.175"), (Fraction(1, 25), "0.04"), (Fraction(25, 2), "12.5"),
    (Fraction(1234, 100), "12.34"), (Fraction(-1, 4), "-0.25"), (Fraction(-5, 2), "-2.5"), (Fraction(3, 3125), "0.00096"),
    (Fraction(1, 3), "1/3"), (Fraction(-1, 3), "-1/3"), (Fraction(1, 6), "1/6"), (Fraction(7, 15), "7/15"),
])
def test_format_number_writes_integers_exact_decimals_and_other_fractions(value, text):
    assert format_number(value) == text
    assert Fraction(text) == value


def test_format_number_writes_decimals_beyond_float_range_exactly():
    assert format_number(Fraction(1, 2**1100)) == "0." + str(5**1100).rjust(1100, "0")
    assert format_number(Fraction(3, 5**500)) == "0." + str(3 * 2**500).rjust(500, "0")


def test_format_number_uses_the_fewest_decimal_places():
    # with one place more than needed, the digits of these would pass Python's int-to-str limit
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
    if not limit:
        pytest.skip("no int-to-str digit limit in this Python")
    assert format_number(Fraction(2 * 10**(limit - 2) + 1, 2)) == "1" + "0" * (limit - 2) + ".5"
    assert format_number(Fraction(5 * 10**(limit - 2) + 1, 5)) == "1" + "0" * (limit - 2) + ".2"


@settings(max_examples=300, deadline=None)
@given(st.integers(-10**6, 10**6), st.integers(0, 12), st.integers(0, 12))
def test_format_number_of_a_terminating_decimal_is_its_shortest_decimal(numerator, twos, fives):
    value = Fraction(numerator, 2**twos * 5**fives)
    text = format_number(value)
    assert Fraction(text) == value
    if value.denominator == 1:
        assert text == str(value.numerator)
    else:
        whole, _, places = text.lstrip("-").partition(".")
        assert whole == str(abs(value.numerator) // value.denominator)
        assert places and not places.endswith("0")
        assert text.startswith("-") == (value < 0)
