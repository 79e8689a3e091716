"""The Qwen2.5 sizes the planner knows offline, smallest first, for the "a smaller model" suggestion."""

from __future__ import annotations

import re

QWEN25_SIZES = ("0.5B", "1.5B", "3B", "7B")
# Qwen2.5 chat/base models of a bundled size (Qwen/..., unsloth/...-Instruct, ...-bnb-4bit); not Coder/Math/VL.
QWEN25_NAME = re.compile(r"(?i)(qwen2\.5-)(0\.5|1\.5|3|7)b(?!-?(coder|math|vl))")


def bundled_config_name(model: str) -> str | None:
    """The bundled config (pipeline/assets/model-configs) for a Qwen2.5 name of any spelling.

    >>> bundled_config_name("unsloth/Qwen2.5-1.5B-Instruct"), bundled_config_name("Qwen/Qwen2.5-7B")
    ('qwen2.5-1.5b', 'qwen2.5-7b')
    >>> bundled_config_name("Qwen/Qwen2.5-14B"), bundled_config_name("Qwen/Qwen2.5-Math-7B")
    (None, None)
    """
    match = QWEN25_NAME.search(model)
    return f"qwen2.5-{match.group(2)}b" if match else None


def smaller_models(model: str) -> list[str]:
    """The same Qwen2.5 name at each smaller size, nearest first.

    >>> smaller_models("unsloth/Qwen2.5-3B-Instruct")
    ['unsloth/Qwen2.5-1.5B-Instruct', 'unsloth/Qwen2.5-0.5B-Instruct']
    >>> smaller_models("my/llama")
    []
    """
    match = QWEN25_NAME.search(model)
    if not match:
        return []
    sizes = [s.lower() for s in QWEN25_SIZES]
    index = sizes.index(match.group(2).lower() + "b")
    return [model[:match.start(2)] + QWEN25_SIZES[i] + model[match.end():] for i in range(index - 1, -1, -1)]
