"""The `>>>` examples in docstrings are part of the documentation: keep them true.

Every module of env/, pipeline/ and rewards/ whose source has an example is found and run, so a new
example is tested without being listed here.
"""

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(
    ".".join(("grpo_pipeline", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
    for package in ("env", "pipeline", "rewards")
    for path in (ROOT / package).rglob("*.py")
    if ">>>" in path.read_text(encoding="utf-8")
)


def test_the_examples_are_found():
    assert {"grpo_pipeline.env.paths", "grpo_pipeline.pipeline.demo.model", "grpo_pipeline.pipeline.demo.registry",
            "grpo_pipeline.pipeline.demo.task", "grpo_pipeline.pipeline.run.log", "grpo_pipeline.rewards",
            "grpo_pipeline.rewards.normalize"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0  # the examples are there, and they ran
