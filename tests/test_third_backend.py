"""A third backend, registered by a test (tests/third_backend.py), is a backend like the two built in: it passes
the protocol check, `grpo train --check` and a tiny training run, the memory plan asks it for its path, and nothing
outside pipeline/backends/ and tests/ was edited for it."""

from __future__ import annotations

import inspect
import json

import pytest

from grpo_pipeline.pipeline.backends import Backend, BackendChoice, choose_backend, load_backend
from grpo_pipeline.pipeline.backends.base import BackendBase
from grpo_pipeline.pipeline.config import field_choices
from tests.cli_helpers import run_cli
from tests.test_backends import call_compatible, protocol_members
from tests.third_backend import third_backend_registered
from tests.train_helpers import demo_config


@pytest.fixture
def third():
    with third_backend_registered() as cls:
        yield cls


def test_the_third_backend_satisfies_the_protocol(third):
    backend = load_backend("third")
    assert isinstance(backend, BackendBase) and backend.NAME == "third"
    for name, spec in protocol_members(Backend).items():
        assert hasattr(backend, name), f"the third backend lacks {name}"
        if spec is not None:
            assert not call_compatible(inspect.signature(spec), inspect.signature(getattr(backend, name))), name
    assert choose_backend("third") == BackendChoice("third", "backend: third was requested")
    assert "third" in field_choices("backend")


def test_registering_is_undone():
    with third_backend_registered():
        pass
    assert "third" not in field_choices("backend")
    with pytest.raises(Exception, match="third"):
        load_backend("third")


def test_the_memory_plan_asks_the_backend_for_its_path(third):
    from grpo_pipeline.pipeline.config import from_mapping
    from grpo_pipeline.pipeline.plan.estimate import kbit_upcast, memory_path

    cfg = from_mapping({"backend": "third", "load_in_4bit": True})
    assert memory_path(cfg) == "third" and not kbit_upcast(cfg)
    assert memory_path(cfg.replace(backend="plain")) == "plain" and \
        kbit_upcast(cfg.replace(backend="plain"))


def test_grpo_train_check_passes_with_the_third_backend(third, tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model_name_or_path: tiny-demo\nbackend: third\ndataset_name: sample\nmax_samples: 4\n"
                      f"output_dir: {tmp_path / 'run'}\nsft_warmup_steps: 0\n")
    code, out = run_cli(["train", "--config", str(recipe), "--check"], capsys)
    assert code == 0, out
    assert "backend third" in out and "the third backend changes" in out


def test_a_tiny_run_trains_on_the_third_backend(third, tmp_path):
    from grpo_pipeline.pipeline.train import run_training

    result = run_training(demo_config(tmp_path / "run", backend="third", max_steps=1, save_steps=1))
    assert result.status == "completed" and result.steps == 1
    effective = json.loads((tmp_path / "run" / "effective_config.json").read_text())
    assert effective["backend"] == "third" and effective["other_backend"] == "unsloth"
