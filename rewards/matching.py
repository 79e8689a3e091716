"""Whether a predicted final answer equals the reference: the fast reader first (normalize.py: the prediction with
`prediction=True`), math-verify (symbolic.py) only for real mathematics. Pred kind x ref kind:

| pred \\ ref   | number            | expression          | ambiguous           | text          |
|--------------|-------------------|---------------------|---------------------|---------------|
| number       | numbers_match     | symbolic            | False               | False         |
| expression   | symbolic (*)      | same text, symbolic | False               | same text     |
| ambiguous    | False             | False               | same text, symbolic | False         |
| text         | False             | same text           | False               | same text     |

"same text" compares the cleaned answers ignoring case. (*) An expression with a free variable ("2x", "x+1")
cannot equal a plain number: rejected without sympy. An ambiguous prediction ("5 or 18") never matches a single
value: that would reward listing several numbers. Substrings never match: "142" != "42", "4.2" != "42".
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from grpo_pipeline.rewards.cleaning import LATEX_COMMAND
from grpo_pipeline.rewards.normalize import parse_answer
from grpo_pipeline.rewards.symbolic import symbolic_equal

# Two integers must be equal: at GSM8K scale any relative slack would let 999999998 equal
# 999999999. An integer against a non-integer gets only float-noise slack (a generated
# reference like 18.000000000000004). Two non-integers get ~1e-6 relative, enough for
# 0.333333 vs 1/3 and 12.344999999999999 vs 12.345.
_MIXED_REL_TOL = Fraction(1, 10**12)
_REL_TOL = Fraction(1, 10**6)
_ABS_TOL = Fraction(1, 10**9)

# LaTeX commands (\sqrt, \pi, \frac) are not variables; what is left and alphabetic is.
_FREE_VARIABLE = re.compile(r"[A-Za-z]")


def numbers_match(a: Fraction, b: Fraction) -> bool:
    """Exact-or-within-tolerance equality of two exact numbers (the tolerances above), in exact fractions so the
    boundary does not wobble.

    >>> numbers_match(Fraction(1, 3), Fraction("0.333333")), numbers_match(Fraction(999999998), Fraction(999999999))
    (True, False)
    """
    if a == b:
        return True
    a_integral, b_integral = a.denominator == 1, b.denominator == 1
    if a_integral and b_integral:
        return False
    rel = _MIXED_REL_TOL if a_integral or b_integral else _REL_TOL
    return abs(a - b) <= rel * max(abs(a), abs(b)) + _ABS_TOL


def answers_match(pred: Any, ref: Any) -> bool:
    """True when the predicted answer equals the reference (the table above); missing, empty or unreadable
    answers never match. Never raises.

    >>> answers_match("$1,234", "1234"), answers_match("142", "42"), answers_match("5 or 18", "18")
    (True, False, False)
    """
    p, r = parse_answer(pred, prediction=True), parse_answer(ref)
    if p is None or r is None:
        return False
    if p.kind == "number" and r.kind == "number":
        assert p.value is not None and r.value is not None
        return numbers_match(p.value, r.value)
    if p.cleaned.casefold() == r.cleaned.casefold():  # not space-insensitive: "1 23" must not equal "123"
        return True
    kinds = {p.kind, r.kind}
    if kinds == {"ambiguous"}:
        return symbolic_equal(p.cleaned, r.cleaned)  # e.g. "2, 3" vs "3, 2" as sets
    if "ambiguous" in kinds or "text" in kinds:
        return False
    if "number" in kinds:
        expression = p if p.kind == "expression" else r
        if _FREE_VARIABLE.search(LATEX_COMMAND.sub("", expression.cleaned)) is not None:
            return False
    return symbolic_equal(p.cleaned, r.cleaned)
