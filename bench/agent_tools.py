"""A tool for the tool-run bench (bench/overhead.py --tools), `subtract`, and the generation setting that makes a
random tiny model call it: TRL's own `generation_kwargs.sequence_bias`, so generation stays real while the rollouts
take TRL's tool loop as a trained model's would. tests/agent_helpers.py steers its tests' runs with the same two
helpers."""

from __future__ import annotations

import json


def subtract(minuend: int, subtrahend: int) -> int:
    """Subtract one integer from another.

    Args:
        minuend: The integer to subtract from.
        subtrahend: The integer to take away.

    Returns:
        The difference.
    """
    return minuend - subtrahend


def forced_text_bias(tokenizer, text: str, eos: bool = True) -> list:
    """TRL's `generation_kwargs.sequence_bias` that makes any model write `text` (then end its turn): every
    prefix of its token ids is biased, longer ones more, so the longest prefix written so far decides the next
    token."""
    ids = tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.convert_tokens_to_ids("<|im_end|>")]
                                                              if eos else [])
    return [[ids[:k], 1000.0 * k] for k in range(1, len(ids) + 1)]


def tool_call_text(*calls: tuple[str, dict]) -> str:
    """Qwen2.5's tool-call format for the given (name, arguments)."""
    return "\n".join(f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'
                     for name, args in calls)
