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

| form (prediction)                        | read as            | why it is safe (see notes)         |
|------------------------------------------|--------------------|------------------------------------|
| "..., which is 132 loaves in total"      | 132                | (a) only the asserted number       |
| "maybe 18", "it could be 18", "at most 18" | ambiguous        | (b) uncertainty is no answer       |
| "\\boxed{18} or \\boxed{20}"             | ambiguous          | (b) a list of boxes                |
| "37</", "81</answer"                     | 37, 81             | (c) only a tag prefix at the end   |
| "60 km/h", "$15/hour", "10 ft²", "5m"    | the number         | (d) unit shapes only               |
| "2 1/2", "2\\frac{1}{2}"                  | 5/2                | (e) proper fractions only          |
| "**18**", "18 (approximately)"           | 18                 | (f) words-only brackets            |
| "eighteen", "十八", "1.2 million"        | 18, 18, 1200000    | (g) digit-free text only           |
| "11,\\! 111", "x \\approx 11"            | 11111, 11          | (h) an exact value wins            |
| "1000,99", "2,74", "0,111"               | decimal comma      | (i) GSM8K thousands keep theirs    |
| "<|im_start|>...", "I hope it is correct" | cut there         | (j) what follows is not the answer |
| over 1,000 characters                    | a window           | (k) the final statement is kept    |
| reference "forty two", "n/a"             | None (not judged)  | (l) a reference is a number        |

(a) `conclusion_value`: the last sentence with a digit, at its last assertion cue. Operands
    ("31 - 19 = 12": 12, not 19) and chain middles ("35 + 2 = 37": 37) are never read; a
    later number outside a prepositional phrase, any hedge or take-back word ("or", "but",
    "between"), a "=" that starts a second equation ("x = 5 and y = 3") and a sentence
    without a cue all read as nothing.
(b) Applies with one number too; two boxes joined only by a separator are a list, a box far
    earlier in the working is not.
(c) A prefix of "</answer>" at the very end of the text is the tag cut by the token limit.
(d) A slash before a word, a power only on a length unit, only the unit letters m g h s l
    glued: "15/x", "10 x^2", "2x" and "5k" stay expressions.
(e) "2 1/2" never equals 2 or 1/2; "3 5/4" is not a mixed number.
(f) Only "**"/"__" and brackets holding words alone are dropped: "(or 20)" keeps its number.
(g) Prediction side only, and only in text without digits; words the converter does not read
    fully ("half", "point", "minus", 点, 负, 半) leave the text unread.
(h) A comma before "\\!" is a thousands comma; an approximation after an exact value is dropped
    ("x = 1/3 \\approx 0.33" is 1/3), otherwise it is the stated value.
(i) "1,234" (nonzero lead, groups of three) stays thousands; a comma list without spaces
    ("18,20") reads as 18.2 and equals no integer answer.
(j) Chat-template tokens start a new turn; the sign-off ends a common answer template.
(k) From the last \\boxed{} or final-answer marker, else the tail: what it drops is working.
(l) A GSM8K reference is a number; grading against a misread label would teach noise.

Cost: the fast path reads all of these with linear regexes. math-verify runs only for real
mathematics; its verdicts are cached and each correctness call has a time budget
(rewards/symbolic.py `time_budget`, rewards/correctness.py `SYMBOLIC_BUDGET_S`).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from grpo_pipeline.rewards.normalize import ParsedAnswer, parse_answer
from grpo_pipeline.rewards.symbolic import symbolic_equal

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
