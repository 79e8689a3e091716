"""Clean raw rows and reject the unusable ones, each with a reason code (REJECT_REASONS) for data_report.json.
Pure Python (no tokenizer, no datasets).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from grpo_pipeline.pipeline.data.prompts import question_text
from grpo_pipeline.rewards.extract import GSM8K_MARKER

BOM = "\ufeff"
# GSM8K's calculator annotations inside worked solutions: "48/2 = <<48/2=24>>24".
CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")

# Every reason code, in the report's order, and what it means.
REJECT_REASONS = {
    "missing_question": "question is null / absent",
    "empty_question": "question is empty after cleaning",
    "non_string_field": "question is not text, or answer is not text or a number",
    "invalid_prompt": "TRL's `prompt` is neither text nor a list of {\"role\": str, \"content\": str} messages",
    "missing_answer": "answer is null / absent / empty after cleaning",
    "unparseable_answer": "answer has a GSM8K `####` marker with nothing readable after it",
    "unscorable_answer": "the correctness reward cannot read the answer as one final answer (\"five and a half\", "
                         "\"18 or 20\"): the prompt would give no learning signal (keep_unscorable keeps it)",
    "duplicate": "same cleaned question and answer as an earlier row (the first is kept)",
    "prompt_too_long": "(set later, by the length check) over max_prompt_length",
}


def clean_text(text: str) -> str:
    """Strip BOMs, turn CRLF and lone CR into LF, normalise to NFC (a letter + combining mark, from PDFs or macOS
    file names, would otherwise tokenize differently from the one code point), trim the ends.

    >>> clean_text("\\ufeffWhat is 1+1?\\r\\nThink.\\r")
    'What is 1+1?\\nThink.'
    """
    text = text.replace(BOM, "")  # U+FEFF mid-text is an invisible zero-width no-break space: junk too
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", text).strip()


def clean_column_name(name: str) -> str:
    """A column name without a BOM or surrounding blanks.

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
    solution: str = ""  # worked solution for the format warm-up ("" when the row has none)
    scorable: bool = True  # False only for rows kept by keep_unscorable
    index: int = -1  # the row's position in the source (its other columns are read from there)
    prompt: Any = None  # TRL's prompt as written (trl_prompts); None for question/answer rows


@dataclass
class Rejections:
    """Rejected row ids by reason, in source order."""

    ids_by_reason: dict[str, list[str]] = field(default_factory=dict)
    answers_checked: int = 0  # rows whose answer reached the scorability check
    unscorable_kept: list[str] = field(default_factory=list)  # unscorable rows kept (keep_unscorable)

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
    """The answer as text, a whole float without ".0" (CSV makes 42 42.0 in a column with a gap); else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else repr(value)
    return None


def check_prompt(value: Any) -> tuple[Any, Optional[str]]:
    """(TRL prompt as written, None), or (None, the reason code it is rejected with): a string, or {"role": str,
    "content": str} messages with some text outside the system message. Not cleaned: TRL uses it as written.

    >>> check_prompt(None), check_prompt("  "), check_prompt({"text": "2+2"}), check_prompt([{"role": "user"}])
    ((None, 'missing_question'), (None, 'empty_question'), (None, 'invalid_prompt'), (None, 'invalid_prompt'))
    """
    if value is None:
        return None, "missing_question"
    if isinstance(value, str):
        return (value, None) if value.strip() else (None, "empty_question")
    if not isinstance(value, (list, tuple)) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        return None, "invalid_prompt"
    if not any(m["content"].strip() for m in value if m["role"] != "system"):
        return None, "empty_question"
    return [{k: v for k, v in m.items() if v is not None} for m in value], None


def worked_solution(value: Any, answer_text: str) -> str:
    """A row's worked solution: its solution_field value, else a GSM8K answer's text before `####` (calculator
    notes removed); "" when there is none.

    >>> worked_solution(None, "She sold 48/2 = <<48/2=24>>24 clips.\\n#### 24")
    'She sold 48/2 = 24 clips.'
    """
    if isinstance(value, str):
        return clean_text(value)
    if value is not None or GSM8K_MARKER not in answer_text:
        return ""
    return clean_text(CALCULATOR_NOTE.sub("", answer_text[:answer_text.rfind(GSM8K_MARKER)]))


def _question_and_answer(raw_question: Any, answer: Any) -> tuple[str, str] | str:
    """A question/answer row's cleaned (question, answer), or the reason code it is rejected with."""
    if raw_question is None:
        return "missing_question"
    if not isinstance(raw_question, str):
        return "non_string_field"
    question = clean_text(raw_question)
    if not question:
        return "empty_question"
    if answer is None:
        return "missing_answer"
    answer_text = _answer_text(answer)
    if answer_text is None:
        return "non_string_field"
    answer_text = clean_text(answer_text)
    return (question, answer_text) if answer_text else "missing_answer"


