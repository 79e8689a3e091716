"""The backend boundary holds: no code outside pipeline/backends/ compares a backend's name. Call sites ask the
backend object what it can do (pipeline/backends/base.py); this walks the syntax trees of pipeline/, env/ and
rewards/ and names every comparison with "unsloth" / "plain" or with a backend's NAME / a choice's name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKEND_NAMES = {"unsloth", "plain"}
BACKENDS_HOME = "pipeline/backends/"  # the one place that may compare a backend's name


def _names_a_backend(node: ast.expr) -> bool:
    """A string constant naming a backend ("plain"), a tuple/list/set holding one (`in ("unsloth", ...)`), a backend's
    NAME, or a backend choice's name (`choice.name`; a file's `.name` is not one: `path.name == "__init__.py"`)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_backend(item) for item in node.elts)
    if isinstance(node, ast.Attribute):
        return node.attr == "NAME" or (node.attr == "name" and isinstance(node.value, ast.Name)
                                       and node.value.id == "choice")
    return isinstance(node, ast.Constant) and node.value in BACKEND_NAMES


def _install_set_or_package(node: ast.expr) -> bool:
    """env/'s install sets are named "plain" and "gpu" (env/known_good.toml), and "unsloth" is also a package
    (`"unsloth" in sys.modules`): those comparisons name an install set or a module, not a backend."""
    if isinstance(node, ast.Name):
        return node.id in {"mode", "set_name", "modules"}
    if isinstance(node, ast.Attribute):
        return node.attr in {"install", "modules"}
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in ("mode", "set")  # row["set"]: an install set
    if isinstance(node, ast.IfExp):
        return _install_set_or_package(node.body) or _install_set_or_package(node.orelse)
    return False


def backend_name_comparisons(root: Path = ROOT) -> list[str]:
    """'path:line' of every comparison with a backend's name outside pipeline/backends/ (`choice.name == "plain"`,
    `x in ("unsloth", ...)`, `backend.NAME != other`), install sets and packages aside."""
    found = []
    for path in sorted(p for tree in ("pipeline", "env", "rewards") for p in (root / tree).rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(BACKENDS_HOME):
            continue
        found += [f"{relative}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                  if isinstance(node, ast.Compare) and any(map(_names_a_backend, [node.left, *node.comparators]))
                  and not any(map(_install_set_or_package, [node.left, *node.comparators]))]
    return found


def test_no_code_outside_the_backends_compares_a_backend_name():
    assert backend_name_comparisons() == []


def test_the_walk_sees_each_kind_of_comparison(tmp_path):
    (tmp_path / "pipeline" / "backends").mkdir(parents=True)
    (tmp_path / "env").mkdir()
    (tmp_path / "rewards").mkdir()
    (tmp_path / "pipeline" / "a.py").write_text(
        'if cfg.model.backend == "auto": pass\n'          # not a backend's name: allowed
        'if choice.name == "unsloth": pass\n'             # 2
        'if backend.NAME != other: pass\n'                # 3
        'x = name in ("plain", "auto")\n'                 # 4
        'if cfg.model.backend != "plain": pass\n'         # 5
        'if mode == "plain" or "unsloth" in sys.modules: pass\n')  # an install set, a package: allowed
    (tmp_path / "pipeline" / "backends" / "b.py").write_text('if name == "plain": pass\n')  # inside: allowed
    assert backend_name_comparisons(tmp_path) == [f"pipeline/a.py:{n}" for n in (2, 3, 4, 5)]


def test_each_registered_backend_answers_every_capability_and_brings_validates_rules():
    from grpo_pipeline.pipeline.backends import BACKENDS, load_backend
    from grpo_pipeline.pipeline.backends.base import BackendBase
    from grpo_pipeline.pipeline.config.validate import BACKEND_RULES

    capabilities = [name for name in vars(BackendBase) if name.isupper()]
    for name in list(BACKENDS):
        backend = load_backend(name)
        assert isinstance(backend, BackendBase) and backend.NAME == name and backend.MODULE
        assert all(getattr(backend, capability) is not None for capability in capabilities)
        assert backend.RECIPE_RULES == BACKEND_RULES[name]  # what `validate(cfg, backend=name)` runs
        assert backend.COUNTERPART in BACKENDS and backend.COUNTERPART != name
        assert isinstance(backend.memory_path("none", True), str)
