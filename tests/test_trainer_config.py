"""What the trainer reads of a recipe, read from the validated config itself (its sections, cfg.trl, and what
pipeline/config trl_training_args derives), and the resume key (pipeline/run/resume.py ResumeKey, derived from it):
what each gives for a made-up recipe, and that the check hands the run the config (and the agents it resolved).
No model loads."""

import os

from grpo_pipeline.pipeline.config import GRPOArguments, from_mapping, trl_training_args
from grpo_pipeline.pipeline.preflight import run_checks
from grpo_pipeline.pipeline.run.resume import checkpoint_record, resume_key
from grpo_pipeline.pipeline.trainer.agents import Agents, agent_names, resolve_agents
from grpo_pipeline.pipeline.trainer.build import _model_free_decided
from train_helpers import demo_config

RECIPE = {"reward_funcs": ["strict_format", "correctness"], "reward_weights": [0.5, 2.0], "reward_timeout": 7,
          "report_to": "tensorboard", "gradient_checkpointing": True, "max_completion_length": "96", "beta": 0.02,
          "temperature": 0.8, "num_generations": 6, "sft_warmup_steps": 5, "sft_learning_rate": 1e-4, "seed": 11,
          "max_seq_length": 512, "garbled_threshold": 0.2, "tools": ["agent_helpers:add"], "lora_r": 4,
          "learning_rate": 3e-5, "model_name_or_path": "org/made-up", "dataset_name": "my.jsonl",
          "top_entropy_quantile": 0.5}


def test_the_trainer_reads_a_recipe_from_its_config(tmp_path):
    cfg = from_mapping(RECIPE)
    decided = _model_free_decided("plain", cfg, tmp_path)  # what the run passes GRPOConfig besides the recipe's
    assert (decided["reward_weights"], decided["max_completion_length"], decided["report_to"]) == (
        [0.5, 2.0, 0.0], 96, ["tensorboard"])  # the health observer's 0 last; the limit as set
    assert _model_free_decided("plain", from_mapping({}), tmp_path)["max_completion_length"] == 256  # auto: data's
    assert trl_training_args(cfg)["learning_rate"] == 3e-5 and cfg.trl == {"top_entropy_quantile": 0.5}
    assert agent_names(cfg.grpo) == {"tools": ["agent_helpers:add"]}


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


def test_the_check_hands_the_run_the_config_and_the_agents_it_resolved(tmp_path):
    cfg = demo_config(tmp_path / "run")
    decisions = run_checks(cfg).decisions
    assert decisions.config is cfg
    assert decisions.agents == Agents()


def test_agents_resolve_from_their_settings(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(__file__))  # agent_helpers, beside the tests
    agents = resolve_agents(GRPOArguments(tools=["agent_helpers:add"]))
    assert [tool.__name__ for tool in agents.tools] == ["add"] and agents.rollout_spec is None
