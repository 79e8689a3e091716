"""Format rewards for the <reasoning>...</reasoning><answer>...</answer> layout: the Unsloth GRPO notebook's names
and scale, fixed where its versions mislead training. Its strict regex (no DOTALL) cannot match multi-line
reasoning and its soft one stops at the first newline, so both pay out almost never; its xmlcount's unbounded
penalty after `</answer>` can outweigh all format credit (ours is capped). str.find/count only: linear time.
"""

from __future__ import annotations

from typing import Any

from grpo_pipeline.rewards.completions import completion_texts
from grpo_pipeline.rewards.declared import builtin_reward

REASONING_OPEN, REASONING_CLOSE = "<reasoning>", "</reasoning>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (REASONING_OPEN, REASONING_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)


def format_completion(reasoning: str, answer: str) -> str:
    """The layout these rewards want, with full marks from the strict one: the SFT warm-up's teacher text.

    >>> format_completion(" 6*3=18 ", "18")
    '<reasoning>\\n6*3=18\\n</reasoning>\\n<answer>\\n18\\n</answer>\\n'
    """
    return f"{REASONING_OPEN}\n{reasoning.strip()}\n{REASONING_CLOSE}\n{ANSWER_OPEN}\n{answer.strip()}\n{ANSWER_CLOSE}\n"


# The Unsloth Qwen2.5 GRPO notebook's system prompt, newlines included (the default `system_prompt`).
FORMAT_SYSTEM_PROMPT = "\nRespond in the following format:\n" + format_completion("...", "...")

FORMAT_REWARD = 0.5
TAG_REWARD = 0.125
TRAILING_PENALTY_PER_CHAR = 0.001
# One tag's worth: enough to prefer stopping after </answer>, never enough to make
# truncating the reasoning pay (an unbounded penalty teaches the model to cut its reasoning short).
TRAILING_PENALTY_CAP = 0.125


@builtin_reward("strict_format", range=(0.0, FORMAT_REWARD), kind="format", learned_at_max=True)
def strict_format_reward_func(completions: Any = None, **kwargs: Any) -> list[float]:
    """0.5 when the whole completion is exactly one non-empty reasoning block then one non-empty answer block,
    with only whitespace before, between and after them; 0.0 for other text there, a tag missing, repeated or
    out of order, and for no text at all.

    >>> strict_format_reward_func(["<reasoning>\\nstep 1\\nstep 2\\n</reasoning>\\n<answer>\\n18\\n</answer>\\n",
    ...                            "<reasoning>r</reasoning><answer>18</answer>",
    ...                            "Sure! <reasoning>r</reasoning><answer>18</answer>", None])
    [0.5, 0.5, 0.0, 0.0]
    """
    return [FORMAT_REWARD if text is not None and _is_strict_format(text) else 0.0
            for text in completion_texts(completions)]


@builtin_reward("soft_format", range=(0.0, FORMAT_REWARD), kind="format", learned_at_max=True)
def soft_format_reward_func(completions: Any = None, **kwargs: Any) -> list[float]:
    """0.5 when a complete reasoning block is followed, anywhere later, by a complete answer block (anything
    around and between them); else 0.0.

    >>> soft_format_reward_func(["Sure!\\n<reasoning>\\nr\\n</reasoning> then <answer>18</answer> done",
    ...                          "<answer>18</answer><reasoning>r</reasoning>", "<reasoning>r</reasoning><answer>18"])
    [0.5, 0.0, 0.0]
    """
    return [FORMAT_REWARD if text is not None and _has_blocks_in_order(text) else 0.0
            for text in completion_texts(completions)]


@builtin_reward("xmlcount", range=(0.0, FORMAT_REWARD), kind="format", learned_at_max=True)  # clamped to [0, 0.5]
def xmlcount_reward_func(completions: Any = None, **kwargs: Any) -> list[float]:
    """Partial credit per tag: +0.125 for each of the four tags that appears exactly once, -0.001 per
    non-whitespace character after the last `</answer>` (at most -0.125), clamped to [0, 0.5]; 0.0 for no text.

    >>> xmlcount_reward_func(["<reasoning>\\nr\\n</reasoning>\\n<answer>\\n18\\n</answer>\\n",
    ...                       "<reasoning>r</reasoning><answer>18</answer>" + "x" * 10,
    ...                       "<reasoning>r</reasoning><answer>18</answer>" + "x" * 10_000,
    ...                       "<answer>18</answer>", "plain text"])
    [0.5, 0.49, 0.375, 0.25, 0.0]
    """
    return [_xml_count(text) if text is not None else 0.0 for text in completion_texts(completions)]


def _is_strict_format(text: str) -> bool:
    body = text.strip()
    if not (body.startswith(REASONING_OPEN) and body.endswith(ANSWER_CLOSE)) or any(body.count(t) != 1 for t in TAGS):
        return False
    reasoning, _, rest = body[len(REASONING_OPEN):-len(ANSWER_CLOSE)].partition(REASONING_CLOSE)
    between, _, answer = rest.partition(ANSWER_OPEN)  # an <answer> before </reasoning> leaves `between` non-empty
    return not between.strip() and bool(reasoning.strip()) and bool(answer.strip())


def _has_blocks_in_order(text: str) -> bool:
    position = 0
    for tag in TAGS:
        found = text.find(tag, position)
        if found == -1:
            return False
        position = found + len(tag)
    return True


def _xml_count(text: str) -> float:
    score = float(sum(TAG_REWARD for tag in TAGS if text.count(tag) == 1))
    last_close = text.rfind(ANSWER_CLOSE)
    if last_close != -1:
        trailing_chars = len("".join(text[last_close + len(ANSWER_CLOSE):].split()))  # whitespace is free
        score -= min(TRAILING_PENALTY_PER_CHAR * trailing_chars, TRAILING_PENALTY_CAP)
    return round(min(max(score, 0.0), 4 * TAG_REWARD), 6)

