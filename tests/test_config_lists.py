"""Every list-typed config field takes a lone value as a one-element list, from YAML, the CLI and from_mapping;
and LoRA module names are checked against the model's real modules before it loads."""

from __future__ import annotations

import pytest

from grpo_pipeline.pipeline.config import SECTIONS, ConfigError, from_mapping, parse_config, validate
from grpo_pipeline.pipeline.config.pipeline_config import list_fields
from grpo_pipeline.pipeline.data.lora_targets import check_lora_targets, model_module_types

# A valid lone value for each list field (the item type decides).
LONE = {str: "norm", float: 2.0}
LIST_FIELDS = {name: item for cls in SECTIONS for name, item in list_fields(cls).items()}


def test_the_list_fields_are_found():
    assert {"lora_target_modules", "lora_modules_to_save", "reward_funcs", "reward_weights"} <= set(LIST_FIELDS)


def _lone(name: str):
    return {"reward_funcs": "int", "lora_target_modules": "q_proj"}.get(name, LONE[LIST_FIELDS[name]])


@pytest.mark.parametrize("name", sorted(LIST_FIELDS))
@pytest.mark.parametrize("how", ["yaml", "cli", "mapping"])
def test_a_lone_value_is_a_one_element_list(tmp_path, name, how):
    value = _lone(name)
    extra = {"reward_funcs": ["int"]} if name == "reward_weights" else {}
    if how == "yaml":
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"{name}: {value}\n" + "".join(f"{k}: {v}\n" for k, v in extra.items()),
                          encoding="utf-8")
        cfg = parse_config(["--config", str(recipe)])
    elif how == "cli":
        argv = [f"--{name}", str(value)]
        for k, v in extra.items():
            argv += [f"--{k}", *v]
        cfg = parse_config(argv)
    else:
        cfg = from_mapping({name: value, **extra})
    validate(cfg)
    got = cfg.to_dict()[name]
    assert got == [value] and type(got[0]) is LIST_FIELDS[name]


@pytest.mark.parametrize("name", sorted(n for n, item in LIST_FIELDS.items() if item is str))
@pytest.mark.parametrize("bad", [3, "", None])
def test_a_list_of_names_refuses_non_names(name, bad):
    with pytest.raises(ConfigError) as err:
        validate(from_mapping({name: ["int", bad] if name == "reward_funcs" else [bad]}))
    assert err.value.field == name


def test_tiny_model_module_names_come_from_the_architecture_alone():
    types = model_module_types("tiny-qwen2.5")
    assert types["model.layers.0.self_attn.q_proj"] == "Linear"
    assert types["model.embed_tokens"] == "Embedding"


@pytest.mark.parametrize("field,value,phrase", [
    ("lora_target_modules", ["q_proj", "qproj"], "has no module named 'qproj'"),
    ("lora_target_modules", ["mlp"], "'mlp' names Qwen2MLP modules, which LoRA cannot adapt"),
    ("lora_target_modules", "q_projection", "has no module named 'q_projection'"),
    ("lora_modules_to_save", ["embed_token"], "has no module named 'embed_token'"),
])
def test_a_module_the_model_lacks_is_refused_listing_its_names(field, value, phrase):
    cfg = from_mapping({"model_name_or_path": "tiny-qwen2.5", "backend": "plain", field: value})
    with pytest.raises(ConfigError) as err:
        check_lora_targets(cfg.model.model_name_or_path, cfg.model.trust_remote_code, cfg.lora.lora_target_modules,
                           cfg.lora.lora_modules_to_save)
    assert err.value.field == field and phrase in str(err.value)
    for name in ("q_proj", "down_proj", "embed_tokens") if field == "lora_target_modules" else ("norm", "lm_head"):
        assert name in str(err.value)


@pytest.mark.parametrize("targets,to_save", [("q_proj", ["embed_tokens", "norm"]), (["self_attn.q_proj", "up_proj"], []),
                                             (["lm_head"], ["layernorm"])])  # peft: a plain suffix for to-save names
def test_real_module_names_pass(targets, to_save):
    cfg = from_mapping({"model_name_or_path": "tiny-qwen2.5", "backend": "plain", "lora_target_modules": targets,
                        "lora_modules_to_save": to_save})
    assert "all found in the model" in check_lora_targets(cfg.model.model_name_or_path, cfg.model.trust_remote_code,
                                                          cfg.lora.lora_target_modules, cfg.lora.lora_modules_to_save)



def test_module_names_of_a_model_in_the_hf_cache_offline(tmp_path, monkeypatch):
    """A hub id already in the Hugging Face cache: its config.json is read there, no network, no weights."""
    import shutil

    from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path

    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    shutil.copy(f"{resolve_model_path('tiny-qwen2.5')}/config.json", snapshot / "config.json")
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    assert model_module_types("acme/tiny")["model.layers.0.mlp.down_proj"] == "Linear"
    cfg = from_mapping({"model_name_or_path": "acme/tiny", "lora_target_modules": ["qkv"]})
    with pytest.raises(ConfigError, match="has no module named 'qkv'"):
        check_lora_targets(cfg.model.model_name_or_path, cfg.model.trust_remote_code, cfg.lora.lora_target_modules,
                           cfg.lora.lora_modules_to_save)


@pytest.mark.parametrize("name", sorted(n for n, item in LIST_FIELDS.items() if item is str and n != "reward_funcs"))
def test_an_empty_list_on_the_command_line_is_written_as_in_yaml(name):
    """`--lora_modules_to_save []` clears a list a recipe or the demo's defaults set, as `[]` does in YAML."""
    assert parse_config([f"--{name}", "[]"]).to_dict()[name] == []
