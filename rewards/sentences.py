"""Reading an answer, rules 3 and 9 of rewards/normalize.py: which part of the text is the answer (what follows
a final-answer marker or a single "=", or the number the conclusion sentence asserts).
"""

from __future__ import annotations

import re
from fractions import Fraction

from grpo_pipeline.rewards.numbers import MATH_CHARS, NUMBER, glued_single_letter, number_value, read_numbers


FINAL_MARKER = re.compile(
    r"(?:final\s+)?answer\s*(?:is|:|=|would\s+be|will\s+be|(?=[-+(\[]?\d))|答案\s*(?:是|为|為|:)|答\s*:",
    re.IGNORECASE,
)
# A lone "=" (not <=, >=, ==, !=, :=) also marks the final value: "5 + 13 = 18".
_EQUALS = re.compile(r"(?<![<>!=:])=(?!=)")
# Punctuation between a marker and its value: not "-" ("answer is -3" keeps its sign), and not a "." that
# starts a decimal ("answer is .5" is 0.5, not 5).
_LEADING_PUNCT = re.compile(r"(?:[ :;,。，、]|\.(?!\d))*")


def _value_after(text: str, end: int) -> str:
    """The text after position `end`, without the punctuation that separates it from a marker."""
    rest = text[end:]
    return rest[_LEADING_PUNCT.match(rest).end():].strip()


def after_last_marker(text: str) -> str:
    """The text after the last final-answer marker (the whole text when there is none)."""
    last = None
    for last in FINAL_MARKER.finditer(text):
        pass
    if last is not None:
        text = _value_after(text, last.end()) or text
    return text


def after_single_equals(text: str) -> str:
    """The text after the "=" if exactly one is present: "x = 5, y = 3" is a system of equations (reading it as 3
    would accept "x = 4, y = 3"), and stays whole for the symbolic path."""
    equals = list(_EQUALS.finditer(text))
    if len(equals) == 1:
        text = _value_after(text, equals[0].end()) or text
    return text


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")
# Doubt about a number. "could"/"might" in a relative clause describe the quantity ("the most points that could be
# in the domain is 19"), so they do not hedge there.
_DOUBT = (r"\b(?:maybe|perhaps|possibly|probably|unsure|guess|at\s+(?:most|least)|up\s+to)\b"
          r"|(?<!that )(?<!which )(?<!who )\b(?:could|might|may)\b|not\s+sure|可能|也许|大概")
# Anything that offers a second possibility or takes the statement back. One of these in the concluding sentence
# and nothing is read: a hedge is never rewarded.
_HEDGE = re.compile(rf"{_DOUBT}|\b(?:or|either|between|but|however|actually|wait|instead|rather)\b|或|还是|但",
                    re.IGNORECASE)
# Uncertainty about a single number ("Maybe 18.", "It could be 18."): not rewarded either.
UNSURE = re.compile(rf"{_DOUBT}|\b(?:i\s+think|i\s+believe|not\s+certain)\b", re.IGNORECASE)
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


PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}|[\u4e00-\u9fff]")


def conclusion_value(text: str) -> Fraction | None:
    """The number the last sentence with a digit asserts, or None; each step can only refuse, never guess (a hedge,
    no cue and more than one number, a second equation, a later different number outside a phrase like "during the
    60 days"). Sentences end at ". ", "!", "?", "。", not at ";", which joins equations ("p = 0; q = 1").

    >>> conclusion_value("The bakery sold 37 + 95, which is 132 loaves in total.")
    Fraction(132, 1)
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
        values, is_math = read_numbers(sentence)
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
    matches = list(NUMBER.finditer(after))
    if not matches:
        return None
    first = matches[0]
    if any(ch in MATH_CHARS for ch in after[:first.start()]):
        return None
    if glued_single_letter(after, first.start() - 1, -1) or glued_single_letter(after, first.end(), +1):
        return None
    value = number_value(first)
    if value is None:
        return None
    previous_end = first.end()
    in_phrase = False  # past a preposition after the answer: "$6 for 2 tubs and 4 packets"
    for match in matches[1:]:
        between = after[previous_end:match.start()]
        if any(ch in MATH_CHARS for ch in between) or match["sign"] is not None:
            return None
        in_phrase = in_phrase or _PREPOSITION.search(between) is not None
        if number_value(match) != value and not in_phrase:
            return None
        previous_end = match.end()
    if any(ch in MATH_CHARS for ch in after[previous_end:]):
        return None
    return value
