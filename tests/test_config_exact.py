"""Config semantics are exact (docs/reliability.md): a key given twice is refused with file and line; every
numeric field is either bounded (a value past the bound is refused, naming the field) or does what it says
for every value; a value given as an empty string or 0 is kept as given, never replaced by a default."""

import dataclasses
import json
import math
import typing

import pytest

from grpo_pipeline.pipeline.config import SECTIONS, ConfigError, PipelineConfig, given, parse_config, validate
from grpo_pipeline.pipeline.config.fields import field_rules

# Numeric fields without declared bounds, and why every value does exactly what it says (or which check in
# validate() refuses the rest). A new numeric field must be bounded in fields.py or explained here.
UNBOUNDED = {
    "lora_r": "validate(): refused <= 0 and above max_lora_rank",
    "num_generations": "validate(): refused < 2",
    "beta": "validate(): refused < 0; 0 means no KL and no reference model",
    "temperature": "validate(): refused <= 0 (rollouts must sample)",
    "beta_min": "used only with adaptive_beta, where validate() needs 0 <= beta_min <= beta_max",
    "beta_max": "used only with adaptive_beta, where validate() needs 0 <= beta_min <= beta_max",
}
# Values inside the declared bounds that are refused anyway because they would do something other than written.
REFUSED_INSIDE_BOUNDS = {"max_steps": 0}


def numeric_fields():
    for section in SECTIONS:
        hints = typing.get_type_hints(section)
        for f in dataclasses.fields(section):
            kind = hints[f.name]
            args = [a for a in typing.get_args(kind) if a is not type(None)]
            kind = args[0] if typing.get_origin(kind) is typing.Union else kind
            if kind in (int, float):
                yield f.name, kind, field_rules(f)


NUMERIC = {name: (kind, rules) for name, kind, rules in numeric_fields()}


def test_every_numeric_field_is_bounded_or_explained():
    undecided = [name for name, (_, rules) in NUMERIC.items()
                 if not ({"gt", "ge", "lt", "le"} & set(rules)) and name not in UNBOUNDED]
    assert undecided == []


def _past(bound_name: str, bound: float, kind: type) -> float:
    step = 1 if kind is int else 1e-6 * max(1.0, abs(bound))
    return {"gt": bound, "ge": bound - step, "lt": bound, "le": bound + step}[bound_name]


CASES = [(name, key) for name, (_, rules) in NUMERIC.items() for key in ("gt", "ge", "lt", "le") if key in rules]


@pytest.mark.parametrize("name, bound_name", CASES, ids=[f"{n}-{b}" for n, b in CASES])
def test_a_value_past_a_declared_bound_is_refused_naming_the_field(name, bound_name):
    kind, rules = NUMERIC[name]
    value = _past(bound_name, rules[bound_name], kind)
    if kind is int:
        value = int(math.floor(value) if bound_name in ("ge", "gt") else math.ceil(value))
    with pytest.raises(ConfigError) as caught:
        validate(PipelineConfig().replace(**{name: value}))
    assert caught.value.field == name


@pytest.mark.parametrize("name, value", list(REFUSED_INSIDE_BOUNDS.items()))
def test_degenerate_values_are_refused(name, value):
    with pytest.raises(ConfigError) as caught:
        validate(PipelineConfig().replace(**{name: value}))
    assert caught.value.field == name


def test_a_key_given_twice_is_refused_with_file_and_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: 1e-5\nmax_steps: 3\nbeta: 0.0\nmax_steps: 5\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        parse_config(["--config", str(recipe)])
    text = str(caught.value)
    assert caught.value.field == "max_steps" and f"{recipe} line 4" in text and "first on line 2" in text


def test_a_key_given_twice_inside_a_nested_mapping_is_refused(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("vllm_sampling_params: {min_p: 0.1, min_p: 0.2}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="`min_p` is set twice"):
        parse_config(["--config", str(recipe)])


def test_merge_keys_still_override(tmp_path):
    from grpo_pipeline.pipeline.config import read_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text("vllm_sampling_params:\n  <<: {min_p: 0.1}\n  min_p: 0.2\n", encoding="utf-8")
    assert read_recipe(str(recipe))["vllm_sampling_params"] == {"min_p": 0.2}


def test_given_keeps_empty_and_zero_values():
    assert given("", "default") == "" and given(0, 5) == 0 and given(None, False) is False


def test_an_empty_system_prompt_is_kept_from_recipe_to_generation(tmp_path):
    """system_prompt: "" trains without a system message; generate/eval reading the manifest must too."""
    from fault_kit import adapter

    from grpo_pipeline.pipeline.infer.session import inference_args, open_inference

    recipe = tmp_path / "r.yaml"
    recipe.write_text('system_prompt: ""\n', encoding="utf-8")
    assert parse_config(["--config", str(recipe)]).data.system_prompt == ""

    lora = adapter(tmp_path)
    manifest = tmp_path / "run" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "system_prompt": ""}), encoding="utf-8")
    setup = open_inference(inference_args(lora=str(lora), backend="plain"))
    assert setup is not None and setup.system_prompt == ""
    setup = open_inference(inference_args(lora=str(lora), backend="plain", system_prompt=""))
    assert setup.system_prompt == ""


def test_a_relative_base_model_in_a_manifest_resolves_against_its_folder(tmp_path, monkeypatch):
    from grpo_pipeline.pipeline.run.manifest import find_manifest

    run = tmp_path / "run"
    (run / "models" / "base").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"base_model": "models/base"}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # the same relative name would not exist from here
    assert find_manifest(run)["base_model"] == str(run / "models" / "base")
    (run / "manifest.json").write_text(json.dumps({"base_model": "org/model"}), encoding="utf-8")
    assert find_manifest(run)["base_model"] == "org/model"  # a hub id stays a hub id


def test_a_local_base_model_is_recorded_absolutely(tmp_path, monkeypatch):
    from grpo_pipeline.pipeline.run.manifest import recorded_base

    (tmp_path / "my-model").mkdir()
    monkeypatch.chdir(tmp_path)
    assert recorded_base("my-model") == str(tmp_path / "my-model")
