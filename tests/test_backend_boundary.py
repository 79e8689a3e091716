"""The backend boundary holds: no code outside pipeline/backends/ compares a backend's name. Call sites ask the
backend object what it can do (pipeline/backends/base.py); this walks the syntax trees of pipeline/, env/ and
rewards/ and names every comparison with "unsloth" / "plain" or with a backend's NAME / a choice's name."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import layout_metrics  # noqa: E402  (the measure's one home; this test holds it at 0)


def backend_name_comparisons(root: Path = ROOT) -> list[str]:
    """'path:line' of every comparison with a backend's name outside pipeline/backends/."""
    return [":".join(site.split(":")[:2]) for site in layout_metrics.measure(root)["backend_name_comparisons"]]


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
    from pipeline.backends import BACKENDS, load_backend
    from pipeline.backends.base import BackendBase
    from pipeline.config.validate import BACKEND_RULES

    capabilities = [name for name in vars(BackendBase) if name.isupper()]
    for name in list(BACKENDS):
        backend = load_backend(name)
        assert isinstance(backend, BackendBase) and backend.NAME == name and backend.MODULE
        assert all(getattr(backend, capability) is not None for capability in capabilities)
        assert backend.RECIPE_RULES == BACKEND_RULES[name]  # what `validate(cfg, backend=name)` runs
        assert backend.COUNTERPART in BACKENDS and backend.COUNTERPART != name
        assert isinstance(backend.memory_path("none", True), str)
