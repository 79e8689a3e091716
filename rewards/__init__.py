"""Reward functions for GRPO on GSM8K-style math, drop-in for the Unsloth notebook's.

Public names match the notebook (`correctness_reward_func`, `int_reward_func`,
`strict_format_reward_func`, `soft_format_reward_func`, `xmlcount_reward_func`,
`extract_xml_answer`, `extract_hash_answer`) and so does the scale: 2.0 for a correct
answer, 0.5 for each format reward, up to 0.5 for xmlcount.

Calling convention (TRL GRPOTrainer): `f(prompts=..., completions=..., **kwargs)`;
correctness also reads `answer=` (one reference per completion). Other keyword arguments
TRL passes (`completion_ids`, `trainer_state`, `log_metric`, `log_extra`, dataset columns)
are accepted and ignored. Completions may be strings or chat message lists. Every
function returns one value per completion and never raises on odd completions: None,
non-strings, empty text, broken or repeated tags, megabyte strings and control characters
all score 0.0, in time linear in the text (no backtracking regex; of an answer over 1,000
characters only a 1,000-character window at its final statement is read).

None vs 0.0 (TRL treats a None reward as "cannot be judged" and leaves the sample out of
that function's mean):

- A missing, empty or unparseable *model* answer is a wrong answer: 0.0. The model is
  responsible for producing a readable answer, and scoring it None would hide failures.
- Only `correctness_reward_func` returns None, and only when the *reference* answer is
  None, empty, unreadable or has no digit ("forty two"): the sample cannot be judged, and 0.0
  would punish a right answer.
- A missing `answer` column (or one whose length differs from the completions) is a set-up
  error and raises ValueError naming `answer`, so a run never trains silently without a
  correctness signal. Set-up errors are plain ValueErrors whose messages name no config field;
  the config layer (pipeline/config/validate.py) says which field they came from.

How answers are compared: rewards/normalize.py (fast numeric reader; its parts are cleaning.py,
number_words.py, sentences.py and numbers.py), rewards/matching.py
(decision table, tolerance, how each answer form is read and why that is safe),
rewards/symbolic.py (math-verify, lazily imported, time-limited per check and per batch, verdicts cached).
No torch and no math_verify at import time: `import rewards` is cheap.

>>> from grpo_pipeline.rewards import correctness_reward_func, get_reward_funcs
>>> correctness_reward_func(prompts=None, completions=["<reasoning>6*3</reasoning><answer>$18</answer>"],
...                         answer=["18"])
[2.0]
>>> [f.__name__ for f in get_reward_funcs(DEFAULT_REWARDS)][:2]
['xmlcount_reward_func', 'soft_format_reward_func']
"""

from grpo_pipeline.rewards.completions import completion_text, completion_texts
from grpo_pipeline.rewards.correctness import correctness_reward_func, int_reward_func, reference_is_scorable
from grpo_pipeline.rewards.extract import extract_hash_answer, extract_xml_answer
from grpo_pipeline.rewards.format import soft_format_reward_func, strict_format_reward_func, xmlcount_reward_func
from grpo_pipeline.rewards.language import language_consistency_reward_func
from grpo_pipeline.rewards.matching import answers_match, numbers_match
from grpo_pipeline.rewards.normalize import normalize_answer, parse_answer
from grpo_pipeline.rewards.registry import (
    DEFAULT_REWARD_WEIGHTS,
    DEFAULT_REWARDS,
    REWARD_ALIASES,
    REWARD_FUNCS,
    check_reward_names,
    check_reward_weights,
    get_reward_funcs,
    reads_reference,
    resolve_reward,
)

__all__ = [
    "DEFAULT_REWARDS",
    "DEFAULT_REWARD_WEIGHTS",
    "REWARD_ALIASES",
    "REWARD_FUNCS",
    "answers_match",
    "check_reward_names",
    "check_reward_weights",
    "completion_text",
    "completion_texts",
    "correctness_reward_func",
    "reference_is_scorable",
    "extract_hash_answer",
    "extract_xml_answer",
    "get_reward_funcs",
    "int_reward_func",
    "language_consistency_reward_func",
    "normalize_answer",
    "numbers_match",
    "parse_answer",
    "reads_reference",
    "resolve_reward",
    "soft_format_reward_func",
    "strict_format_reward_func",
    "xmlcount_reward_func",
]
