"""The Qwen2.5 sizes the planner knows offline, smallest first, for the "a smaller model" suggestion."""

from __future__ import annotations

import re

QWEN25_SIZES = ("0.5B", "1.5B", "3B", "7B")


def smaller_models(model: str) -> list[str]:
    """The same Qwen2.5 name at each smaller size, nearest first.

    >>> smaller_models("unsloth/Qwen2.5-3B-Instruct")
    ['unsloth/Qwen2.5-1.5B-Instruct', 'unsloth/Qwen2.5-0.5B-Instruct']
    >>> smaller_models("my/llama")
    []
    """
    match = re.search(r"(?i)(qwen2\.5-)(0\.5|1\.5|3|7)b", model)
    if not match:
        return []
    sizes = [s.lower() for s in QWEN25_SIZES]
    index = sizes.index(match.group(2).lower() + "b")
    return [model[:match.start(2)] + QWEN25_SIZES[i] + model[match.end():] for i in range(index - 1, -1, -1)]
