"""The data path reads the recipe (PipelineConfig) from its sections; what it works out from them is a function
each: the eval set's preparing (pipeline/data/run_data.py eval_config), the cache key's options (the role data_key),
the columns TRL passes the rewards (removes_unused_columns), whether the run reads the held-out set."""

import dataclasses

from grpo_pipeline.pipeline.config import DataArguments, PipelineConfig, role_values
from grpo_pipeline.pipeline.config.fields import _help
from grpo_pipeline.pipeline.data.columns import removes_unused_columns
from grpo_pipeline.pipeline.data.prepare import data_fields
from grpo_pipeline.pipeline.data.run_data import eval_config
from grpo_pipeline.pipeline.data.source_spec import source_spec


def test_what_the_data_path_works_out_from_the_recipe():
    cfg = PipelineConfig(trl={"remove_unused_columns": True}).replace(
        dataset_name="my.jsonl", question_field="q", answer_field="final", eval_dataset_name="test.jsonl",
        eval_limit=7, max_samples=40, strict=True, seed=11, sft_warmup_steps=3, eval_after=True,
        reward_funcs=["strict_format", "correctness"], output_dir="runs/mine", max_steps=9, resume="never")
    spec = source_spec(cfg)
    assert (spec.name, spec.question_field, spec.answer_field) == ("my.jsonl", "q", "final")
    assert source_spec(cfg, "eval").name == "test.jsonl"
    assert cfg.eval.uses_eval_set() is True
    assert removes_unused_columns(cfg.trl) is True  # TRL's option, as the run sets it
    key = data_fields(cfg)
    assert {name: key[name] for name in role_values(cfg, "data_key")} == {
        **role_values(cfg, "data_key"), "max_prompt_length": None, "max_completion_length": None}  # `auto`: None
    assert cfg.to_dict()["dataset_name"] == "my.jsonl" and cfg.to_dict()["output_dir"] == "runs/mine"  # the paths


def test_the_eval_sets_config_takes_its_limit_never_strict_and_its_cache_key_follows():
    cfg = PipelineConfig().replace(eval_limit=5, max_samples=40, strict=True)
    assert (eval_config(cfg).data.max_samples, eval_config(cfg).data.strict,
            data_fields(eval_config(cfg))["max_samples"]) == (5, False, 5)
    assert eval_config(cfg, 2).data.max_samples == 2 and data_fields(eval_config(cfg, 2))["max_samples"] == 2
    assert cfg.data.max_samples == 40 and data_fields(cfg)["max_samples"] == 40  # the training config as it was


@dataclasses.dataclass
class MadeUp(DataArguments):
    made_up_data: int = _help("Made up: shapes the prepared rows.", default=0, roles=("data_key",))


def test_the_eval_sets_config_keeps_a_sections_own_class_and_its_options():
    cfg = dataclasses.replace(PipelineConfig(), data=MadeUp(made_up_data=3))
    assert isinstance(eval_config(cfg).data, MadeUp) and data_fields(eval_config(cfg))["made_up_data"] == 3
