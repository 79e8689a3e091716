"""The backend's settings (pipeline/backends/settings.py): what its one builder holds for a made-up recipe, that the
backends read nothing else of it, and that the run's check hands them on in the run's decisions. No model loads."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from pipeline.backends.settings import BackendSettings, backend_settings
from pipeline.config import PipelineConfig

ROOT = Path(__file__).resolve().parents[1]


def made_up_recipe() -> PipelineConfig:
    return PipelineConfig().replace(
        model_name_or_path="someone/Model-7B", backend="plain", dtype="float16", load_in_4bit=False,
        max_seq_length=1536, lora_r=24, lora_alpha=48, lora_dropout=0.1, lora_target_modules="q_proj",
        lora_modules_to_save=["lm_head"], vllm_mode="colocate", gpu_memory_utilization="0.4", vllm_standby="false",
        max_lora_rank=24, seed=7, output_dir="runs/made-up", vllm_sampling_params={"min_p": 0.1},
        lr_scheduler_type="constant")  # a TRL option: no backend reads it


def test_the_builder_holds_the_recipes_values_by_their_names_lists_as_tuples():
    settings = backend_settings(made_up_recipe())
    assert (settings.model_name_or_path, settings.backend, settings.dtype, settings.load_in_4bit,
            settings.max_seq_length) == ("someone/Model-7B", "plain", "float16", False, 1536)
    assert (settings.lora_r, settings.lora_alpha, settings.lora_dropout) == (24, 48, 0.1)
    assert settings.lora_target_modules == ("q_proj",) and settings.lora_modules_to_save == ("lm_head",)
    assert (settings.vllm_mode, settings.gpu_memory_utilization, settings.vllm_standby, settings.max_lora_rank) == (
        "colocate", "0.4", "false", 24)
    assert (settings.seed, settings.output_dir, settings.vllm_sampling_params) == (7, "runs/made-up", {"min_p": 0.1})
    flat = made_up_recipe().to_dict()
    assert all(name in flat for name in (f.name for f in dataclasses.fields(BackendSettings)))  # recipe names only
    assert not hasattr(settings, "lr_scheduler_type") and not hasattr(settings, "model")  # no recipe, no section


def test_settings_are_frozen_and_a_change_is_a_copy():
    settings = backend_settings(made_up_recipe())
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.load_in_4bit = True
    merged = settings.replace(load_in_4bit=True)
    assert merged.load_in_4bit and not settings.load_in_4bit and merged.lora_r == 24


def test_the_backends_read_only_what_the_settings_hold():
    fields = {f.name for f in dataclasses.fields(BackendSettings)} | {"replace"}
    read = set()
    for path in (ROOT / "pipeline" / "backends").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "settings":
                read.add(node.attr)
    assert read and read <= fields, sorted(read - fields)


def test_the_check_hands_the_settings_on_in_the_run_decisions(tmp_path):
    from pipeline.preflight import run_checks  # lazy: only this test needs the check's imports
    from train_helpers import demo_config

    cfg = demo_config(tmp_path / "run")
    decisions = run_checks(cfg).decisions
    assert decisions.backend_settings == backend_settings(cfg)


def test_every_record_the_check_hands_on_holds_the_values_as_validated(tmp_path):
    """validate normalises the recipe's values in place (numbers given as text from Python: "8" -> 8); every record
    the check hands the run is read after it, never with the raw text (the backend's settings once were)."""
    from pipeline.data.spec import data_spec
    from pipeline.preflight import run_checks  # lazy: only these tests need the check's imports
    from pipeline.run.decisions import eval_key
    from pipeline.trainer.spec import trainer_spec
    from train_helpers import demo_config

    cfg = demo_config(tmp_path / "run").replace(lora_r="8", max_seq_length="192", max_steps="2", seed="7")
    decisions = run_checks(cfg).decisions
    assert (cfg.lora.lora_r, cfg.model.max_seq_length, cfg.grpo.max_steps) == (8, 192, 2)  # normalised in place
    assert decisions.backend_settings == backend_settings(cfg) and decisions.backend_settings.lora_r == 8
    assert decisions.data == data_spec(cfg) and decisions.data.max_steps == 2
    assert decisions.trainer == trainer_spec(cfg) and decisions.trainer.warmup.seed == 7
    assert decisions.eval_key == eval_key(cfg)
