"""Steering a model to write a given text, with TRL's own `generation_kwargs.sequence_bias`: how the random tiny
demo model (pipeline/demo/model.py, Qwen2.5's chat template and tool-call tokens) is made to call tools, so that
generation stays real while the rollouts take TRL's tool loop as a trained model's would. bench/overhead.py --tools
and the agent tests (tests/agent_helpers.py) steer their runs with it."""

from __future__ import annotations

import json


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
