"""Reading a model's answer (rewards/normalize.py, prediction=True): number words become digits.

English ("eighteen", "forty-two") and Chinese ("十八", "一百二十") number words are read only on the
model's side: a reference in words is not a GSM8K reference. Words this reader does not handle
("half", "point", "负"), and runs that are not one number ("three twenty", the range "十五六"),
leave the text as it is rather than guess.
"""

from __future__ import annotations

import re

from grpo_pipeline.rewards.cleaning import SCALE


_SMALL_NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
                  "fifteen sixteen seventeen eighteen nineteen").split()
_TENS_WORDS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_WORD_VALUE = {w: i for i, w in enumerate(_SMALL_NUMBERS)} | {w: 20 + 10 * i for i, w in enumerate(_TENS_WORDS)}
_WORD_SCALE = {"hundred": 100} | SCALE
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
            value = _WORD_VALUE[word]
            if current % 100 and (value >= 10 or current % 10 or current % 100 < 20):
                return match.group()  # "three twenty", "five six": not one number, so not read
            current += value
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
            if digit:
                return match.group()  # "十五六", "三四十", "两三": a range ("15 or 16"), not one number
            digit = _CHINESE_DIGIT[ch]
        elif ch in _CHINESE_UNIT:
            section += max(digit, 1) * _CHINESE_UNIT[ch]  # "十八": a bare 十 is ten
            digit = 0
        else:
            total += (section + digit) * _CHINESE_BIG[ch]
            section = digit = 0
    return str(total + section + digit)


def number_words_to_digits(text: str) -> str:
    """Number words as digits ("eighteen" -> "18", "一百二十" -> "120"), only in text without a digit: in "一共120元"
    the 一 is part of a word, and in "each one costs 5" "one" is not the answer."""
    if any(ch.isdigit() for ch in text):
        return text
    if _UNREAD_WORDS.search(text) is None:
        text = _WORD_RUN.sub(_english_words_value, text)
    if _UNREAD_CHINESE.search(text) is None:
        text = _CHINESE_RUN.sub(_chinese_value, text)
    return text