def clean_rows(
    questions: Iterable[Any],
    answers: Iterable[Any],
    ids: Iterable[str],
    extract_hash_answer: Callable[[str], Optional[str]],
    solutions: Optional[Iterable[Any]] = None,
    is_scorable: Optional[Callable[[str], bool]] = None,
    keep_unscorable: bool = False,
    trl_prompts: bool = False,
) -> tuple[list[CleanRow], Rejections]:
    """The usable rows (source order) and the rejected ids by reason. A GSM8K `####` answer is reduced by
    `extract_hash_answer`; one `is_scorable` (rewards.reference_is_scorable) cannot read is rejected, or kept and
    listed with `keep_unscorable`. With `trl_prompts`, `questions` are TRL prompts kept as written, and no row is
    rejected for its answer: the user's rewards read that column.

    >>> rows, rejected = clean_rows(["Q1", " ", None, "Q1"], ["#### 7", "1", "2", "#### 7"], ["a", "b", "c", "d"],
    ...                             lambda t: t.split("####")[1].strip() or None)
    >>> [(r.id, r.answer) for r in rows], rejected.ids_by_reason
    ([('a', '7')], {'empty_question': ['b'], 'missing_question': ['c'], 'duplicate': ['d']})
    """
    kept: list[CleanRow] = []
    rejected = Rejections()
    seen: set[tuple[str, str]] = set()
    ids = list(ids)
    solutions = list(solutions) if solutions is not None else [None] * len(ids)
    for index, (row_id, raw_question, answer, raw_solution) in enumerate(
            zip(ids, questions, answers, solutions, strict=True)):
        prompt = None
        if trl_prompts:
            prompt, checked = check_prompt(raw_question)
            checked = checked or (question_text(prompt), clean_text(_answer_text(answer) or ""))
        else:
            checked = _question_and_answer(raw_question, answer)
        if isinstance(checked, str):
            rejected.add(checked, row_id)
            continue
        question, answer_text = checked
        solution = worked_solution(raw_solution, answer_text)
        if GSM8K_MARKER in answer_text:
            final = extract_hash_answer(answer_text)
            if (final is None or not str(final).strip()) and not trl_prompts:
                rejected.add("unparseable_answer", row_id)
                continue
            answer_text = str(final or "").strip()
        scorable = True
        if is_scorable is not None and answer_text:
            rejected.answers_checked += 1
            scorable = is_scorable(answer_text)
            if not scorable and not keep_unscorable and not trl_prompts:
                rejected.add("unscorable_answer", row_id)
                continue
        # Exact repeats only spend rollouts twice on one problem: the first is kept.
        key = (question if prompt is None else repr(prompt), answer_text)
        if key in seen:
            rejected.add("duplicate", row_id)
            continue
        seen.add(key)
        if not scorable:
            rejected.unscorable_kept.append(row_id)
        kept.append(CleanRow(id=row_id, question=question, answer=answer_text, solution=solution,
                             scorable=scorable, index=index, prompt=prompt))
    return kept, rejected
