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

7. Forms a careful grader accepts: "**18**" (markdown), "18 (approximately)" (a parenthetical
   of words), units after a slash or squared ("60 km/h", "$15/hour", "10 ft²", "10 m^2"), a unit
   letter glued to the number ("5m", "3h"), mixed numbers ("2 1/2", "2\\frac{1}{2}" = 5/2),
   scale words ("1.2 million"), "\\approx" read as "=", "11,\\! 111" as 11111.
8. Decimal commas: a comma is a thousands separator only in GSM8K's own shape (1-3 digits, not
   starting with 0, then groups of exactly three: "1,234", "12,000,023"). Any other single comma
   between digits is a decimal comma ("1000,99", "2,74", "0,111"). Safe because the two readings
   never overlap, and a hedge written without a space ("18,20") reads as 18.2, which equals no
   integer answer.
9. The conclusion sentence (see `conclusion_value`): when the text is prose with several
   different numbers, the number the last sentence asserts is read, or nothing.

The model's side (`parse_answer(..., prediction=True)`) also reads number words ("eighteen",
"十八", "一百二十") when there are no digits at all, drops chat-template tokens and what
follows them ("<|im_start|>user ..."), and reads a long answer's \\boxed{} or its last
MAX_ANSWER_CHARS characters. A reference gets none of these: a reference in words ("forty
two") is not a GSM8K reference, and the correctness reward leaves it unjudged.

Answers longer than MAX_ANSWER_CHARS are otherwise not read at all (None): the cap bounds the
time spent per completion.
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


# "\\text" written in a non-raw Python or JSON string arrives as TAB + "ext"; "\\frac" as
# form feed + "rac", "\\boxed" as backspace + "oxed". Put the backslash back before the
# control characters are blanked.
_MANGLED_ESCAPES = re.compile(r"\t(?=ext|imes|frac)|\x0c(?=rac)|\x08(?=oxed|inom)|\r(?=ight)|\x07(?=pprox)")
_ESCAPE_LETTER = {"\t": "\\t", "\x0c": "\\f", "\x08": "\\b", "\r": "\\r", "\x07": "\\a"}


def _clean_characters(text: str) -> str:
    if not text.isprintable():
        text = _MANGLED_ESCAPES.sub(lambda m: _ESCAPE_LETTER[m.group()], text)
    if "\x1b" in text:
        text = _ANSI_ESCAPE.sub("", text)  # terminal colour codes copied from logs
    text = text.translate(_GARBAGE)
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text.translate(_SUPERSCRIPTS)).translate(_AFTER_NFKC)
    return " ".join(text.split())


# --- step 2: LaTeX --------------------------------------------------------------------------

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textnormal|textbf|textit|textrm|textsf|texttt|mathrm|mathbf|mathit|mathsf|"
                           r"mbox|operatorname)\s*\{([^{}]*)\}")
