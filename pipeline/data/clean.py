"""Clean raw question/answer rows and reject the unusable ones, each with a reason.

Nothing is dropped without a reason code; `pipeline.data.prepare` puts the codes, counts and
row ids into data_report.json. The reason codes:

    missing_question    question is null / absent
    empty_question      question is empty after cleaning
    non_string_field    question is not text, or answer is not text or a number
    missing_answer      answer is null / absent / empty after cleaning
    unparseable_answer  answer has a GSM8K `####` marker with nothing readable after it
    duplicate           same cleaned question and answer as an earlier row (the first is kept)
    prompt_too_long     (set later, by the length check) over max_prompt_length

This module is pure Python (no tokenizer, no datasets).
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from rewards.extract import GSM8K_MARKER
BOM = "\ufeff"

REJECT_REASONS = (
    "missing_question",
    "empty_question",
    "non_string_field",
    "missing_answer",
    "unparseable_answer",
    "duplicate",
    "prompt_too_long",
)


def clean_text(text: str) -> str:
    """Strip BOMs, turn CRLF and lone CR into LF, normalise to Unicode NFC, trim the ends.

    NFC matters because the same visible character can arrive as one code point or as a
    letter plus a combining mark (copy-paste from PDFs, macOS file names); the tokenizer
    splits those differently, so two "equal" questions would get different tokens.

    >>> clean_text("\\ufeffWhat is 1+1?\\r\\nThink.\\r")
    'What is 1+1?\\nThink.'
    >>> clean_text("cafe\\u0301") == "caf\\u00e9"
    True
    """
    text = text.replace(BOM, "")  # U+FEFF mid-text is an invisible zero-width no-break space: junk too
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", text).strip()


def clean_column_name(name: str) -> str:
    """A column name without a leading BOM or surrounding blanks (`\\ufeffquestion` -> `question`).

    >>> clean_column_name("\\ufeffquestion ")
    'question'
    """
    return name.replace(BOM, "").strip()


@dataclass
class CleanRow:
    """One usable row: cleaned question, the reference answer, and its source id."""

    id: str
    question: str
    answer: str


@dataclass
class Rejections:
    """Rejected row ids by reason, in source order."""

    ids_by_reason: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, row_id: str) -> None:
        assert reason in REJECT_REASONS, reason
        self.ids_by_reason.setdefault(reason, []).append(row_id)

    @property
    def total(self) -> int:
        return sum(len(ids) for ids in self.ids_by_reason.values())

    def summary(self, max_ids: int = 20) -> dict[str, dict[str, Any]]:
        """{reason: {"count": n, "ids": first max_ids ids}} in REJECT_REASONS order."""
        return {
            reason: {"count": len(self.ids_by_reason[reason]), "ids": self.ids_by_reason[reason][:max_ids]}
            for reason in REJECT_REASONS
            if self.ids_by_reason.get(reason)
        }


def _answer_text(value: Any) -> Optional[str]:
    """The answer as text, or None when it is not text or a plain number.

    Numbers are accepted because a JSONL file with `"answer": 42` is a normal way to write a
    plain answer. Integral floats print without ".0" (CSV readers turn 42 into 42.0 when a
    column has a gap). Booleans, lists and mappings are not answers.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else repr(value)
    return None


def clean_rows(
    questions: Iterable[Any],
    answers: Iterable[Any],
    ids: Iterable[str],
    extract_hash_answer: Callable[[str], Optional[str]],
) -> tuple[list[CleanRow], Rejections]:
    """Clean every row; return the usable rows (source order) and the rejected ids by reason.

    Answers holding the GSM8K `####` marker are reduced to the final answer by
    `extract_hash_answer`; plain answers are kept as written (cleaned).

    >>> rows, rejected = clean_rows(["Q1", " ", None, "Q1"], ["#### 7", "1", "2", "#### 7"], ["a", "b", "c", "d"],
    ...                             lambda t: t.split("####")[1].strip() or None)
    >>> [(r.id, r.answer) for r in rows], rejected.ids_by_reason
    ([('a', '7')], {'empty_question': ['b'], 'missing_question': ['c'], 'duplicate': ['d']})
    """
    kept: list[CleanRow] = []
    rejected = Rejections()
    seen: set[tuple[str, str]] = set()
    for row_id, raw_question, answer in zip(ids, questions, answers, strict=True):
        if raw_question is None:
            rejected.add("missing_question", row_id)
            continue
        if not isinstance(raw_question, str):
            rejected.add("non_string_field", row_id)
            continue
        question = clean_text(raw_question)
        if not question:
            rejected.add("empty_question", row_id)
            continue
        if answer is None:
            rejected.add("missing_answer", row_id)
            continue
        answer_text = _answer_text(answer)
        if answer_text is None:
            rejected.add("non_string_field", row_id)
            continue
        answer_text = clean_text(answer_text)
        if not answer_text:
            rejected.add("missing_answer", row_id)
            continue
        if GSM8K_MARKER in answer_text:
            final = extract_hash_answer(answer_text)
            if final is None or not str(final).strip():
                rejected.add("unparseable_answer", row_id)
                continue
            answer_text = str(final).strip()
        # Exact repeats (same question, same answer) only spend rollouts twice on one problem;
        # the first copy is kept and the rest are reported.
        key = (question, answer_text)
        if key in seen:
            rejected.add("duplicate", row_id)
            continue
        seen.add(key)
        kept.append(CleanRow(id=row_id, question=question, answer=answer_text))
    return kept, rejected
