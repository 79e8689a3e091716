"""Shared set-up of the GPU-boundary contract tests (tests/test_unsloth_*.py): the `fake` fixture that installs
tests/fake_unsloth.py, and the config and call-log helpers they all use."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.fake_unsloth as fake_unsloth
from grpo_pipeline.env.adapters import verify_adapter_dir
from grpo_pipeline.env.paths import atomic_directory
from grpo_pipeline.pipeline.backends import gpu_settings
from grpo_pipeline.pipeline.backends import unsloth as backend
from grpo_pipeline.pipeline.backends import unsloth_setup
from grpo_pipeline.pipeline.config import PipelineConfig

ROOT = Path(__file__).resolve().parents[1]

# In this pytest process trl/transformers are usually imported already, so both the fake's copy of
# Unsloth's import-order warning and ours fire; the import order itself is tested in a clean subprocess.
IMPORT_ORDER_WARNINGS = pytest.mark.filterwarnings(
    "ignore:.*Unsloth should be imported before.*:UserWarning",
    "ignore:Unsloth must be imported before.*:UserWarning",
)

STANDBY = "UNSLOTH_VLLM_STANDBY"
GPU_GIB = 22.5  # an L4: standby tier 0.825 * 0.95, no-standby share 0.55


@pytest.fixture
def fake(monkeypatch):
    """The fake unsloth/vllm on sys.meta_path, a 22.5 GiB CUDA GPU, and a clean standby variable."""
    monkeypatch.delenv(STANDBY, raising=False)
    monkeypatch.delenv("UNSLOTH_VLLM_STANDBY_UTIL_OVERRIDE", raising=False)
    monkeypatch.setattr(unsloth_setup, "_prepared", None)  # prepare_environment's memory
    monkeypatch.setattr("grpo_pipeline.pipeline.backends.cuda_available", lambda: True)
    monkeypatch.setattr(gpu_settings, "gpu_total_gib", lambda device=0: GPU_GIB)
    handle = fake_unsloth.install()
    yield fake_unsloth
    handle.uninstall()


def make_cfg(**overrides) -> PipelineConfig:
    base = {"model_name_or_path": "unsloth/Qwen2.5-1.5B-Instruct", "vllm_standby": "true", "lora_r": 16,
            "lora_alpha": 32, "max_lora_rank": 32, "max_seq_length": 768, "seed": 1234,
            "output_dir": "unused"}
    return PipelineConfig().replace(**{**base, **overrides})


def only_call(fake, name):
    calls = fake.calls_named(name)
    assert len(calls) == 1, f"expected one {name}, got {len(calls)}: {calls}"
    return calls[0]


def train_and_save_adapter(fake, cfg, directory: Path):
    """load_for_training + save_adapter through atomic_directory, as pipeline/train.py does."""
    model, tokenizer = backend.load_for_training(cfg)
    with atomic_directory(directory) as staging:
        backend.save_adapter(model, tokenizer, staging)
    return verify_adapter_dir(directory)