_FRAC_BRACED = re.compile(r"\\[dt]?frac\s*\{\s*([-+]?\d+(?:\.\d+)?)\s*\}\s*\{\s*([-+]?\d+(?:\.\d+)?)\s*\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
# "2\frac{1}{2}" and "2 \frac12" are mixed numbers (5/2), not 2 and 1/2 (or "21/2").
_MIXED_LATEX = re.compile(r"(?<![\d.])(\d+)\s*\\[dt]?frac\s*(?:\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}|(\d)\s*(\d))")
# "11,\! 111" and "14 {, }916": thousands commas with LaTeX spacing around them.
_THOUSANDS_BANG = re.compile(r",\s*\\!\s*|\s*\{\s*,\s*\}\s*")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_LATEX_REMOVALS = (
    ("\\left", ""), ("\\right", ""), ("\\displaystyle", ""), ("\\!", ""),
    ("\\(", " "), ("\\)", " "), ("\\[", " "), ("\\]", " "),
    ("\\,", " "), ("\\;", " "), ("\\:", " "), ("\\ ", " "), ("\\quad", " "), ("\\qquad", " "), ("~", " "),
    ("{,}", ","), ("\\%", "%"), ("\\$", ""), ("$", ""), ("°", ""), ("\\approx", "≈"),
)


def _last_boxed_content(text: str) -> str | None:
    """Content of the last \\boxed{...} (brace-balanced), or None. Hand-written because a
    regex cannot balance braces; the loop is linear in the text after the box.

    Two boxes close together with different contents ("\\boxed{18} or \\boxed{20}") are a
    list of alternatives: both are returned, joined by " or ", so the answer reads as ambiguous."""
    last = _boxed_at(text, max(text.rfind(cmd) for cmd in _BOX_COMMANDS))
    if last is None:
        return None
    content, start, _ = last
    previous = _boxed_at(text, max(text.rfind(cmd, 0, start) for cmd in _BOX_COMMANDS))
    if (previous is not None and _ALTERNATIVE_BOX_GAP.fullmatch(text[previous[2]:start])
            and previous[0].strip() != content.strip()):
        return f"{previous[0]} or {content}"
    return content


# What stands between two boxes that list alternatives: "} or \\boxed{", "}$, $\\boxed{", "}/\\boxed{".
_ALTERNATIVE_BOX_GAP = re.compile(r"[\s$]*(?:,|;|/|、|or|and|或|或者|maybe|perhaps)?[\s$]*", re.IGNORECASE)


def _boxed_at(text: str, start: int) -> tuple[str, int, int] | None:
    """(content, start, end) of the box command at `start`, or None."""
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
                return text[brace + 1:i], start, i + 1
    return text[brace + 1:], start, len(text)  # unclosed box: take the rest rather than nothing


def _mixed_fraction(match: re.Match[str]) -> str:
    """"2 1/2" -> "5/2" when the fraction is proper; otherwise leave the text alone."""
    whole, num, den = int(match[1]), int(match[2] or match[4]), int(match[3] or match[5])
    if not 0 < num < den:
        return match.group()
    return f"{whole * den + num}/{den}"


def _simplify_latex(text: str) -> str:
    if "\\" not in text and "$" not in text and "{," not in text and "°" not in text and "~" not in text:
        return text
    boxed = _last_boxed_content(text)
    if boxed is not None and _FINAL_MARKER.search(text, max(text.rfind(cmd) for cmd in _BOX_COMMANDS)) is None:
        text = boxed  # unless a final-answer marker after the box states the answer again
    for _ in range(3):  # \text{\textbf{..}} nests rarely deeper than this
        unwrapped = _TEXT_WRAPPER.sub(r" \1 ", text)
        if unwrapped == text:
            break
        text = unwrapped
    text = _THOUSANDS_BANG.sub(",", text)
    text = _MIXED_LATEX.sub(_mixed_fraction, text)
    text = _FRAC_BRACED.sub(r"\1/\2", text)
    text = _FRAC_SHORT.sub(r"\1/\2", text)
    text = _DEGREES.sub("", text)
    for old, new in _LATEX_REMOVALS:
        text = text.replace(old, new)
    return " ".join(text.split())


# --- step 2b: prose forms around a number ----------------------------------------------------

_MARKDOWN_EMPHASIS = re.compile(r"\*\*|__")
# "(approximately)", "(dollars)": words only, two letters at least, so "f(x)" keeps its "(x)".
_WORD_PARENTHETICAL = re.compile(r"\(\s*[A-Za-z]{2}[A-Za-z .,'-]{0,40}\)")
# "/hour", "/day": a slash before a word is a unit ("$15/hour", "4,000 bottles/hour"), and so is
# a slash between a unit word and one letter ("km/h"). "15/x" and "a/b" stay mathematics.
_UNIT_SLASH_WORD = re.compile(r"\s*/\s*[A-Za-z]{2,}\b")
_UNIT_SLASH_LETTER = re.compile(r"(?<=[A-Za-z]{2})\s*/\s*[A-Za-z]\b")
# Squared or cubed length units ("10 ft^2", "10 m²" after superscript folding). Only these unit
# names: "10 x^2" must stay an expression.
_POWER_UNIT = re.compile(r"(?<![A-Za-z])(m|cm|mm|km|ft|in|yd|mi|inch(?:es)?|feet|foot|met(?:er|re)s?|miles?|"
                         r"yards?|units?)"
                         r"\s*\^\s*\{?\s*[23]\s*\}?")
_APPROX_AFTER_EXACT = re.compile(r"(=[^=≈]{0,40}?)\s*≈\s*[-+]?\d[\d,]*(?:\.\d+)?")
_MIXED_NUMBER = re.compile(r"(?<![\d.,/])(\d+)\s+(\d+)\s*/\s*(\d+)(?![\d.,/])")
_SCALED = re.compile(r"(\d+(?:\.\d+)?)\s*(thousand|million|billion)\b", re.IGNORECASE)
_SCALE = {"thousand": 10**3, "million": 10**6, "billion": 10**9}


def _scaled(match: re.Match[str]) -> str:
    return format_number(Fraction(match[1]) * _SCALE[match[2].lower()])


def _simplify_prose(text: str) -> str:
    if "*" in text or "_" in text:
        text = _MARKDOWN_EMPHASIS.sub("", text)
    if "(" in text:
        text = _WORD_PARENTHETICAL.sub(" ", text)
    if "/" in text:
        text = _UNIT_SLASH_LETTER.sub("", _UNIT_SLASH_WORD.sub("", text))
        text = _MIXED_NUMBER.sub(_mixed_fraction, text)
    if "^" in text:
        text = _POWER_UNIT.sub(r"\1", text)
    if "≈" in text:  # "x \\approx 11" states 11; in "x = 1/3 \\approx 0.33" the exact 1/3 is the answer
        text = _APPROX_AFTER_EXACT.sub(r"\1", text).replace("≈", "=")
    if "illion" in text or "housand" in text:
        text = _SCALED.sub(_scaled, text)
    return " ".join(text.split())


# --- step 2c (model side only): number words ---------------------------------------------------

_SMALL_NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
                  "fifteen sixteen seventeen eighteen nineteen").split()
