"""Import order: trl/transformers/peft must come after unsloth. Real imports in fresh interpreters."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_pipeline.env.imports import PATCHED_BY_UNSLOTH, import_order_problems, require_unsloth_first

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json
from grpo_pipeline.env.imports import import_order_problems, require_unsloth_first
problems = import_order_problems()
try:
    require_unsloth_first()
    error = None
except RuntimeError as err:
    error = str(err)
print(json.dumps({"problems": problems, "error": error}))
"""


def run_fresh(imports: str, fake_unsloth_dir: Path | None = None) -> dict:
    """Run `imports` then the probe in a new interpreter; a fake `unsloth` package can be put on the path."""
    path = os.pathsep.join(filter(None, [str(fake_unsloth_dir or ""), str(ROOT)]))
    result = subprocess.run(
        [sys.executable, "-c", imports + "\n" + PROBE],
        check=False, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": path}, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def fake_unsloth(tmp_path):
    """An empty `unsloth` package: enough to occupy its place in sys.modules, like the real one does."""
    (tmp_path / "unsloth").mkdir()
    (tmp_path / "unsloth" / "__init__.py").write_text("")
    return tmp_path


def test_trl_imported_without_unsloth_is_reported():
    outcome = run_fresh("import trl")
    assert "trl" in outcome["problems"]
    assert "trl" in outcome["error"] and "import grpo_pipeline.pipeline.backends.unsloth" in outcome["error"]


def test_trl_imported_before_unsloth_is_reported(fake_unsloth):
    outcome = run_fresh("import trl\nimport unsloth", fake_unsloth)
    assert outcome["problems"] == ["trl"]
    assert outcome["error"].startswith("trl was imported before unsloth")


def test_unsloth_first_is_fine(fake_unsloth):
    outcome = run_fresh("import unsloth\nimport trl", fake_unsloth)
    assert outcome == {"problems": [], "error": None}


def test_nothing_imported_is_fine():
    assert run_fresh("") == {"problems": [], "error": None}


def test_order_is_read_from_insertion_order():
    assert import_order_problems({"peft": 1, "transformers": 1, "unsloth": 1, "trl": 1}) == ["transformers", "peft"]
    assert import_order_problems({"unsloth": 1, **dict.fromkeys(PATCHED_BY_UNSLOTH, 1)}) == []
    with pytest.raises(RuntimeError, match=r"^transformers, peft were imported before unsloth"):
        require_unsloth_first({"peft": 1, "transformers": 1})
