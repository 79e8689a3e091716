"""Read a free-form final answer ("$1,234", "答案：18", "\\boxed{\\frac12}") into a comparable form: the fast path
of answer checking (string work and linear regexes, no sympy). An answer is a `number` (one value, possibly
repeated), `ambiguous` (several different numbers and no final-answer marker, or a hedge: never guessed),
`expression` (maths the numeric reader must not flatten: "2x", "\\sqrt{2}", "(1, 2)"; matching.py hands it to
math-verify) or `text` ("Monday"). The rules, each a reason a notebook reward marked a right answer wrong:

1. Garbage (U+FFFD, zero-width and bidi marks, control characters) is dropped; NFKC folds "１８" and "："; U+2212
   is "-".
2. LaTeX: the last `\\boxed{}`/`\\fbox{}` is the answer; `\\text{}` unwrapped, numeric `\\frac{a}{b}` becomes a/b.
3. Only what follows the last final-answer marker ("answer is", "答案：", ...) is read, then only what follows a
   single "=": "5 + 13 = 18" is 18.
4. "," or a space between groups of three separates thousands; decimals, a/b and e-notation are read exactly
   (`fractions.Fraction`); currency and unit words around a number are ignored.
5. "50%" reads as 50 (GSM8K writes "#### 50"), never also 0.5: both readings would accept "0.2%" for 0.2.
6. A single Latin/Greek letter glued to a number ("2x", "2π"), operators or brackets make an expression; a word
   glued to it is a unit ("18km"), and so is one of the letters m g h s l ("5m").
7. Accepted forms: "**18**", "18 (approximately)", "$15/hour", "10 ft²", "2 1/2" (5/2), "1.2 million".
8. A comma between digits outside GSM8K's thousands shape ("1,234") is a decimal comma: "18,20" is 18.2.
9. Prose with several different numbers: the number its last sentence asserts (`conclusion_value`), or nothing.
   A hedge ("maybe 18", "\\boxed{18} or \\boxed{20}") is ambiguous even with one number.

The model's side (`prediction=True`) also reads number words ("eighteen", "十八"), cuts chat-template tokens and what
follows them, and reads a long answer at its last \\boxed{} or marker, else its last MAX_ANSWER_CHARS characters. A
reference gets none of these ("forty two" is no GSM8K reference), and one over MAX_ANSWER_CHARS is not read. Rules
1, 2, 7 live in rewards/cleaning.py, 3 and 9 in sentences.py, 4-6 and 8 in numbers.py.
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
    """What the fast path made of an answer. `value` is set only for kind "number"; `cleaned` (the text after
    the rules, before reading numbers) is what the symbolic path and string comparison use."""

    kind: AnswerKind
    value: Fraction | None
    cleaned: str


def parse_answer(text: Any, *, prediction: bool = False) -> ParsedAnswer | None:
    """Classify a final answer (`prediction=True`: the model's side, see the module docstring); None when there
    is nothing to read. Numbers (numpy's included) are read as text, other non-strings give None. Never raises.

    >>> parse_answer("The answer is $1,234.")
    ParsedAnswer(kind='number', value=Fraction(1234, 1), cleaned='1,234.')
    """
    if type(text) is not str:  # exact type check first: the ABC checks below are slow
        if isinstance(text, bool) or not isinstance(text, (str, numbers.Real, Decimal)):  # numpy scalars are Real
            return None
        text = str(text)
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
    """At most MAX_ANSWER_CHARS of a model's answer (see the module docstring); a tail is cut at a space so no
    number is cut in half. Linear in the text."""
    if "<|" in text or "hope" in text:
        token = _TEMPLATE_TOKEN.search(text)
        if token is not None:
            text = text[:token.start()]
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    text = text.rstrip()  # trailing padding carries nothing, and must not push the answer out of the window
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    last_marker = max((match.start() for match in FINAL_MARKER.finditer(text)), default=-1)
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
    """A canonical string for an answer: a number's `format_number`, anything else its cleaned text; None when
    there is none.

    >>> normalize_answer("1,234"), normalize_answer("$18.00"), normalize_answer("答案：１８元")
    ('1234', '18', '18')
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