_TENS_WORDS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_WORD_VALUE = {w: i for i, w in enumerate(_SMALL_NUMBERS)} | {w: 20 + 10 * i for i, w in enumerate(_TENS_WORDS)}
_WORD_SCALE = {"hundred": 100} | _SCALE
_NUMBER_WORD = "|".join(sorted(list(_WORD_VALUE) + list(_WORD_SCALE), key=len, reverse=True))
_WORD_RUN = re.compile(rf"\b(?:{_NUMBER_WORD})(?:(?:[\s-]+and)?[\s-]+(?:{_NUMBER_WORD}))*\b", re.IGNORECASE)
# Words that change a number's value in ways the converter does not read ("eighteen and a half",
# "minus five", "three point five"): with one present, English words are left unread.
_UNREAD_WORDS = re.compile(r"\b(?:half|halves|quarters?|thirds?|fourths?|fifths?|sixths?|sevenths?|eighths?|ninths?|"
                           r"tenths?|hundredths?|thousandths?|point|minus|negative|dozens?|score)\b", re.IGNORECASE)
_UNREAD_CHINESE = re.compile("负|点|半|分之|多|几")  # negative, decimal point, half, fractions, "and some"
_CHINESE_DIGIT = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4,
                  "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_CHINESE_UNIT = {"十": 10, "百": 100, "千": 1000}
_CHINESE_BIG = {"万": 10**4, "亿": 10**8}
_CHINESE_RUN = re.compile("[零〇一二两三四五六七八九十百千万亿]+")


def _english_words_value(match: re.Match[str]) -> str:
    total = current = 0
    for word in re.split(r"[\s-]+", match.group().lower()):
        if word in _WORD_VALUE:
            current += _WORD_VALUE[word]
        elif word == "hundred":
            current = max(current, 1) * 100
        elif word in _WORD_SCALE:
            total += max(current, 1) * _WORD_SCALE[word]
            current = 0
    return str(total + current)


def _chinese_value(match: re.Match[str]) -> str:
    total = section = digit = 0
    for ch in match.group():
        if ch in _CHINESE_DIGIT:
            digit = _CHINESE_DIGIT[ch]
        elif ch in _CHINESE_UNIT:
            section += max(digit, 1) * _CHINESE_UNIT[ch]  # "十八": a bare 十 is ten
            digit = 0
        else:
            total += (section + digit) * _CHINESE_BIG[ch]
            section = digit = 0
    return str(total + section + digit)


def _number_words_to_digits(text: str) -> str:
    """Number words as digits ("eighteen" -> "18", "一百二十" -> "120").

    Only for text without a single digit: in "一共120元" the 一 is part of a word, and in
    "each one costs 5" "one" is not the answer. With digits present, words are left alone."""
    if any(ch.isdigit() for ch in text):
        return text
    if _UNREAD_WORDS.search(text) is None:
        text = _WORD_RUN.sub(_english_words_value, text)
    if _UNREAD_CHINESE.search(text) is None:
        text = _CHINESE_RUN.sub(_chinese_value, text)
    return text


