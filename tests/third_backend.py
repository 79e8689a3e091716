"""A test-only third backend: the plain backend under another name, with its own memory path. It is added
through the registry alone (grpo_pipeline.pipeline.backends.register_backend), to show that a backend needs edits in
pipeline/backends/ and nowhere else (tests/test_third_backend.py).

Not a test module (pytest collects only test_*.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from grpo_pipeline.pipeline.backends import register_backend, unregister_backend
from grpo_pipeline.pipeline.backends.plain import PlainBackend


class ThirdBackend(PlainBackend):
    """transformers + peft + TRL as the plain backend runs them; only its name and its memory path differ."""

    NAME = "third"
    KBIT_UPCAST = False

    def memory_path(self, vllm_mode: str, fast_inference: bool) -> str:
        return "third"


@contextmanager
def third_backend_registered() -> Iterator[type]:
    """The third backend registered for the length of a test, then taken out again."""
    register_backend(ThirdBackend)
    try:
        yield ThirdBackend
    finally:
        unregister_backend(ThirdBackend.NAME)
