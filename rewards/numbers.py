"""Reading an answer, rules 4-6 and 8 of rewards/normalize.py: the numbers in a cleaned answer, exactly
(`fractions.Fraction`), and whether it is mathematics; `format_number` writes a value back as canonical text.
"""

from __future__ import annotations

import re
from fractions import Fraction


# Exponents beyond this in "1e400" are left to the symbolic path: Fraction(10**400000) would
# be slow and no grade-school answer needs it.
MAX_EXPONENT = 300


NUMBER = re.compile(
    r"(?P<sign>[-+])?(?=\.?\d)"  # a number starts with a digit (or ".5"); never matches empty
    r"(?P<int>[1-9]\d{0,2}(?:,\d{3})+(?![\d,])|\d{1,3}(?: \d{3})+(?!\d)|\d+)?"
    r"(?P<dec>\.\d+|,\d+(?![\d,]))?"  # ",99" in "1000,99": a decimal comma (rule 8)
    r"(?:[eE](?P<exp>[-+]?\d{1,3})(?!\d))?"
    r"(?:/(?P<den>\d+(?:\.\d+)?))?"
)
# Characters that make the text mathematics rather than a number with words around it.
MATH_CHARS = frozenset("^*×÷√π∞+=<>≤≥≠≈_\\{}|()[]/")


def _is_letter(ch: str) -> bool:
    """Latin or Greek letter: the alphabets variables are written in."""
    return (ch.isascii() and ch.isalpha()) or "\u0370" <= ch <= "\u03ff"


# One-letter units written glued after a number: "5m", "3h", "2L". Not "k" (5k is 5000) and
# none of the letters algebra uses for unknowns.
_UNIT_LETTERS = frozenset("mghsLl")


def glued_single_letter(text: str, index: int, step: int) -> bool:
    """Is there a one-letter run starting at `index` going in direction `step`? (a unit letter
    after the number does not count)."""
    if not (0 <= index < len(text)) or not _is_letter(text[index]):
        return False
    if step > 0 and text[index] in _UNIT_LETTERS:
        return False
    nxt = index + step
    return not (0 <= nxt < len(text) and _is_letter(text[nxt]))


def number_value(match: re.Match[str]) -> Fraction | None:
    int_part, dec, exp, den = match["int"], match["dec"], match["exp"], match["den"]
    if int_part is None and dec is None:
        return None
    if exp is not None and abs(int(exp)) > MAX_EXPONENT:
        return None
    if dec is not None and dec.startswith(","):
        if int_part is None or "," in int_part:
            return None  # "1,234,5": neither reading is safe; leave it to the symbolic path
        dec = "." + dec[1:]
    literal = (int_part or "0").replace(",", "").replace(" ", "") + (dec or "") + (f"e{exp}" if exp else "")
    value = Fraction(literal)
    if den is not None:
        denominator = Fraction(den)
        if denominator == 0:
            return None
        value /= denominator
    return -value if match["sign"] == "-" else value


def read_numbers(text: str) -> tuple[list[Fraction], bool]:
    """All numbers in `text`, and whether anything marks the text as mathematics."""
    values: list[Fraction] = []
    is_math = False
    prose_start = 0
    for match in NUMBER.finditer(text):
        start, end = match.span()
        between = text[prose_start:start]
        prose_start = end
        if any(ch in MATH_CHARS for ch in between):
            is_math = True
        before = start - 1
        if match["sign"] is not None and before >= 0 and (_is_letter(text[before]) or text[before] in "0123456789)]}"):
            is_math = True  # "5-3", "x-3": a binary operator, not a sign
        if glued_single_letter(text, before, -1) or glued_single_letter(text, end, +1):
            is_math = True  # "x2", "2x", "3i", "2π"
        value = number_value(match)
        if value is None:
            is_math = True  # "1/0", "1e999": leave to the symbolic path
        else:
            values.append(value)
    if any(ch in MATH_CHARS for ch in text[prose_start:]):
        is_math = True
    return values, is_math


def strip_lone_brackets(text: str) -> str:
    """"(18)" or "[18]" is just 18; "(1, 2)" stays an interval/point for the symbolic path."""
    if len(text) > 2 and (text[0], text[-1]) in (("(", ")"), ("[", "]")):
        inner = text[1:-1]
        if not any(ch in inner for ch in "()[],;"):
            return inner.strip()
    return text


def format_number(value: Fraction) -> str:
    """Canonical text for an exact number: integers plain, terminating decimals in decimal
    form without trailing zeros, other fractions as "p/q".

    >>> format_number(Fraction(1234)), format_number(Fraction(1, 2)), format_number(Fraction(-1, 3))
    ('1234', '0.5', '-1/3')
    """
    if value.denominator == 1:
        return str(value.numerator)
    rest, twos, fives = value.denominator, 0, 0
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    if rest != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    digits = str(abs(value.numerator) * 10**places // value.denominator).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:].rstrip('0')}"