# --- step 3: final-answer markers -----------------------------------------------------------

_FINAL_MARKER = re.compile(
    r"(?:final\s+)?answer\s*(?:is|:|=|would\s+be|will\s+be|(?=[-+(\[]?\d))|答案\s*(?:是|为|為|:)|答\s*:",
    re.IGNORECASE,
)
# A lone "=" (not <=, >=, ==, !=, :=) also marks the final value: "5 + 13 = 18".
_EQUALS = re.compile(r"(?<![<>!=:])=(?!=)")
_LEADING_PUNCT = " :;,.。，、"  # not "-": "answer is -3" keeps its sign


def _after_last_marker(text: str) -> str:
    """The text after the last final-answer marker (the whole text when there is none)."""
    last = None
    for last in _FINAL_MARKER.finditer(text):
        pass
    if last is not None:
        text = text[last.end():].lstrip(_LEADING_PUNCT).strip() or text
    return text


def _after_single_equals(text: str) -> str:
    """The text after the "=" if exactly one is present.

    Only ONE "=" splits: "x = 5, y = 3" is a system of equations, and reading it as 3 would
    accept "x = 4, y = 3"; it stays whole for the symbolic path."""
    equals = list(_EQUALS.finditer(text))
    if len(equals) == 1:
        text = text[equals[0].end():].lstrip(_LEADING_PUNCT).strip() or text
    return text


# --- step 4: numbers ------------------------------------------------------------------------

_NUMBER = re.compile(
    r"(?P<sign>[-+])?(?=\.?\d)"  # a number starts with a digit (or ".5"); never matches empty
    r"(?P<int>[1-9]\d{0,2}(?:,\d{3})+(?![\d,])|\d{1,3}(?: \d{3})+(?!\d)|\d+)?"
    r"(?P<dec>\.\d+|,\d+(?![\d,]))?"  # ",99" in "1000,99": a decimal comma (rule 8)
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


# One-letter units written glued after a number: "5m", "3h", "2L". Not "k" (5k is 5000) and
# none of the letters algebra uses for unknowns.
_UNIT_LETTERS = frozenset("mghsLl")


def _glued_single_letter(text: str, index: int, step: int) -> bool:
    """Is there a one-letter run starting at `index` going in direction `step`? (a unit letter
    after the number does not count)."""
    if not (0 <= index < len(text)) or not _is_letter(text[index]):
        return False
    if step > 0 and text[index] in _UNIT_LETTERS:
        return False
    nxt = index + step
    return not (0 <= nxt < len(text) and _is_letter(text[nxt]))


def _number_value(match: re.Match[str]) -> Fraction | None:
    int_part, dec, exp, den = match["int"], match["dec"], match["exp"], match["den"]
    if int_part is None and dec is None:
        return None
    if exp is not None and abs(int(exp)) > _MAX_EXPONENT:
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


# --- step 5: the conclusion sentence ---------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")
# Anything that offers a second possibility or takes the statement back. One of these in the
# concluding sentence and nothing is read: a hedge is never rewarded.
# "could"/"might" in a relative clause describe the quantity ("the most points that could be in
# the domain is 19"), so they do not hedge there.
_HEDGE = re.compile(r"\b(?:or|either|maybe|perhaps|possibly|probably|unsure|guess|between|but|however|"
                    r"actually|wait|instead|rather|at\s+(?:most|least)|up\s+to)\b|(?<!that )(?<!which )(?<!who )"
                    r"\b(?:could|might|may)\b|not\s+sure|或|还是|可能|也许|大概|但",
                    re.IGNORECASE)
# Uncertainty about a single number ("Maybe 18.", "It could be 18."): not rewarded either.
_UNSURE = re.compile(r"\b(?:maybe|perhaps|possibly|probably|unsure|guess|at\s+(?:most|least)|up\s+to)\b|"
                     r"(?<!that )(?<!which )(?<!who )"
                     r"\b(?:could|might|may)\b|not\s+sure|可能|也许|大概", re.IGNORECASE)
# A sentence that opens with one of these concludes, so with one number and no cue it still
# asserts it: "Therefore, the error increases by 100%."
_CONCLUDING = re.compile(r"^\W*(?:therefore|thus|so|hence|in\s+total|altogether|finally|in\s+conclusion)\b"
                         r"|^\W*(?:所以|因此|总共)",
                         re.IGNORECASE)
# Words that assert a value: "... is 132", "a total of 840", "which makes 18", "it's 1,000.99".
_CUE = re.compile(r"\b(?:is|are|was|were|equals?|equal\s+to|be|gives?|makes?|totals?|total\s+of|comes?\s+to|"
                  r"(?:it|that|this|which|there|what)'s)\b|=|是|为|為|等于|共",
                  re.IGNORECASE)
# After the asserted number, another number may follow only in a phrase like these ("840 laps
# during the 60 days"); "18 and 20", "18, not 20", "18 + 2" reject the sentence.
_PREPOSITION = re.compile(r"\b(?:in|during|for|over|after|within|per|each|every|on|from|across)\b", re.IGNORECASE)
_EQUATION_JOIN = re.compile(r";|\band\b", re.IGNORECASE)
_BARE_VARIABLE = re.compile(r"\s*[A-Za-z]\w{0,2}\s*")


def _starts_second_equation(between: str) -> bool:
    """Between two "=": "5 and y", "5; y" or "5, y" (a comma then a bare variable) join two
    equations; "8, the longer piece is 4*8" is a calculation that follows from the first."""
    if _EQUATION_JOIN.search(between):
        return True
    comma = between.rfind(",")
    return comma != -1 and _BARE_VARIABLE.fullmatch(between[comma + 1:]) is not None


_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}|[\u4e00-\u9fff]")


