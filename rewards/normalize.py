"""Read a free-form final answer ("$1,234", "答案：18", "\\boxed{\\frac12}") into a comparable form.

This is the fast path of answer checking: plain string work and a few linear regexes, no
sympy. It classifies an answer as one of

- `number`: exactly one numeric value (possibly repeated) in prose or units, e.g.
  "The answer is 18.", "$18", "18 dollars", "18元", "１８", "1,234", "50%", "\\frac{1}{2}".
- `ambiguous`: two or more *different* numbers and no final-answer marker to pick one,
  e.g. "5 apples and 18 pears". Never accepted as a number (no guessing, no substring match).
- `expression`: looks like mathematics that the numeric reader must not flatten
  ("2x", "\\sqrt{2}", "x^2+1", "(1, 2)"); matching.py hands these to math-verify.
- `text`: no digits and no math at all ("Monday", "A").

Rules, in order (each one is why a notebook reward marked a right answer wrong):

1. Garbage from a collapsing policy is dropped: U+FFFD, zero-width and bidi marks, control
   characters (become spaces). Text is NFKC-normalised, so full-width digits and colons
   ("１８", "：") become ASCII; U+2212 minus becomes "-".
2. LaTeX: the content of the last `\\boxed{}`/`\\fbox{}` is the answer; `$`, `\\(`, `\\)`,
   `\\[`, `\\]` are dropped; `\\text{..}`-style wrappers are unwrapped; `\\frac{a}{b}`,
   `\\dfrac`, `\\tfrac`, `\\frac12` with numeric a, b become `a/b`; `\\%`, `\\$`, `{,}`, `\\,`
   and degree signs are simplified.
3. Final-answer markers: if the text contains "answer is", "answer:", "答案是", "答案为",
   "答案：" or "答：", only what follows the *last* marker is read; then, if exactly one "="
   is left, only what follows it. That is the "one final number" rule: "5 + 13 = 18" and
   "He has 5, so the answer is 18" read as 18. Without a marker, a sentence is a number only
   if all its numbers are equal; "5 apples and 18 pears" is ambiguous and never accepted.
4. Numbers: thousands separators are "," or a space between groups of exactly three digits
   ("1,234", "1 234"); decimals, a/b fractions and e-notation are read exactly as
   `fractions.Fraction`. Currency and unit words around the number are ignored ("$18",
   "18 dollars", "¥18", "18元").
5. Percent: "%" is a unit like any other, so "50%" reads as 50 (GSM8K writes percentage
   answers as "#### 50"). It does NOT also equal 0.5: accepting both readings would
   accept "0.2%" for 0.2.
6. A single Latin or Greek letter glued to a number ("2x", "3i", "x2", "2π"), operators
   (+ * / ^ = < > and the like outside a number), brackets or leftover backslashes mark an
   expression. A multi-letter word glued to a number is a unit ("18km", "5kg"), so "5m" is an
   expression but "5 m" is a number.

Answers longer than MAX_ANSWER_CHARS are not read at all (None): a final answer that long
is not a final answer, and the cap bounds the time spent per completion.
"""

from __future__ import annotations

import functools
import numbers
import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

# A final answer is short. The cap keeps every regex below on a small input.
MAX_ANSWER_CHARS = 1000

# Exponents beyond this in "1e400" are left to the symbolic path: Fraction(10**400000) would
# be slow and no grade-school answer needs it.
_MAX_EXPONENT = 300

AnswerKind = Literal["number", "ambiguous", "expression", "text"]


@dataclass(frozen=True)
class ParsedAnswer:
    """What the fast path made of an answer.

    `value` is set only for kind "number". `cleaned` is the text after garbage removal,
    LaTeX unwrapping and final-marker selection; the symbolic path and string comparison use it.
    """

    kind: AnswerKind
    value: Fraction | None
    cleaned: str


# --- step 1: garbage characters -------------------------------------------------------------

def _build_garbage_table() -> dict[int, str | None]:
    table: dict[int, str | None] = {}
    for cp in list(range(0x00, 0x20)) + list(range(0x7F, 0xA0)):
        table[cp] = " "  # control characters, tabs and newlines -> plain space
    invisible = [0xFFFD, 0x00AD, 0xFEFF, *range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2060, 0x2070)]
    for cp in invisible:
        table[cp] = None  # replacement char, soft hyphen, BOM, zero-width, bidi marks
    table[0x2028] = table[0x2029] = " "  # line/paragraph separators
    return table


_GARBAGE = _build_garbage_table()
# NFKC leaves these alone; all are "minus" or "fraction slash" in practice.
_AFTER_NFKC = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2044": "/", "\u2215": "/"})
# NFKC would turn "3²" into "32"; keep the power visible instead.
_SUPERSCRIPTS = str.maketrans({ch: "^" + d for ch, d in zip("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")}
                              | {ch: "_" + d for ch, d in zip("₀₁₂₃₄₅₆₇₈₉", "0123456789")})


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]{0,20}[A-Za-z]")


