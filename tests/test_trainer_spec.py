"""The recipe read once for the trainer (pipeline/trainer/spec.py TrainerSpec, agent_settings) and for resume
(pipeline/run/resume.py ResumeKey): what each record holds for a made-up recipe, and that the check hands them (and
the agents it resolved) to the run. No model loads."""

import dataclasses
import os

import pytest

from pipeline.config import from_mapping, role_values
from pipeline.preflight import run_checks
from pipeline.run.resume import checkpoint_record, resume_key
from pipeline.trainer.agents import Agents, AgentSettings, resolve_agents
from pipeline.trainer.spec import TrainerSpec, agent_settings, trainer_spec
from train_helpers import demo_config

RECIPE = {"reward_funcs": ["strict_format", "correctness"], "reward_weights": [0.5, 2.0], "reward_timeout": 7,
          "report_to": "tensorboard", "gradient_checkpointing": True, "max_completion_length": "96", "beta": 0.02,
          "temperature": 0.8, "num_generations": 6, "sft_warmup_steps": 5, "sft_learning_rate": 1e-4, "seed": 11,
          "max_seq_length": 512, "garbled_threshold": 0.2, "tools": ["agent_helpers:add"], "lora_r": 4,
          "learning_rate": 3e-5, "model_name_or_path": "org/made-up", "dataset_name": "my.jsonl",
          "top_entropy_quantile": 0.5}


def test_the_trainer_spec_holds_what_the_trainer_reads_of_a_recipe():
    cfg = from_mapping(RECIPE)
    spec = trainer_spec(cfg)
    assert (spec.reward_names, spec.reward_weights, spec.reward_timeout) == (("strict_format", "correctness"),
                                                                             (0.5, 2.0), 7)
    assert spec.recipe_args["learning_rate"] == 3e-5 and dict(spec.trl_options) == {"top_entropy_quantile": 0.5}
    assert (spec.reporters, spec.gradient_checkpointing, spec.completion_limit) == (("tensorboard",), True, 96)
    assert spec.health is cfg.health and spec.health.garbled_threshold == 0.2
    assert (spec.beta, spec.temperature, spec.num_generations) == (0.02, 0.8, 6)
    assert (spec.base_model, spec.dataset_name) == ("org/made-up", "my.jsonl")
    assert spec.agents == AgentSettings(("agent_helpers:add",), None, None) == agent_settings(cfg)
    assert (spec.warmup.steps, spec.warmup.learning_rate, spec.warmup.seed, spec.warmup.max_seq_length) == (
        5, 1e-4, 11, 512)
    assert dict(spec.warmup.inputs) == role_values(cfg, "warmup_input") and spec.checkpoint == resume_key(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.beta = 1.0
    assert trainer_spec(from_mapping({})).completion_limit is None  # auto: from the data


def test_the_resume_key_holds_the_weight_shape_and_the_settings_a_checkpoint_restores_or_a_resume_applies():
    cfg = from_mapping({**RECIPE, "lora_target_modules": ["v_proj", "q_proj"], "max_steps": 9})
    key = resume_key(cfg)
    assert key.shape["lora_r"] == 4 and key.shape["lora_target_modules"] == ["q_proj", "v_proj"]  # sorted
    assert key.settings["learning_rate"] == 3e-5 and key.settings["max_steps"] == 9
    assert "learning_rate" in key.restored and "max_steps" in key.applied
    assert (key.trl_options, key.dataset_name, key.base_model) == (("top_entropy_quantile",), "my.jsonl",
                                                                   "org/made-up")
    # the process layout too (one process here): another process count is another global batch
    assert checkpoint_record(key) == {**key.shape, "settings": dict(key.settings),
                                      "launch": {"processes": 1, "global_batch": key.batch(1)[2]}}


def test_the_check_hands_the_run_the_trainer_spec_and_the_agents_it_resolved(tmp_path):
    cfg = demo_config(tmp_path / "run")
    decisions = run_checks(cfg).decisions
    assert isinstance(decisions.trainer, TrainerSpec) and decisions.trainer == trainer_spec(cfg)
    assert decisions.agents == Agents()


def test_agents_resolve_from_their_settings(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(__file__))  # agent_helpers, beside the tests
    agents = resolve_agents(AgentSettings(("agent_helpers:add",)))
    assert [tool.__name__ for tool in agents.tools] == ["add"] and agents.rollout_spec is None
