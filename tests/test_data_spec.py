"""DataSpec (pipeline/data/spec.py): what the data path reads of the recipe, read once by data_spec."""

import dataclasses

import pytest

from pipeline.config import PipelineConfig, role_values
from pipeline.data.spec import DataSpec, data_spec


def test_the_data_spec_holds_the_recipes_data_values_and_what_is_read_from_them_once():
    cfg = PipelineConfig(trl={"remove_unused_columns": True}).replace(
        dataset_name="my.jsonl", question_field="q", answer_field="final", eval_dataset_name="test.jsonl",
        eval_limit=7, max_samples=40, strict=True, seed=11, sft_warmup_steps=3, eval_after=True,
        reward_funcs=["strict_format", "correctness"], output_dir="runs/mine", max_steps=9, resume="never")
    spec = data_spec(cfg)
    assert (spec.dataset_name, spec.question_field, spec.answer_field, spec.eval_dataset_name) == (
        "my.jsonl", "q", "final", "test.jsonl")
    assert (spec.max_samples, spec.strict, spec.seed, spec.sft_warmup_steps, spec.max_steps, spec.resume) == (
        40, True, 11, 3, 9, "never")
    assert spec.reward_funcs == ("strict_format", "correctness") and spec.evaluates is True
    assert spec.remove_unused_columns is True  # TRL's option, as the run sets it
    assert dict(spec.key_values) == role_values(cfg, "data_key")
    assert spec.paths["dataset_name"] == "my.jsonl" and spec.paths["output_dir"] == "runs/mine"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.max_samples = 1


def test_the_eval_sets_spec_takes_its_limit_never_strict_and_its_cache_key_follows():
    spec = data_spec(PipelineConfig().replace(eval_limit=5, max_samples=40, strict=True))
    assert (spec.for_eval().max_samples, spec.for_eval().strict, spec.for_eval().key_values["max_samples"]) == (
        5, False, 5)
    assert spec.for_eval(2).max_samples == 2 and spec.for_eval(2).key_values["max_samples"] == 2
    assert spec.max_samples == 40 and spec.key_values["max_samples"] == 40  # the training spec is left as it was


def test_every_field_of_the_spec_is_read_from_the_recipe():
    spec = data_spec(PipelineConfig())
    flat = PipelineConfig().to_dict()
    assert all(getattr(spec, f.name) == flat[f.name] or f.name == "reward_funcs"
               for f in dataclasses.fields(DataSpec) if f.name in flat)