def conclusion_value(text: str) -> Fraction | None:
    """The number the last sentence with a digit asserts, or None.

    The rule, in order (each step can only refuse, never guess):

    1. Take the last sentence that contains a digit (sentences end at ". ", "!", "?", "。"; not at
       ";", which joins equations: "p = 0; q = 1").
    2. Refuse it if it hedges or takes something back (`_HEDGE`: "or", "maybe", "could",
       "but", "actually", "between", ...).
    3. Find its last assertion cue that a number follows (`_CUE`: "is", "are", "=", "total of", "makes", "it's",
       "是", "共", ...). None: only a sentence that opens with "Therefore"/"So"/"Thus"/"所以"...
       and holds one number, no mathematics, is read; anything else is refused.
    4. A "=" cue that starts a second equation ("x = 5 and y = 3") is refused. After the cue,
       a chain of equalities is read at its right-hand end ("is 37 + 95 = 132").
    5. The first number after that is the answer if nothing mathematical stands between
       the cue and it, no variable is glued to it, and every later different number stands
       in a phrase opened by a preposition ("during the 60 days", "for 2 tubs and 4 packets")
       with no operator in between.

    >>> conclusion_value("The bakery sold 37 + 95, which is 132 loaves in total.")
    Fraction(132, 1)
    >>> conclusion_value("Ana swims a total of 840 laps during the 60 days.")
    Fraction(840, 1)
    >>> conclusion_value("So the answer is 18 or 20.") is None, conclusion_value("It is 35 + 2.") is None
    (True, True)
    """
    sentences = [part for part in _SENTENCE_END.split(text) if any(ch.isdigit() for ch in part)]
    if not sentences:
        return None
    sentence = sentences[-1]
    if _HEDGE.search(sentence):
        return None
    cue = None
    for match in _CUE.finditer(sentence):
        if any(ch.isdigit() for ch in sentence[match.end():]):
            cue = match  # the last cue that a number follows ("... is 132 loaves in total")
    if cue is None:
        values, is_math = _read_numbers(sentence)
        if _CONCLUDING.search(sentence) and not is_math and values and all(v == values[0] for v in values):
            return values[0]
        return None
    if cue.group() == "=":
        earlier = [m for m in _EQUALS.finditer(sentence, 0, cue.start())]
        if earlier and _starts_second_equation(sentence[earlier[-1].end():cue.start()]):
            return None  # "x = 5 and y = 3": this "=" starts a second equation, not a chain
    after = sentence[cue.end():]
    equals = list(_EQUALS.finditer(after))
    if equals:
        after = after[equals[-1].end():]
    matches = list(_NUMBER.finditer(after))
    if not matches:
        return None
    first = matches[0]
    if any(ch in _MATH_CHARS for ch in after[:first.start()]):
        return None
    if _glued_single_letter(after, first.start() - 1, -1) or _glued_single_letter(after, first.end(), +1):
        return None
    value = _number_value(first)
    if value is None:
        return None
    previous_end = first.end()
    in_phrase = False  # past a preposition after the answer: "$6 for 2 tubs and 4 packets"
    for match in matches[1:]:
        between = after[previous_end:match.start()]
        if any(ch in _MATH_CHARS for ch in between) or match["sign"] is not None:
            return None
        in_phrase = in_phrase or _PREPOSITION.search(between) is not None
        if _number_value(match) != value and not in_phrase:
            return None
        previous_end = match.end()
    if any(ch in _MATH_CHARS for ch in after[previous_end:]):
        return None
    return value


