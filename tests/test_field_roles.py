"""Field roles (pipeline/config/roles.py): each option declares on itself what it is part of, and every list that
was kept by hand is derived from the declarations.

A made-up option with each role, declared once on a section of its own (a subclass, as a caller's extra option
would be), moves the data cache key, the warm-up's and the eval's kept keys and the resume checks with no other
edit; the derived lists equal the hand-kept ones they replaced (copied here from main before they were deleted).
"""

import dataclasses
import json

import pytest

from grpo_pipeline.pipeline.config import ConfigError, DataArguments, PipelineConfig, fields_with, from_mapping, trl_names
from grpo_pipeline.pipeline.config.fields import _help
from grpo_pipeline.pipeline.config.trl_fields import TRL_ROLES, trl_with
from grpo_pipeline.pipeline.data.prepare import data_fields, prepare_dataset
from grpo_pipeline.pipeline.infer.evaluate import eval_before_inputs, load_eval_before, save_eval_before
from grpo_pipeline.pipeline.run.decisions import eval_key
from grpo_pipeline.pipeline.run.resume import (SHAPE_NAME, checkpoint_record, resume_changes, resume_key, resume_mismatch)
from grpo_pipeline.pipeline.trainer.warmup import warmup_inputs
from tests.data_helpers import make_cfg

# The hand-kept lists as they stood on main (f373f8c), before the declarations replaced them.
MAIN_DATA_KEY = {"system_prompt", "keep_unscorable", "max_prompt_length", "max_completion_length", "overlong_policy",
                 "max_samples", "max_seq_length"}
MAIN_WEIGHT_SHAPING = ("model_name_or_path", "lora_r", "lora_alpha", "lora_target_modules", "lora_modules_to_save")
MAIN_RESTORED = {"learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "optim", "optim_args",
                 "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "per_device_train_batch_size",
                 "gradient_accumulation_steps", "num_generations", "generation_batch_size", "steps_per_generation",
                 "num_iterations", "seed", "data_seed"}
MAIN_APPLIED = ("max_steps", "num_train_epochs", "max_grad_norm")
MAIN_RUN_OWNED = {"disable_tqdm", "logging_nan_inf_filter", "resume_from_checkpoint", "eval_strategy", "use_cpu"}
MAIN_BACKEND_DECIDED = {"use_vllm", "bf16", "fp16", "vllm_gpu_memory_utilization"}
# warmup_inputs: the fields it read (its keys: model, dtype, max_seq_length, steps, learning_rate, seed, system_prompt,
# lora) and, since the agent demo, the tools its examples are rendered with; eval_inputs: model, loading (dtype, max_seq_length, fast_inference, trust_remote_code), scoring
# (reward_funcs); eval_before_inputs' start: the LoRA section and seed.
LORA = {"lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_modules_to_save",
        "gradient_checkpointing"}
MAIN_WARMUP = {"model_name_or_path", "model_source", "dtype", "max_seq_length", "sft_warmup_steps",
               "sft_learning_rate", "seed", "system_prompt", "tools", *LORA}
MAIN_EVAL = {"model_name_or_path", "model_source", "dtype", "max_seq_length", "fast_inference", "trust_remote_code",
             "reward_funcs",
             "tools", "environment_factory", "max_tool_calling_iterations"}  # the eval's tool loop (issue 50)
MAIN_EVAL_START = {*LORA, "seed"}


def test_the_derived_lists_are_the_hand_kept_ones_they_replaced():
    assert set(fields_with("data_key")) == MAIN_DATA_KEY
    assert tuple(fields_with("resume_shaping")) == MAIN_WEIGHT_SHAPING
    assert set(trl_names("resume_restored")) == MAIN_RESTORED and trl_names("resume_applied") == MAIN_APPLIED
    assert set(trl_with("run_owned")) == set(fields_with("run_owned")) == MAIN_RUN_OWNED
    assert set(trl_with("backend_decided")) == set(fields_with("backend_decided")) == MAIN_BACKEND_DECIDED
    assert set(fields_with("warmup_input")) == MAIN_WARMUP and set(fields_with("eval_input")) == MAIN_EVAL
    assert set(fields_with("eval_start")) == MAIN_EVAL_START


def test_an_unknown_role_is_refused():
    with pytest.raises(KeyError, match="unknown role 'data_kee'"):
        fields_with("data_kee")


