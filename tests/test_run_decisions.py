"""The run's decisions (pipeline/run/decisions.py): made once by the check before anything loads, frozen, and what
the phases read instead of working them out again."""

import dataclasses

import pytest

from grpo_pipeline.pipeline.config import trl_training_args
from grpo_pipeline.pipeline.data.run_data import prepare_train
from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer
from grpo_pipeline.pipeline.preflight import run_checks
from grpo_pipeline.pipeline.run.decisions import RewardSpec, reward_specs
from grpo_pipeline.rewards import get_reward_funcs
from train_helpers import demo_config


def test_the_rewards_are_recorded_with_their_weight_and_whether_they_read_the_reference():
    names = ["strict_format", "correctness"]
    specs = reward_specs(names, [0.5, 2.0], get_reward_funcs(names))
    assert specs == (RewardSpec("strict_format", "strict_format_reward_func", 0.5, False),
                     RewardSpec("correctness", "correctness_reward_func", 2.0, True))


def test_the_check_hands_the_run_one_frozen_record_of_its_decisions(tmp_path):
    cfg = demo_config(tmp_path / "run")
    decisions = run_checks(cfg).decisions
    m = cfg.model
    train = prepare_train(cfg, load_tokenizer(m.model_name_or_path, m.trust_remote_code, m.model_source),
                          write_report=False)
    assert decisions.backend_name == "plain" and hasattr(decisions.backend, "load_for_training")
    assert (decisions.limits.max_prompt_length, decisions.limits.max_completion_length) == (
        train.max_prompt_length, train.max_completion_length) and decisions.data_key == train.fingerprint
    assert decisions.limits.max_seq_length == cfg.model.max_seq_length
    assert [r.name for r in decisions.rewards] == list(cfg.grpo.reward_funcs)
    assert decisions.config is cfg and trl_training_args(decisions.config)["learning_rate"] == cfg.grpo.learning_rate
    assert dict(decisions.prompt_format) == train.report["prompt_format"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        decisions.data_key = "other"
    with pytest.raises(TypeError):
        decisions.prompt_format["system_prompt"] = "other"


def test_the_eval_key_holds_the_recipes_eval_inputs_and_start_by_role(tmp_path):
    """What an evaluation's kept result depends on (run/decisions.py EvalKey, built once by the check: eval_key)."""
    from grpo_pipeline.pipeline.config import role_values
    from grpo_pipeline.pipeline.run.decisions import eval_key

    cfg = demo_config(tmp_path / "run", lora_r=4)
    key = eval_key(cfg)
    assert key.inputs == role_values(cfg, "eval_input") and key.start == role_values(cfg, "eval_start")
    other = eval_key(cfg.replace(lora_r=8))  # the fresh LoRA's rank: where eval before starts, not how it is scored
    assert other.inputs == key.inputs and other.start != key.start
    assert eval_key(cfg.replace(reward_funcs=["correctness"])).inputs != key.inputs


def test_a_check_that_fails_hands_on_no_decisions(tmp_path):
    checks = run_checks(demo_config(tmp_path / "run", reward_funcs=["no_such_reward"]), stop_at_first=False)
    assert not all(c.ok for c in checks) and checks.decisions is None
