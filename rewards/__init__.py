"""Reward functions for GRPO on GSM8K-style math, drop-in for the Unsloth notebook's: same names
(`correctness_reward_func`, ..., `extract_hash_answer`) and scale (2.0 for a correct answer, 0.5 for each
format reward, up to 0.5 for xmlcount).

Called as TRL calls them, `f(prompts=..., completions=..., **kwargs)`, completions strings or chat messages: one
value per completion, never a raise on an odd completion (None, broken tags, megabyte strings): 0.0, in time
linear in the text. A missing or unreadable *model* answer is wrong (0.0: None would hide failures); only
correctness returns None, for a *reference* that cannot be judged. No torch and no math_verify at import time.

>>> from grpo_pipeline.rewards import correctness_reward_func
>>> correctness_reward_func(prompts=None, completions=["<reasoning>6*3</reasoning><answer>$18</answer>"],
...                         answer=["18"])
[2.0]
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
