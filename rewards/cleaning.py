"""Reading an answer, rules 1, 2 and 7 of rewards/normalize.py: garbage characters, LaTeX and the prose forms
around a number, simplified into text a number reader can read.
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

from grpo_pipeline.rewards.numbers import format_number
from grpo_pipeline.rewards.sentences import FINAL_MARKER


# Control characters, tabs, newlines and line/paragraph separators become a space; the replacement character,
# soft hyphen, BOM, zero-width and bidi marks are dropped.
_GARBAGE: dict[int, str | None] = dict.fromkeys([*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029], " ")
_GARBAGE |= dict.fromkeys([0xFFFD, 0xAD, 0xFEFF, *range(0x200B, 0x2010), *range(0x202A, 0x202F),
                           *range(0x2060, 0x2070)])
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


def clean_characters(text: str) -> str:
    if not text.isprintable():
        text = _MANGLED_ESCAPES.sub(lambda m: _ESCAPE_LETTER[m.group()], text)
    if "\x1b" in text:
        text = _ANSI_ESCAPE.sub("", text)  # terminal colour codes copied from logs
    text = text.translate(_GARBAGE)
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text.translate(_SUPERSCRIPTS)).translate(_AFTER_NFKC)
    return " ".join(text.split())


BOX_COMMANDS = ("\\boxed", "\\fbox")
LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")  # \boxed, \frac, \times, \sqrt, \pi
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
    ("{,}", ","), ("\\%", "%"), ("\\$", ""), ("$", ""),
    # a temperature's unit (℃ and ℉ are °C and °F after NFKC) is a unit word, not the variable C or F
    ("°C", " "), ("°F", " "), ("°", ""), ("\\approx", "≈"),
)


def _last_boxed_content(text: str) -> str | None:
    """Content of the last \\boxed{...} (brace-balanced: no regex can), or None. Two boxes that list alternatives
    ("\\boxed{18} or \\boxed{20}") are both returned, joined by " or ", so the answer reads as ambiguous."""
    last = _boxed_at(text, max(text.rfind(cmd) for cmd in BOX_COMMANDS))
    if last is None:
        return None
    content, start, _ = last
    previous = _boxed_at(text, max(text.rfind(cmd, 0, start) for cmd in BOX_COMMANDS))
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
    if brace == -1 or text[start:brace].strip() not in BOX_COMMANDS:
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


def mixed_fraction(match: re.Match[str]) -> str:
    """"2 1/2" -> "5/2" when the fraction is proper; otherwise the whole number stays apart from
    the fraction ("2\\frac{3}{2}" -> "2 \\frac{3}{2}"), so \\frac unwrapping cannot glue it into "23/2"."""
    whole, num, den = int(match[1]), int(match[2] or match[4]), int(match[3] or match[5])
    if not 0 < num < den:
        return f"{match[1]} {match.group()[len(match[1]):].lstrip()}"
    return f"{whole * den + num}/{den}"


def simplify_latex(text: str) -> str:
    if "\\" not in text and "$" not in text and "{," not in text and "°" not in text and "~" not in text:
        return text
    boxed = _last_boxed_content(text)
    if boxed is not None and FINAL_MARKER.search(text, max(text.rfind(cmd) for cmd in BOX_COMMANDS)) is None:
        text = boxed  # unless a final-answer marker after the box states the answer again
    for _ in range(3):  # \text{\textbf{..}} nests rarely deeper than this
        unwrapped = _TEXT_WRAPPER.sub(r" \1 ", text)
        if unwrapped == text:
            break
        text = unwrapped
    text = _THOUSANDS_BANG.sub(",", text)
    text = _MIXED_LATEX.sub(mixed_fraction, text)
    text = _FRAC_BRACED.sub(r"\1/\2", text)
    text = _FRAC_SHORT.sub(r"\1/\2", text)
    text = _DEGREES.sub("", text)
    for old, new in _LATEX_REMOVALS:
        text = text.replace(old, new)
    return " ".join(text.split())


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
SCALE = {"thousand": 10**3, "million": 10**6, "billion": 10**9}


def _scaled(match: re.Match[str]) -> str:
    return format_number(Fraction(match[1]) * SCALE[match[2].lower()])


# A whole number and a fraction in words is one number: "2 and a half hours" is 2.5, never 2 (the reader took
# the 2 and left "and a half" as prose, so "2 and a half" was rewarded against a reference of 2). Likewise
# Chinese "2个半小时" (2.5 hours) and the mixed number "2又1/2".
_FRACTION_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3,
                   "half": 2, "halves": 2, "third": 3, "thirds": 3, "quarter": 4, "quarters": 4, "fourth": 4,
                   "fourths": 4}
_AND_A_FRACTION = re.compile(r"(?<![\d.,/])(\d+)\s+and\s+(an?|one|two|three)\s+"
                             r"(half|halves|thirds?|quarters?|fourths?)\b", re.IGNORECASE)
_AND_A_HALF_ZH = re.compile(r"(?<![\d.,/])(\d+)\s*个半")
_MIXED_ZH = re.compile(r"(?<![\d.,/])(\d+)\s*又\s*(?=\d+\s*/\s*\d+(?![\d.,/]))")


def _and_a_fraction(match: re.Match[str]) -> str:
    value = int(match[1]) + Fraction(_FRACTION_WORDS[match[2].lower()], _FRACTION_WORDS[match[3].lower()])
    return format_number(value)


def simplify_prose(text: str) -> str:
    if "*" in text or "_" in text:
        text = _MARKDOWN_EMPHASIS.sub("", text)
    if "(" in text:
        text = _WORD_PARENTHETICAL.sub(" ", text)
    if " and " in text.lower():
        text = _AND_A_FRACTION.sub(_and_a_fraction, text)
    if "半" in text:
        text = _AND_A_HALF_ZH.sub(lambda match: format_number(int(match[1]) + Fraction(1, 2)), text)
    if "/" in text:
        text = _UNIT_SLASH_LETTER.sub("", _UNIT_SLASH_WORD.sub("", text))
        if "又" in text:
            text = _MIXED_ZH.sub(r"\1 ", text)
        text = _MIXED_NUMBER.sub(mixed_fraction, text)
    if "^" in text:
        text = _POWER_UNIT.sub(r"\1", text)
    if "≈" in text:  # "x \\approx 11" states 11; in "x = 1/3 \\approx 0.33" the exact 1/3 is the answer
        text = _APPROX_AFTER_EXACT.sub(r"\1", text).replace("≈", "=")
    if "illion" in (lowered := text.lower()) or "housand" in lowered:  # _SCALED ignores case: "3 MILLION"
        text = _SCALED.sub(_scaled, text)
    return " ".join(text.split())
