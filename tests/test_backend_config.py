"""What the backends read of the recipe: the validated config itself (pipeline/config), by its sections; every
option a backend operation reads is a field of the section it reads it from, and the run's check hands the config
on, as validated, in the run's decisions. No model loads."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from grpo_pipeline.pipeline.config import PipelineConfig
from grpo_pipeline.pipeline.config.pipeline_config import SECTION_ATTR

ROOT = Path(__file__).resolve().parents[1]


def made_up_recipe() -> PipelineConfig:
    return PipelineConfig().replace(
        model_name_or_path="someone/Model-7B", backend="plain", dtype="float16", load_in_4bit=False,
        max_seq_length=1536, lora_r=24, lora_alpha=48, lora_dropout=0.1, lora_target_modules="q_proj",
        lora_modules_to_save=["lm_head"], vllm_mode="colocate", gpu_memory_utilization="0.4", vllm_standby="false",
        max_lora_rank=24, seed=7, output_dir="runs/made-up", vllm_sampling_params={"min_p": 0.1},
        lr_scheduler_type="constant")  # an option no backend reads


def test_the_config_holds_the_recipes_values_by_section_a_lone_module_as_a_list():
    cfg = made_up_recipe()
    assert (cfg.model.model_name_or_path, cfg.model.backend, cfg.model.dtype, cfg.model.load_in_4bit,
            cfg.model.max_seq_length) == ("someone/Model-7B", "plain", "float16", False, 1536)
    assert (cfg.lora.lora_r, cfg.lora.lora_alpha, cfg.lora.lora_dropout) == (24, 48, 0.1)
    assert cfg.lora.lora_target_modules == ["q_proj"] and cfg.lora.lora_modules_to_save == ["lm_head"]
    assert (cfg.model.vllm_mode, cfg.model.gpu_memory_utilization, cfg.model.vllm_standby,
            cfg.model.max_lora_rank) == ("colocate", "0.4", "false", 24)
    assert (cfg.grpo.seed, cfg.grpo.output_dir, cfg.grpo.vllm_sampling_params) == (7, "runs/made-up", {"min_p": 0.1})


def test_the_backends_read_each_option_from_the_section_that_declares_it():
    sections = {attr: {f.name for f in dataclasses.fields(cls)} for cls, attr in SECTION_ATTR.items()}
    read = set()
    for path in (ROOT / "pipeline" / "backends").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and isinstance(node.value.value, ast.Name) and node.value.value.id == "cfg"):
                read.add((node.value.attr, node.attr))
    wrong = sorted((section, name) for section, name in read if name not in sections.get(section, ()))
    assert read and not wrong, wrong


def test_the_check_hands_the_validated_config_on_in_the_run_decisions(tmp_path):
    """validate normalises the recipe's values in place (numbers given as text from Python: "8" -> 8); what the
    check hands the run is read after it, never with the raw text (the backend's settings once were)."""
    from grpo_pipeline.pipeline.config import trl_training_args
    from grpo_pipeline.pipeline.preflight import run_checks  # lazy: only these tests need the check's imports
    from grpo_pipeline.pipeline.run.decisions import eval_key
    from train_helpers import demo_config

    cfg = demo_config(tmp_path / "run").replace(lora_r="8", max_seq_length="192", max_steps="2", seed="7")
    decisions = run_checks(cfg).decisions
    assert (cfg.lora.lora_r, cfg.model.max_seq_length, cfg.grpo.max_steps) == (8, 192, 2)  # normalised in place
    assert decisions.config is cfg and decisions.config.lora.lora_r == 8
    assert decisions.config.grpo.max_steps == 2
    assert decisions.config.grpo.seed == 7 and trl_training_args(decisions.config)["seed"] == 7
    assert decisions.eval_key == eval_key(cfg)
