"""The `>>>` examples in env/ docstrings are part of the documentation: keep them true."""

import doctest
import importlib

import pytest

MODULES = ["env.matrix", "env.compat", "env.imports", "env.paths", "env.doctor", "env.fetch_metadata"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0  # the examples are there, and they ran
