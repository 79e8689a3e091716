"""The training set's columns: the source's own, `prompt` and the pipeline's OWN_COLUMNS; and what the report says
of the prompts' format."""

from __future__ import annotations

from typing import Any, Optional

from grpo_pipeline.pipeline.data.prompts import is_conversational
from grpo_pipeline.pipeline.data.source_spec import OWN_PREFIX
from grpo_pipeline.rewards.correctness import REFERENCE_COLUMN


# The pipeline's own per-row columns. TRL passes every column but `prompt` to each reward as a keyword, so ours
# carry a prefix no user column may have: a user's `answer` or `id` reaches their rewards as they wrote it.
# grpo_answer is answer_field's value, cleaned and reduced (`#### 18` -> 18): what the correctness reward reads.
ANSWER, ROW_ID, PROMPT_TOKENS, SOLUTION = REFERENCE_COLUMN, "grpo_id", "grpo_prompt_tokens", "grpo_solution"
OWN_COLUMNS = (ANSWER, ROW_ID, PROMPT_TOKENS, SOLUTION)
assert all(name.startswith(OWN_PREFIX) for name in OWN_COLUMNS)


def training_columns(table: Any, prompts: list[Any], rows: list[Any], prompt_tokens: list[int]) -> Any:
    """The kept rows' own columns (each goes to the rewards as it is), `prompt` and OWN_COLUMNS."""
    from datasets import Dataset  # lazy: datasets imports torch

    dataset = table if isinstance(table, Dataset) else Dataset.from_dict(table)
    dataset = dataset.select([row.index for row in rows])
    if "prompt" in dataset.column_names:
        dataset = dataset.remove_columns("prompt")
    own = {"prompt": prompts, ANSWER: [row.answer or None for row in rows], ROW_ID: [row.id for row in rows],
           PROMPT_TOKENS: list(prompt_tokens), SOLUTION: [row.solution for row in rows]}
    if "answer" not in dataset.column_names and any(row.answer for row in rows):
        # the reference also arrives as `answer`, which the notebooks' rewards read; no user column is hidden
        own["answer"] = own[ANSWER]
    for name, values in own.items():
        dataset = dataset.add_column(name, values)
    return dataset.flatten_indices()


def removes_unused_columns(trl_options: Any) -> bool:
    """TRL's `remove_unused_columns` as the run sets it (default False): True gives the rewards no column."""
    return bool(trl_options.get("remove_unused_columns", False))


def prompt_formats(source_format: str, prompts: list[Any], system_prompt: Optional[str]) -> dict[str, Any]:
    """The report's account of the prompts: their source, how many of each format, where system_prompt was added,
    and `trained_system_message`.

    >>> prompt_formats("prompt", ["1+1=", [{"role": "system", "content": "Mine."}, {"role": "user", "content": "?"}],
    ...                           [{"role": "user", "content": "?"}]], "Be brief.")["system_prompt"]
    {'added': 1, 'own_kept': 1, 'standard_as_written': 1}
    """
    # question_field rows become chats with no system message of their own: system_prompt is added to each
    chats = [p for p in prompts if is_conversational(p)] if source_format == "prompt" else [[]] * len(prompts)
    own = sum(1 for p in chats if p and p[0].get("role") == "system")
    return {"source": "prompt" if source_format == "prompt" else "question_field",
            "standard": len(prompts) - len(chats), "conversational": len(chats),
            "system_prompt": {"added": (len(chats) - own) if system_prompt else 0, "own_kept": own,
                              "standard_as_written": len(prompts) - len(chats)},
            **trained_system_message(chats, system_prompt)}


def trained_system_message(chats: list[Any], system_prompt: Optional[str]) -> dict[str, Any]:
    """The system message all training chats carried (their own, or system_prompt), which generate/eval/export
    default to; "" when none did, "" and a note when they differ.

    >>> trained_system_message([[{"role": "system", "content": "Mine."}, {"role": "user", "content": "?"}]] * 2, "X")
    {'system_message': 'Mine.', 'system_message_note': ''}
    """
    carried = {chat[0]["content"] if chat and chat[0].get("role") == "system" else (system_prompt or "")
               for chat in chats}
    if len(carried) <= 1:
        return {"system_message": next(iter(carried), ""), "system_message_note": ""}
    shown = ", ".join(text[:40] for text in sorted(carried)[:3]) + (", ..." if len(carried) > 3 else "")
    return {"system_message": "", "system_message_note": (
        f"the training rows carried {len(carried)} different system messages ({shown}), so none is recorded as "
        "the adapter's: generate/eval/export use none unless you pass --system_prompt TEXT")}
