"""Answer rewards: is the final answer right (2.0), is it an integer (0.5); both read the LAST <answer> block."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from grpo_pipeline.rewards.completions import completion_texts
from grpo_pipeline.rewards.declared import builtin_reward
from grpo_pipeline.rewards.extract import GSM8K_MARKER, extract_hash_answer, extract_xml_answer
from grpo_pipeline.rewards.matching import answers_match
from grpo_pipeline.rewards.normalize import parse_answer
from grpo_pipeline.rewards.symbolic import time_budget

CORRECT_REWARD = 2.0
INTEGER_REWARD = 0.5
# The keyword under which the pipeline passes answer_field's value, cleaned and reduced (GSM8K `#### 18` -> 18):
# a column name no user's may have (pipeline/data/sources.py refuses the prefix), so the user's own `answer`
# column, if any, still reaches every reward as they wrote it.
REFERENCE_COLUMN = "grpo_answer"
# Seconds of math-verify work one call may start (see rewards/symbolic.py). Plain numbers never
# need it; a batch of 64 new exotic expressions would otherwise cost up to ~2 min.
SYMBOLIC_BUDGET_S = 2.0


@builtin_reward("correctness", range=(0.0, CORRECT_REWARD), kind="answer", reads_reference=True)
def correctness_reward_func(prompts: Any = None, completions: Any = None, answer: Any = None,
                            **kwargs: Any) -> list[float | None]:
    """2.0 when the last <answer> block equals the reference answer (rewards/matching.py), else 0.0; None (TRL:
    "cannot be judged", left out of the mean) when the reference is not `reference_is_scorable`. The reference is
    `grpo_answer` when the pipeline passes it, else `answer` as the notebook's reward reads it (one per completion,
    or one for all; GSM8K's `... #### 18` is 18); a missing column, or one of another length, raises ValueError.

    >>> correctness_reward_func(completions=["<answer>$1,234</answer>", "<answer>1234.5</answer>",
    ...                                      [{"role": "assistant", "content": "<answer>答案：1234</answer>"}]],
    ...                         answer=["1234", "1234", "1234"])
    [2.0, 0.0, 2.0]
    """
    texts = completion_texts(completions)
    references = [_final_answer(r) for r in _references(kwargs.get(REFERENCE_COLUMN, answer), len(texts))]
    rewards: list[float | None] = []
    with time_budget(SYMBOLIC_BUDGET_S):
        for text, reference in zip(texts, references):
            if not reference_is_scorable(reference):  # "forty two", "n/a", "18 or 20"
                rewards.append(None)
            else:
                rewards.append(CORRECT_REWARD if answers_match(extract_xml_answer(text), reference) else 0.0)
    return rewards


def reference_is_scorable(reference: Any) -> bool:
    """True when `reference` reads as ONE final answer, a number or an expression with a digit: the one reading of
    a reference, for this reward and for data preparation (pipeline/data/clean.py's `unscorable_answer`).

    >>> [reference_is_scorable(r) for r in ("1,234", "\\frac{1}{2}", "2x+1", "five and a half", "18 or 20", None)]
    [True, True, True, False, False, False]
    """
    parsed = parse_answer(reference)
    return (parsed is not None and parsed.kind in ("number", "expression")
            and any(ch.isdigit() for ch in parsed.cleaned))


# "answer": 0 everywhere means no completion states an integer; at its maximum, that form is learned
@builtin_reward("int", range=(0.0, INTEGER_REWARD), kind="answer", learned_at_max=True)
def int_reward_func(completions: Any = None, **kwargs: Any) -> list[float]:
    """0.5 when the last <answer> block reads as one integer ("-3", "1,234", "$18", "18.00"), else 0.0. The
    notebook used str.isdigit(), which rejects "-3" and "1,234" and accepts "²".

    >>> int_reward_func(["<answer>1,234</answer>", "<answer>-3</answer>", "<answer>2.5</answer>", None])
    [0.5, 0.5, 0.0, 0.0]
    """
    rewards = []
    for text in completion_texts(completions):
        parsed = parse_answer(extract_xml_answer(text), prediction=True)
        is_integer = parsed is not None and parsed.value is not None and parsed.value.denominator == 1
        rewards.append(INTEGER_REWARD if is_integer else 0.0)
    return rewards


def _final_answer(reference: Any) -> Any:
    """A GSM8K reference (`... #### 18`) reduced to its final answer; any other reference as it is."""
    if isinstance(reference, str) and GSM8K_MARKER in reference:
        return extract_hash_answer(reference)
    return reference


def _references(answer: Any, count: int) -> list[Any]:
    if answer is None:
        raise ValueError("correctness_reward_func needs `answer` (the dataset column with the reference answer, "
                         "one per completion); add an 'answer' column to the training dataset.")
    if not isinstance(answer, (str, bytes, int, float, Fraction, dict)) and hasattr(answer, "__len__"):
        answer = list(answer)  # list, tuple, numpy array, pandas Series
        if len(answer) != count:
            raise ValueError(f"correctness_reward_func got {len(answer)} values in `answer` for {count} completions; "
                             "pass one reference answer per completion.")
        return answer
    return [answer] * count
