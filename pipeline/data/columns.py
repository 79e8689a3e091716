"""The training set's columns: the source's own (TRL passes every column but `prompt` to each reward as a
keyword), `prompt` (what the model is given), and the pipeline's own OWN_COLUMNS (grpo_answer, grpo_id, ...);
and what the report says of the prompts' format.
"""

from __future__ import annotations

from typing import Any, Optional

from pipeline.data.prompts import is_conversational
from pipeline.data.source_spec import OWN_PREFIX
from rewards.correctness import REFERENCE_COLUMN


# The pipeline's own per-row columns. TRL passes every column but `prompt` to each reward as a keyword, so ours
# carry a prefix no user column may have (pipeline/data/sources.py refuses one): a user's `answer`, `solution`
# or `id` reaches their rewards as they wrote it. grpo_answer is answer_field's value, cleaned and reduced
# (GSM8K `#### 18` -> 18): the reference the built-in correctness reward reads.
ANSWER, ROW_ID, PROMPT_TOKENS, SOLUTION = REFERENCE_COLUMN, "grpo_id", "grpo_prompt_tokens", "grpo_solution"
OWN_COLUMNS = (ANSWER, ROW_ID, PROMPT_TOKENS, SOLUTION)
assert all(name.startswith(OWN_PREFIX) for name in OWN_COLUMNS)


def training_columns(table: Any, prompts: list[Any], rows: list[Any], prompt_tokens: list[int]) -> Any:
    """The training set: the source's own columns for the kept rows, with their values and types (TRL passes
    every column but `prompt` to each reward function as a keyword argument), `prompt` (the prompt the model
    is given) and the pipeline's OWN_COLUMNS."""
    # lazy: datasets imports torch
    from datasets import Dataset

    dataset = table if isinstance(table, Dataset) else Dataset.from_dict(table)
    dataset = dataset.select([row.index for row in rows])
    if "prompt" in dataset.column_names:
        dataset = dataset.remove_columns("prompt")
    own = {"prompt": prompts, ANSWER: [row.answer or None for row in rows], ROW_ID: [row.id for row in rows],
           PROMPT_TOKENS: list(prompt_tokens), SOLUTION: [row.solution for row in rows]}
    if "answer" not in dataset.column_names and any(row.answer for row in rows):
        # answer_field names another column and none is called `answer`: the reference also arrives as `answer`,
        # as the pipeline always passed it (and the notebooks' rewards read it); no user column is hidden.
        own["answer"] = own[ANSWER]
    for name, values in own.items():
        dataset = dataset.add_column(name, values)
    return dataset.flatten_indices()


def removes_unused_columns(cfg: Any) -> bool:
    """TRL's `remove_unused_columns` as the run sets it (GRPOConfig's default: False): True leaves the rewards no
    dataset column (rewards/trl_source.py `reward_columns`)."""
    return bool(cfg.trl.get("remove_unused_columns", False))


def prompt_formats(source_format: str, prompts: list[Any], system_prompt: Optional[str]) -> dict[str, Any]:
    """What the report (and `--check`) says of the prompts: where they came from, how many are standard (text)
    and conversational (messages), and whether system_prompt was added or the prompt's own system message kept.

    >>> prompt_formats("prompt", ["1+1=", [{"role": "system", "content": "Mine."}, {"role": "user", "content": "?"}],
    ...                           [{"role": "user", "content": "?"}]], "Be brief.")["system_prompt"]
    {'added': 1, 'own_kept': 1, 'standard_as_written': 1}
    """
    if source_format != "prompt":
        return {"source": "question_field", "standard": 0, "conversational": len(prompts),
                "system_prompt": {"added": len(prompts) if system_prompt else 0, "own_kept": 0,
                                  "standard_as_written": 0}}
    chats = [p for p in prompts if is_conversational(p)]
    own = sum(1 for p in chats if p and p[0].get("role") == "system")
    return {"source": "prompt", "standard": len(prompts) - len(chats), "conversational": len(chats),
            "system_prompt": {"added": (len(chats) - own) if system_prompt else 0, "own_kept": own,
                              "standard_as_written": len(prompts) - len(chats)}}