@dataclasses.dataclass
class MadeUp(DataArguments):
    """A section with one made-up option per role, declared as fields.py declares ours."""
    made_up_data: int = _help("Made up: shapes the prepared rows.", default=0, roles=("data_key",))
    made_up_warmup: int = _help("Made up: the warm-up reads it.", default=0, roles=("warmup_input",))
    made_up_eval: int = _help("Made up: the eval reads it.", default=0, roles={"eval_input": "loading"})
    made_up_start: int = _help("Made up: eval before starts from it.", default=0, roles=("eval_start",))
    made_up_shape: int = _help("Made up: shapes the weights.", default=0, roles=("resume_shaping",))
    made_up_restored: int = _help("Made up: a checkpoint restores it.", default=0, roles=("resume_restored",))
    made_up_applied: int = _help("Made up: a resume applies it.", default=0, roles=("resume_applied",))


def made_up(cfg: PipelineConfig, **values) -> PipelineConfig:
    return dataclasses.replace(cfg, data=MadeUp(**{**dataclasses.asdict(cfg.data), **values}))


def test_a_made_up_data_key_field_moves_the_data_cache_key(tmp_path, qwen_tokenizer):
    cfg = made_up(make_cfg(tmp_path))
    first = prepare_dataset(cfg, qwen_tokenizer, write_report=False)
    assert prepare_dataset(cfg, qwen_tokenizer, write_report=False).fingerprint == first.fingerprint
    changed = prepare_dataset(made_up(cfg, made_up_data=1), qwen_tokenizer, write_report=False)
    assert changed.fingerprint != first.fingerprint and changed.report["cache_hit"] is False
    assert data_fields(made_up(cfg, made_up_data=1))["made_up_data"] == 1


def test_a_made_up_warmup_input_changes_the_warmups_key(tmp_path):
    prepared = type("Prepared", (), {"fingerprint": "data-1"})()
    cfg = made_up(make_cfg(tmp_path))
    before = warmup_inputs(cfg, prepared)
    assert warmup_inputs(made_up(cfg, made_up_warmup=1), prepared) == {**before, "made_up_warmup": 1}


@pytest.mark.parametrize("option,where", [("made_up_eval", "loading"), ("made_up_start", "start")])
def test_a_made_up_eval_input_is_part_of_eval_befores_reuse_key(option, where, tmp_path):
    from grpo_pipeline.pipeline.demo.model import build_demo_tokenizer

    cfg, tokenizer = made_up(make_cfg(tmp_path)), build_demo_tokenizer()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_eval_before(run_dir, eval_before_inputs(eval_key(cfg), "plain", tokenizer, [], 16), {"accuracy": 0.5})
    said = []
    assert load_eval_before(run_dir, eval_before_inputs(eval_key(cfg), "plain", tokenizer, [], 16),
                            said.append) is not None
    changed = eval_before_inputs(eval_key(made_up(cfg, **{option: 1})), "plain", tokenizer, [], 16)
    assert load_eval_before(run_dir, changed, said.append) is None and f"({where} changed" in said[0]


def _checkpoint(tmp_path, cfg):
    folder = tmp_path / "run" / "checkpoint-2"
    folder.mkdir(parents=True)
    (folder / SHAPE_NAME).write_text(json.dumps(checkpoint_record(resume_key(cfg))))
    return folder


def test_resume_refuses_restores_and_applies_made_up_fields_as_their_roles_say(tmp_path):
    cfg = made_up(make_cfg(tmp_path))
    checkpoint = _checkpoint(tmp_path, cfg)
    assert resume_mismatch(checkpoint, resume_key(cfg)) is None and resume_changes(checkpoint, resume_key(cfg)) == {}
    shape = resume_mismatch(checkpoint, resume_key(made_up(cfg, made_up_shape=4)))
    assert "trained with other weights: made_up_shape 0 -> 4" in shape
    restored = resume_mismatch(checkpoint, resume_key(made_up(cfg, made_up_restored=4)))
    assert "made_up_restored 0 -> 4" in restored and "Set them back (made_up_restored: 0)" in restored
    applied = made_up(cfg, made_up_applied=4)
    assert resume_mismatch(checkpoint, resume_key(applied)) is None and resume_changes(checkpoint, resume_key(applied)) == {
        "made_up_applied": [0, 4]}


def test_a_trl_field_given_a_role_in_the_table_is_refused_or_decided_as_it_says(monkeypatch):
    from grpo_pipeline.pipeline.trainer.build import build_grpo_config

    monkeypatch.setitem(TRL_ROLES, "top_entropy_quantile", {"run_owned": "made up: the run sets it"})
    with pytest.raises(ConfigError, match="the run sets it itself: made up: the run sets it"):
        from_mapping({"top_entropy_quantile": 0.5})
    monkeypatch.setitem(TRL_ROLES, "top_entropy_quantile", {"backend_decided": "made_up_option"})
    cfg = from_mapping({"top_entropy_quantile": 0.5})
    with pytest.raises(ConfigError, match="It is decided by made_up_option"):
        build_grpo_config(cfg, {"top_entropy_quantile": 1.0})
