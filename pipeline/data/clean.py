"""Clean raw question/answer rows and reject the unusable ones, each with a reason code (REJECT_REASONS), which
`grpo_pipeline.pipeline.data.prepare` puts with counts and row ids into data_report.json. Pure Python (no
tokenizer, no datasets).
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
    """The answer as text (`"answer": 42` in JSONL is normal; an integral float prints without ".0": CSV readers
    turn 42 into 42.0 in a column with a gap), or None when it is not text or a plain number."""
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
    """A TRL prompt as written and None, or None and the reason code it is rejected with. A standard prompt is
    a string; a conversational one a list of {"role": str, "content": str} messages (TRL's is_conversational)
    with some text outside the system message. Neither is cleaned: TRL gives the model the prompt as written.

    >>> check_prompt("2+2="), check_prompt([{"role": "user", "content": "2+2?"}])
    (('2+2=', None), ([{'role': 'user', 'content': '2+2?'}], None))
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
    """The worked solution of a row: its solution_field value, else a GSM8K answer's text before `####`
    (calculator notes `<<48/2=24>>` removed); "" when there is none.

    >>> worked_solution(None, "She sold 48/2 = <<48/2=24>>24 clips.\\n#### 24")
    'She sold 48/2 = 24 clips.'
    >>> worked_solution("6*3=18", "18"), worked_solution(None, "18")
    ('6*3=18', '')
    """
    if isinstance(value, str):
        return clean_text(value)
    if value is not None or GSM8K_MARKER not in answer_text:
        return ""
    return clean_text(CALCULATOR_NOTE.sub("", answer_text[:answer_text.rfind(GSM8K_MARKER)]))


def _question_and_answer(raw_question: Any, answer: Any) -> tuple[str, str] | str:
    """A question/answer row's cleaned question and answer text, or the reason code (a str) it is rejected with."""
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
    """Clean every row; return the usable rows (source order) and the rejected ids by reason.

    Answers holding the GSM8K `####` marker are reduced to the final answer by
    `extract_hash_answer`; plain answers are kept as written (cleaned). `is_scorable` (the correctness
    reward's reader, rewards.reference_is_scorable) rejects answers it cannot read as `unscorable_answer`,
    or, with `keep_unscorable`, keeps them and lists them in `Rejections.unscorable_kept`.

    With `trl_prompts` (the rows' TRL `prompt` column) `questions` are prompts, checked by `check_prompt` and
    kept as written. Their answer column is the user's, read by the rewards they chose, so no row is rejected
    for its answer: one that is missing or unreadable only gives the built-in correctness reward no reference.

    >>> rows, rejected = clean_rows(["Q1", " ", None, "Q1"], ["#### 7", "1", "2", "#### 7"], ["a", "b", "c", "d"],
    ...                             lambda t: t.split("####")[1].strip() or None)
    >>> [(r.id, r.answer) for r in rows], rejected.ids_by_reason
    ([('a', '7')], {'empty_question': ['b'], 'missing_question': ['c'], 'duplicate': ['d']})
    >>> rows, rejected = clean_rows(["1+1=", 7, "2+2="], [None, None, "x"], ["a", "b", "c"], lambda t: None,
    ...                             trl_prompts=True)
    >>> [(r.id, r.prompt, r.answer) for r in rows], rejected.ids_by_reason
    ([('a', '1+1=', ''), ('c', '2+2=', 'x')], {'invalid_prompt': ['b']})
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
        # Exact repeats (same prompt, same answer) only spend rollouts twice on one problem;
        # the first copy is kept and the rest are reported.
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