def _clean_characters(text: str) -> str:
    if "\x1b" in text:
        text = _ANSI_ESCAPE.sub("", text)  # terminal colour codes copied from logs
    text = text.translate(_GARBAGE)
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text.translate(_SUPERSCRIPTS)).translate(_AFTER_NFKC)
    return " ".join(text.split())


# --- step 2: LaTeX --------------------------------------------------------------------------

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}")
_FRAC_BRACED = re.compile(r"\\[dt]?frac\s*\{\s*([-+]?\d+(?:\.\d+)?)\s*\}\s*\{\s*([-+]?\d+(?:\.\d+)?)\s*\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_LATEX_REMOVALS = (
    ("\\left", ""), ("\\right", ""), ("\\displaystyle", ""), ("\\!", ""),
    ("\\(", " "), ("\\)", " "), ("\\[", " "), ("\\]", " "),
    ("\\,", " "), ("\\;", " "), ("\\:", " "), ("\\ ", " "), ("\\quad", " "), ("\\qquad", " "), ("~", " "),
    ("{,}", ","), ("\\%", "%"), ("\\$", ""), ("$", ""), ("°", ""),
)


def _last_boxed_content(text: str) -> str | None:
    """Content of the last \\boxed{...} (brace-balanced), or None. Hand-written because a
    regex cannot balance braces; the loop is linear in the text after the box."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start == -1:
        return None
    brace = text.find("{", start)
    if brace == -1 or text[start:brace].strip() not in _BOX_COMMANDS:
        return None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1:i]
    return text[brace + 1:]  # unclosed box: take the rest rather than nothing


def _simplify_latex(text: str) -> str:
    if "\\" not in text and "$" not in text and "{," not in text and "°" not in text and "~" not in text:
        return text
    boxed = _last_boxed_content(text)
    if boxed is not None:
        text = boxed
    for _ in range(3):  # \text{\textbf{..}} nests rarely deeper than this
        unwrapped = _TEXT_WRAPPER.sub(r" \1 ", text)
        if unwrapped == text:
            break
        text = unwrapped
    text = _FRAC_BRACED.sub(r"\1/\2", text)
    text = _FRAC_SHORT.sub(r"\1/\2", text)
    text = _DEGREES.sub("", text)
    for old, new in _LATEX_REMOVALS:
        text = text.replace(old, new)
    return " ".join(text.split())


# --- step 3: final-answer markers -----------------------------------------------------------

_FINAL_MARKER = re.compile(
    r"(?:final\s+)?answer\s*(?:is|:|=|would\s+be|will\s+be)|答案\s*(?:是|为|為|:)|答\s*:",
    re.IGNORECASE,
)
# A lone "=" (not <=, >=, ==, !=, :=) also marks the final value: "5 + 13 = 18".
_EQUALS = re.compile(r"(?<![<>!=:])=(?!=)")
_LEADING_PUNCT = " :;,.。，、"  # not "-": "answer is -3" keeps its sign


def _after_last_marker(text: str) -> str:
    """The text after the last final-answer marker, then after the "=" if exactly one is left.

    Only ONE "=" splits: "x = 5, y = 3" is a system of equations, and reading it as 3 would
    accept "x = 4, y = 3"; it stays whole for the symbolic path."""
    last = None
    for last in _FINAL_MARKER.finditer(text):
        pass
    if last is not None:
        text = text[last.end():].lstrip(_LEADING_PUNCT).strip() or text
    equals = list(_EQUALS.finditer(text))
    if len(equals) == 1:
        text = text[equals[0].end():].lstrip(_LEADING_PUNCT).strip() or text
    return text


# --- step 4: numbers ------------------------------------------------------------------------

_NUMBER = re.compile(
    r"(?P<sign>[-+])?(?=\.?\d)"  # a number starts with a digit (or ".5"); never matches empty
    r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d{1,3}(?: \d{3})+(?!\d)|\d+)?"
    r"(?P<dec>\.\d+)?"
    r"(?:[eE](?P<exp>[-+]?\d{1,3})(?!\d))?"
    r"(?:/(?P<den>\d+(?:\.\d+)?))?"
)
# Characters that make the text mathematics rather than a number with words around it.
_MATH_CHARS = frozenset("^*×÷√π∞+=<>≤≥≠≈_\\{}|()[]/")


def _is_letter(ch: str) -> bool:
    """Latin or Greek letter: the alphabets variables are written in."""
    return (ch.isascii() and ch.isalpha()) or "\u0370" <= ch <= "\u03ff"


def _is_ascii_alnum(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


def _glued_single_letter(text: str, index: int, step: int) -> bool:
    """Is there a one-letter run starting at `index` going in direction `step`?"""
    if not (0 <= index < len(text)) or not _is_letter(text[index]):
        return False
    nxt = index + step
    return not (0 <= nxt < len(text) and _is_letter(text[nxt]))


def _number_value(match: re.Match[str]) -> Fraction | None:
    int_part, dec, exp, den = match["int"], match["dec"], match["exp"], match["den"]
    if int_part is None and dec is None:
        return None
    if exp is not None and abs(int(exp)) > _MAX_EXPONENT:
        return None
    literal = (int_part or "0").replace(",", "").replace(" ", "") + (dec or "") + (f"e{exp}" if exp else "")
    value = Fraction(literal)
    if den is not None:
        denominator = Fraction(den)
        if denominator == 0:
            return None
        value /= denominator
    return -value if match["sign"] == "-" else value


def _read_numbers(text: str) -> tuple[list[Fraction], bool]:
    """All numbers in `text`, and whether anything marks the text as mathematics."""
    values: list[Fraction] = []
    is_math = False
    prose_start = 0
    for match in _NUMBER.finditer(text):
        start, end = match.span()
        between = text[prose_start:start]
        prose_start = end
        if any(ch in _MATH_CHARS for ch in between):
            is_math = True
        before = start - 1
        if match["sign"] is not None and before >= 0 and (_is_ascii_alnum(text[before]) or _is_letter(text[before])
                                                          or text[before] in ")]}"):
            is_math = True  # "5-3", "x-3": a binary operator, not a sign
        if _glued_single_letter(text, before, -1) or _glued_single_letter(text, end, +1):
            is_math = True  # "x2", "2x", "3i", "2π"
        value = _number_value(match)
        if value is None:
            is_math = True  # "1/0", "1e999": leave to the symbolic path
        else:
            values.append(value)
    if any(ch in _MATH_CHARS for ch in text[prose_start:]):
        is_math = True
    return values, is_math


def _strip_lone_brackets(text: str) -> str:
    """"(18)" or "[18]" is just 18; "(1, 2)" stays an interval/point for the symbolic path."""
    if len(text) > 2 and (text[0], text[-1]) in (("(", ")"), ("[", "]")):
        inner = text[1:-1]
        if not any(ch in inner for ch in "()[],;"):
            return inner.strip()
    return text


# --- public entry points --------------------------------------------------------------------

def parse_answer(text: Any) -> ParsedAnswer | None:
    """Classify a final answer; None when there is nothing to read.

    Ints, floats, Fractions, Decimals and numpy scalars are accepted (a dataset column may hold numbers). None,
    other non-strings, empty text and text over MAX_ANSWER_CHARS give None. Never raises.

    >>> parse_answer("The answer is $1,234.")
    ParsedAnswer(kind='number', value=Fraction(1234, 1), cleaned='1,234.')
    >>> parse_answer("5 apples and 18 pears").kind
    'ambiguous'
    >>> parse_answer("\\\\sqrt{2}").kind
    'expression'
    """
    if type(text) is not str:  # exact type check first: the ABC checks below are slow
        if isinstance(text, bool):
            return None
        if isinstance(text, (numbers.Real, Decimal)):  # int, float, Fraction, numpy scalars
            text = str(text)
        elif not isinstance(text, str):
            return None
    if len(text) > MAX_ANSWER_CHARS:
        return None
    return _parse_text(text)


@functools.lru_cache(maxsize=16384)
def _parse_text(text: str) -> ParsedAnswer | None:
    """parse_answer on a bounded string, cached: the reference repeats for every generation of
    a prompt, and a policy repeats its own answers. ParsedAnswer is frozen, so sharing is safe."""
    plain = text.strip()
    digits = plain[1:] if plain.startswith("-") else plain
    if digits.isascii() and digits.isdigit():  # the common case, "18" or "-3": skip the reader
        return ParsedAnswer("number", Fraction(int(plain)), plain)
    try:
        cleaned = _strip_lone_brackets(_after_last_marker(_simplify_latex(_clean_characters(text))))
        if not cleaned:
            return None
        values, is_math = _read_numbers(cleaned)
    except (ValueError, ZeroDivisionError, OverflowError):  # defensive: the reader must never raise
        return None
    if is_math:
        return ParsedAnswer("expression", None, cleaned)
    if not values:
        return ParsedAnswer("text", None, cleaned)
    if all(v == values[0] for v in values):
        return ParsedAnswer("number", values[0], cleaned)
    return ParsedAnswer("ambiguous", None, cleaned)


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


def normalize_answer(text: Any) -> str | None:
    """A canonical string for an answer, or None when there is none.

    A numeric answer becomes its canonical number (see `format_number`): "1,234" -> "1234",
    "$18.00" -> "18", "答案：18元" -> "18", "\\frac{1}{2}" -> "0.5", "50%" -> "50". Anything
    else comes back cleaned (garbage removed, whitespace collapsed, \\boxed and $ unwrapped,
    text before the last final-answer marker dropped) but otherwise unchanged.

    >>> normalize_answer("1,234"), normalize_answer("$18.00"), normalize_answer("答案：１８元")
    ('1234', '18', '18')
    >>> normalize_answer("The answer is \\\\boxed{\\\\frac{1}{2}}")
    '0.5'
    >>> normalize_answer("  ") is None, normalize_answer(None) is None
    (True, True)
    """
    parsed = parse_answer(text)
    if parsed is None:
        return None
    if parsed.kind == "number" and parsed.value is not None:
        try:
            return format_number(parsed.value)
        except ValueError:  # an absurdly long exact decimal hits Python's int-to-str digit limit
            return parsed.cleaned
    return parsed.cleaned
