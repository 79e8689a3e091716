"""Pull the answer out of a model completion (<answer> block) and out of a GSM8K solution (####), with
str.find/rfind: linear in the text, no regex that can backtrack on a megabyte of repeated tags.
"""

from __future__ import annotations

from typing import Any

from grpo_pipeline.rewards.format import ANSWER_CLOSE, ANSWER_OPEN
from grpo_pipeline.rewards.normalize import normalize_answer

GSM8K_MARKER = "####"


def extract_xml_answer(text: Any) -> str:
    """The stripped content of the LAST <answer> block (a model is judged on its final word); "" when there is
    none (the notebook returned the whole completion, which let a bare "18" score as correct) or for a non-string.
    An unclosed final block runs to the end of the text (the format rewards charge for the tag), without a closing
    tag cut short there by the token limit ("37</").

    >>> extract_xml_answer("<reasoning>...</reasoning>\\n<answer>\\n18\\n</answer>")
    '18'
    """
    return extract_tagged(text, ANSWER_OPEN, ANSWER_CLOSE)


def extract_tagged(text: Any, open_tag: str, close_tag: str) -> str:
    """`extract_xml_answer`'s reading for any pair of tags (a recipe's own, e.g. <SOLUTION></SOLUTION>).

    >>> extract_tagged("<SOLUTION>9</SOLUTION>", "<SOLUTION>", "</SOLUTION>")
    '9'
    """
    if not isinstance(text, str):
        return ""
    start = text.rfind(open_tag)
    if start == -1:
        return ""
    start += len(open_tag)
    end = text.find(close_tag, start)
    if end != -1:
        return text[start:end].strip()
    content = text[start:].rstrip()
    for cut in range(len(close_tag) - 1, 1, -1):  # "</answer" down to "</"
        if content.endswith(close_tag[:cut]):
            return content[:-cut].strip()
    return content.strip()


def extract_hash_answer(text: Any) -> str | None:
    """The GSM8K reference answer after the last "####", as `normalize_answer` writes it; None when there is none.

    >>> extract_hash_answer("Natalia sold 48/2 = 24 clips in May.\\n#### 72")
    '72'
    """
    if not isinstance(text, str):
        return None
    marker = text.rfind(GSM8K_MARKER)
    if marker == -1:
        return None
    return normalize_answer(text[marker + len(GSM8K_MARKER):].strip())