# --- public entry points --------------------------------------------------------------------

def parse_answer(text: Any, *, prediction: bool = False) -> ParsedAnswer | None:
    """Classify a final answer; None when there is nothing to read.

    Ints, floats, Fractions, Decimals and numpy scalars are accepted (a dataset column may hold numbers). None,
    other non-strings and empty text give None. Never raises.

    `prediction=True` reads the model's side (see the module docstring): number words, chat
    template tokens cut off, and a long answer read at its \\boxed{} or its tail. Otherwise
    text over MAX_ANSWER_CHARS gives None.

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
    if prediction:
        text = _prediction_window(text)
    elif len(text) > MAX_ANSWER_CHARS:
        return None
    return _parse_text(text, prediction)


# Chat-template tokens, and the sign-off of the common "Final Answer: The final answer is X. I
# hope it is correct." template: what follows is a new turn or commentary, not the answer.
_TEMPLATE_TOKEN = re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|end_of_text|start_header_id|eos)\|>"
                             r"|I hope it is correct")


def _prediction_window(text: str) -> str:
    """At most MAX_ANSWER_CHARS of a model's answer: up to the first chat-template token (the
    model went on into a new turn), then from its last \\boxed{} or final-answer marker, or
    else its tail, cut at a space so
    no number is cut in half. Linear in the text."""
    if "<|" in text or "hope" in text:
        token = _TEMPLATE_TOKEN.search(text)
        if token is not None:
            text = text[:token.start()]
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    last_marker = -1
    for match in _FINAL_MARKER.finditer(text):
        last_marker = match.start()
    start = max(last_marker, *(text.rfind(cmd) for cmd in _BOX_COMMANDS))
    if start != -1:
        return text[start:start + MAX_ANSWER_CHARS]
    tail = text[-MAX_ANSWER_CHARS:]
    space = tail.find(" ")
    return tail[space + 1:] if space != -1 else tail


@functools.lru_cache(maxsize=16384)
def _parse_text(text: str, prediction: bool = False) -> ParsedAnswer | None:
    """parse_answer on a bounded string, cached: the reference repeats for every generation of
    a prompt, and a policy repeats its own answers. ParsedAnswer is frozen, so sharing is safe."""
    plain = text.strip()
    digits = plain[1:] if plain.startswith("-") else plain
    if digits.isascii() and digits.isdigit():  # the common case, "18" or "-3": skip the reader
        return ParsedAnswer("number", Fraction(int(plain)), plain)
    try:
        readable = _simplify_prose(_simplify_latex(_clean_characters(text)))
        if prediction:
            readable = _number_words_to_digits(readable)
        marked = _after_last_marker(readable)
        cleaned = _strip_lone_brackets(_after_single_equals(marked))
        if not cleaned:
            return None
        values, is_math = _read_numbers(cleaned)
        if values and not is_math and all(v == values[0] for v in values):
            if _UNSURE.search(marked):  # "Maybe 18.", "It could be 18": one number, still a hedge
                return ParsedAnswer("ambiguous", None, cleaned)
            return ParsedAnswer("number", values[0], cleaned)
        if values and _PROSE_WORD.search(marked):  # prose with several numbers: rule 9
            concluded = conclusion_value(marked)
            if concluded is not None:
                return ParsedAnswer("number", concluded, cleaned)
    except (ValueError, ZeroDivisionError, OverflowError):  # defensive: the reader must never raise
        return None
    if is_math:
        return ParsedAnswer("expression", None, cleaned)
    if not values:
        return ParsedAnswer("text", None, cleaned)
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
