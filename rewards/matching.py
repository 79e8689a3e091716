"""Decide whether a predicted final answer equals the reference answer.

Fast numeric path first (normalize.py), math-verify only for real mathematics
(symbolic.py). The decision table, pred kind x ref kind:

| pred \\ ref   | number            | expression          | ambiguous           | text          |
|--------------|-------------------|---------------------|---------------------|---------------|
| number       | numbers_match     | symbolic            | False               | False         |
| expression   | symbolic (*)      | same text, symbolic | False               | same text     |
| ambiguous    | False             | False               | same text, symbolic | False         |
| text         | False             | same text           | False               | same text     |

"same text" compares the cleaned answers (whitespace already collapsed) ignoring case.
(*) An expression with a free variable ("2x", "x+1") cannot equal a plain number, so it is
rejected without sympy.
An ambiguous prediction ("5 or 18") is never accepted against a single value: matching it
would reward listing several numbers. Substrings never match: "142" != "42", "4.2" != "42".

The prediction is read with `parse_answer(pred, prediction=True)`; the reference without it.
How each form is read, and why the rule cannot turn a wrong answer into a right one:

| form (prediction)                  | read as                       | why it is safe                                   |
|------------------------------------|-------------------------------|--------------------------------------------------|
| conclusion sentence: "..., which is 132 loaves in total" | the number after the last assertion cue (`conclusion_value`) | only the number the sentence asserts; a "=" that starts a second equation ("x = 5 and y = 3") reads as nothing; operands ("31 - 19 = 12": 12, not 19), chain middles ("35 + 2 = 37": 37), a later number not in a prepositional phrase, any hedge or take-back word ("or", "maybe", "but", "between") and sentences without a cue all read as nothing |
| "maybe 18", "it could be 18", "at most 18" | ambiguous                 | uncertainty is not an answer, even with one number |
| "\\boxed{18} or \\boxed{20}"        | ambiguous                     | two boxes joined only by a separator are a list; a box far earlier in the working is not |
| truncated tag "37</", "81</answer" | 37, 81                        | only a prefix of "</answer>" at the very end is cut |
| units "60 km/h", "$15/hour", "10 ft²", "5m", "\\text{ m}" | the number       | a slash before a word, a power only on a length unit, and only unit letters m g h s l glued; "15/x", "10 x^2", "2x", "5k" stay expressions |
| mixed number "2 1/2", "2\\frac{1}{2}" | 5/2                        | only a proper fraction after a whole number; "2 1/2" never equals 2 or 1/2 |
| markdown "**18**", parenthetical "18 (approximately)" | 18           | only "**"/"__" and brackets holding words alone are dropped; "(or 20)" keeps its number |
| number words "eighteen", "十八", "1.2 million" | 18, 18, 1200000     | prediction only, and only in text without digits; words the converter does not read fully ("half", "point", "minus", 点, 负, 半) leave the text unread |
| "11,\\! 111", "x \\approx 11", "x = 1/3 \\approx 0.33" | 11111, 11, 1/3 | a comma before "\\!" is a thousands comma; an approximation after an exact value is dropped, otherwise it is the stated value |
| decimal comma "1000,99", "2,74", "0,111" | 1000.99, 2.74, 0.111   | GSM8K thousands ("1,234", nonzero lead, groups of three) keep their reading; a comma list without spaces ("18,20") reads as a non-integer and equals no integer answer |
| chat-template tokens, "I hope it is correct" | cut there                | text after them is a new turn or commentary      |
| over 1,000 characters              | from the last \\boxed{} or final-answer marker, else the tail | the window holds the final statement; what it drops is earlier working |
| reference in words, or with no digit ("forty two", "n/a") | None (not judged) | a GSM8K reference is a number; guessing would grade against a misread label |

Cost: the fast path reads all of these with linear regexes. math-verify runs only for real
mathematics; its verdicts are cached and each correctness call has a time budget
(rewards/symbolic.py `time_budget`, rewards/correctness.py `SYMBOLIC_BUDGET_S`).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from rewards.normalize import ParsedAnswer, parse_answer
from rewards.symbolic import symbolic_equal

# Two integers must be equal: at GSM8K scale any relative slack would let 999999998 equal
# 999999999. An integer against a non-integer gets only float-noise slack (a generated
# reference like 18.000000000000004). Two non-integers get ~1e-6 relative, enough for
# 0.333333 vs 1/3 and 12.344999999999999 vs 12.345.
_MIXED_REL_TOL = Fraction(1, 10**12)
_REL_TOL = Fraction(1, 10**6)
_ABS_TOL = Fraction(1, 10**9)

# LaTeX commands (\sqrt, \pi, \frac) are not variables; what is left and alphabetic is.
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_FREE_VARIABLE = re.compile(r"[A-Za-z]")


def numbers_match(a: Fraction, b: Fraction) -> bool:
    """Exact-or-within-tolerance equality of two exact numbers.

    Two integers: equal. Otherwise |a - b| <= rel * max(|a|, |b|) + 1e-9, with rel = 1e-12 when
    one side is an integer and 1e-6 when neither is. Computed in exact fractions, so the
    boundary does not wobble.

    >>> numbers_match(Fraction(1, 2), Fraction("0.5")), numbers_match(Fraction(1, 3), Fraction("0.333333"))
    (True, True)
    >>> numbers_match(Fraction(999999998), Fraction(999999999)), numbers_match(Fraction("4.2"), Fraction(42))
    (False, False)
    """
    if a == b:
        return True
    a_integral, b_integral = a.denominator == 1, b.denominator == 1
    if a_integral and b_integral:
        return False
    rel = _MIXED_REL_TOL if a_integral or b_integral else _REL_TOL
    return abs(a - b) <= rel * max(abs(a), abs(b)) + _ABS_TOL


def answers_match(pred: Any, ref: Any) -> bool:
    """True when the predicted answer equals the reference. Never raises.

    Both sides go through the same reader, so "1,234", "$1234", "1 234 dollars", "答案：1234"
    all equal "1234"; "1/2", "0.5", "\\frac{1}{2}" are equal; "50%" equals "50".
    Missing, empty or unreadable answers never match.

    >>> answers_match("$1,234", "1234"), answers_match("\\\\boxed{\\\\dfrac{1}{2}}", "0.5")
    (True, True)
    >>> answers_match("142", "42"), answers_match("5 or 18", "18"), answers_match(None, "18")
    (False, False, False)
    """
    p, r = parse_answer(pred, prediction=True), parse_answer(ref)
    if p is None or r is None:
        return False
    if p.kind == "number" and r.kind == "number":
        assert p.value is not None and r.value is not None
        return numbers_match(p.value, r.value)
    if _same_text(p, r):
        return True
    kinds = {p.kind, r.kind}
    if kinds == {"ambiguous"}:
        return symbolic_equal(p.cleaned, r.cleaned)  # e.g. "2, 3" vs "3, 2" as sets
    if "ambiguous" in kinds or "text" in kinds:
        return False
    if "number" in kinds:
        expression = p if p.kind == "expression" else r
        if _has_free_variable(expression.cleaned):
            return False
    return symbolic_equal(p.cleaned, r.cleaned)


def _same_text(p: ParsedAnswer, r: ParsedAnswer) -> bool:
    # Case-insensitive but not space-insensitive: "1 23" must not equal "123".
    return p.cleaned.casefold() == r.cleaned.casefold()


def _has_free_variable(latex: str) -> bool:
    return _FREE_VARIABLE.search(_LATEX_COMMAND.sub("", latex)) is not None
