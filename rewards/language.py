"""Language consistency: is the reasoning and the answer written in the language of the question?

Qwen models trained with GRPO on Chinese questions often drift into English or mixed-language reasoning, and the
correctness reward does not care. Off by default; add it to `reward_funcs` (configs/qwen2.5-1.5b-gsm8k-zh.yaml
does). How a language is read and how a completion is scored: docs/rewards.md "Language consistency".
"""

from __future__ import annotations

import re
from typing import Any, Optional

from grpo_pipeline.rewards.cleaning import LATEX_COMMAND
from grpo_pipeline.rewards.completions import completion_text, completion_texts
from grpo_pipeline.rewards.declared import builtin_reward
from grpo_pipeline.rewards.extract import extract_xml_answer
from grpo_pipeline.rewards.format import REASONING_CLOSE, REASONING_OPEN

LANGUAGE_REWARD = 0.5
LANGUAGE_THRESHOLD = 0.9

CJK, LATIN = "cjk", "latin"
# CJK Unified Ideographs, Extension A, Compatibility Ideographs.
_CJK_CHAR = re.compile("[\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff]")
# Runs of ASCII letters and digits: a run of 2+ letters is a word; one with a digit (18, 3x, 2nd, GSM8K) or a
# single letter (a variable) is not. Every pattern here matches in linear time (no nested or unbounded
# backtracking; maths spans are found by _without_maths in one pass), so a megabyte of text costs milliseconds.
_TOKEN = re.compile(r"[A-Za-z0-9]+")
_TAG = re.compile(r"<[^<>\s]{1,40}>")  # <reasoning>, </answer>, <|im_end|>; "x < 5 and y > 3" is no tag
_MATH_DELIMITERS = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_MATH_OPEN = re.compile(r"\$\$|\$|\\\(|\\\[")
_CHATML_USER = re.compile(r"<\|im_start\|>user\n(.*?)(?:<\|im_end\|>|$)", re.S)


def script_counts(text: str) -> dict[str, int]:
    """Units of each script in `text`: CJK ideographs and Latin words of 2+ letters, outside numbers, formulas,
    LaTeX and tags.

    >>> script_counts("<reasoning>He has $\\\\frac{1}{2}$ of 18 apples, so 2x = 9</reasoning>")
    {'cjk': 0, 'latin': 5}
    """
    kept = _TAG.sub(" ", LATEX_COMMAND.sub(" ", _without_maths(text)))
    words = sum(1 for token in _TOKEN.findall(kept) if len(token) > 1 and token.isalpha())
    return {CJK: len(_CJK_CHAR.findall(kept)), LATIN: words}


def _without_maths(text: str) -> str:
    """`text` with its LaTeX maths spans ($...$, $$...$$, \\(...\\), \\[...\\]) blanked, in one pass: once a
    delimiter has no closer after some point, no later opener of that kind is searched again."""
    pieces, position, unclosed = [], 0, set()
    while (opener := _MATH_OPEN.search(text, position)) is not None:
        delimiter = opener.group()
        close = -1 if delimiter in unclosed else text.find(_MATH_DELIMITERS[delimiter], opener.end())
        if close == -1:
            unclosed.add(delimiter)
            pieces.append(text[position:opener.end()])
            position = opener.end()
            continue
        pieces += [text[position:opener.start()], " "]
        position = close + len(_MATH_DELIMITERS[delimiter])
    pieces.append(text[position:])
    return "".join(pieces)


def dominant_script(text: Optional[str]) -> Optional[str]:
    """`"cjk"` or `"latin"`, whichever has more units (a tie goes to CJK); None when there are none.

    >>> dominant_script("一共有多少个苹果？"), dominant_script("How many apples?"), dominant_script("2+3=5")
    ('cjk', 'latin', None)
    """
    counts = script_counts(text or "")
    if not any(counts.values()):
        return None
    return CJK if counts[CJK] >= counts[LATIN] else LATIN


def question_text(prompt: Any) -> Optional[str]:
    """The question a completion answers: the last user message of a conversation, the user turn of a
    ChatML-rendered prompt, or the prompt string itself.

    >>> question_text("<|im_start|>system\\nRespond...<|im_end|>\\n<|im_start|>user\\n几个？<|im_end|>\\n")
    '几个？'
    """
    if isinstance(prompt, str):
        turns = _CHATML_USER.findall(prompt)
        return turns[-1] if turns else prompt
    return completion_text(prompt, role="user")


def language_consistency(completion: Optional[str], question: Optional[str]) -> float:
    """The score of one completion against its question: 0.5 x the mean over its parts (`_parts`) of
    min(1, share in the question's language / LANGUAGE_THRESHOLD), a part without letters scoring 1.

    >>> language_consistency("<reasoning>Xiao Ming has 3 apples</reasoning><answer>3</answer>", "小明有几个苹果？")
    0.25
    """
    if completion is None:
        return 0.0
    target = dominant_script(question) or dominant_script(completion)
    if target is None:
        return LANGUAGE_REWARD
    scores = [min(1.0, counts[target] / sum(counts.values()) / LANGUAGE_THRESHOLD) if any(counts.values()) else 1.0
              for counts in map(script_counts, _parts(completion))]
    return round(LANGUAGE_REWARD * sum(scores) / len(scores), 6)


# off by default (not in DEFAULT_REWARDS): for questions in one language, e.g. Chinese GSM8K
@builtin_reward("language_consistency")
def language_consistency_reward_func(prompts: Any = None, completions: Any = None, **kwargs: Any) -> list[float]:
    """Up to 0.5 per completion when its reasoning and answer are in the language of its prompt's question; without
    `prompts` each completion is held to its own dominant language, so only mixing costs.

    >>> zh = [{"role": "user", "content": "一支笔 3 元，4 支笔多少钱？"}]
    >>> language_consistency_reward_func(prompts=[zh, zh, zh], completions=["<answer>12 元</answer>", "12 yuan", None])
    [0.5, 0.0, 0.0]
    """
    texts = completion_texts(completions)
    questions = list(prompts) if isinstance(prompts, (list, tuple)) else []
    return [language_consistency(text, question_text(questions[i]) if i < len(questions) else None)
            for i, text in enumerate(texts)]


def _parts(text: str) -> list[str]:
    """The reasoning and answer blocks that are present; the whole text when neither is."""
    parts = []
    start = text.find(REASONING_OPEN)
    end = text.find(REASONING_CLOSE, start + 1) if start != -1 else -1
    if start != -1 and end != -1:
        parts.append(text[start + len(REASONING_OPEN):end])
    answer = extract_xml_answer(text)
    if answer:
        parts.append(answer)
    return parts or [text]
