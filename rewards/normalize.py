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

Where each rule lives: rules 1, 2 and 7 in rewards/cleaning.py (characters, LaTeX, prose forms),
rules 3 and 9 in rewards/sentences.py (final-answer markers, the conclusion sentence), rules 4-6
and 8 in rewards/numbers.py (reading the numbers), the model side's number words in
rewards/number_words.py. This module holds the entry points that run them in order.
"""

from __future__ import annotations

import functools
import numbers
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

from grpo_pipeline.rewards.cleaning import BOX_COMMANDS, clean_characters, simplify_latex, simplify_prose
from grpo_pipeline.rewards.number_words import number_words_to_digits
from grpo_pipeline.rewards.numbers import format_number, read_numbers, strip_lone_brackets
from grpo_pipeline.rewards.sentences import (FINAL_MARKER, PROSE_WORD, UNSURE, after_last_marker, after_single_equals,
                               conclusion_value)

# A final answer is short. The cap keeps every regex below on a small input.
MAX_ANSWER_CHARS = 1000

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
    text = text.rstrip()  # trailing padding carries nothing, and must not push the answer out of the window
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    last_marker = -1
    for match in FINAL_MARKER.finditer(text):
        last_marker = match.start()
    start = max(last_marker, *(text.rfind(cmd) for cmd in BOX_COMMANDS))
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
        readable = simplify_prose(simplify_latex(clean_characters(text)))
        if prediction:
            readable = number_words_to_digits(readable)
        marked = after_last_marker(readable)
        cleaned = strip_lone_brackets(after_single_equals(marked))
        if not cleaned:
            return None
        values, is_math = read_numbers(cleaned)
        if values and not is_math and all(v == values[0] for v in values):
            if UNSURE.search(marked):  # "Maybe 18.", "It could be 18": one number, still a hedge
                return ParsedAnswer("ambiguous", None, cleaned)
            return ParsedAnswer("number", values[0], cleaned)
        if values and PROSE_WORD.search(marked):  # prose with several numbers: rule 9
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
