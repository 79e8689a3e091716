"""The layout, held by the ecosystem's tools from the project's own settings (pyproject.toml): import-linter's
layer contracts (pipeline over rewards over env; pipeline's floors, top first) and ruff's rules (errors, and
complexity instead of line counts). Both come with the dev install (README); a failure prints their own report."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_no_module_imports_from_a_layer_above_its_own():
    done = _run("import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "2 kept, 0 broken" in done.stdout


def test_ruff_finds_no_error_and_no_function_past_the_complexity_ceilings():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_docs_layout_gives_every_module_a_line():
    """docs/layout.md has one line per folder and per module: a module added without its line fails here. An
    `__init__.py` of a few lines (a docstring) is covered by its folder's line."""
    doc = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    listed = {line.split()[0] for line in doc.splitlines() if line and not line.startswith((" ", "|", "#", "`"))}
    missing = []
    for package in ("pipeline", "rewards", "env"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            short_init = path.name == "__init__.py" and len(path.read_text(encoding="utf-8").splitlines()) <= 10
            if name not in listed and not (short_init and f"{path.parent.relative_to(ROOT).as_posix()}/" in listed):
                missing.append(name)
    assert missing == []
