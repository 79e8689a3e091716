"""A built-in model's own defaults (pipeline/demo/registry.py) apply below the recipe and the command line."""

from __future__ import annotations

import pytest

from grpo_pipeline.pipeline.backends import choose_backend
from grpo_pipeline.pipeline.bootstrap import defaults_for
from grpo_pipeline.pipeline.config import parse_config, validate
from grpo_pipeline.pipeline.demo.registry import TINY_QWEN_DEFAULTS


def _parse(argv):
    argv, base, _ = defaults_for(argv, choose_backend("plain", False))
    return parse_config(argv, base=base)


def test_a_recipe_naming_tiny_qwen_gets_its_defaults(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: tiny-qwen2.5\ndataset_name: sample\n", encoding="utf-8")
    cfg = _parse(["--config", str(recipe)])
    validate(cfg)
    flat = cfg.to_dict()
    assert {k: flat[k] for k in TINY_QWEN_DEFAULTS} == TINY_QWEN_DEFAULTS


@pytest.mark.parametrize("key", sorted(TINY_QWEN_DEFAULTS))
def test_the_recipe_and_the_command_line_win_over_the_model_defaults(tmp_path, key):
    other = {"max_seq_length": 640, "max_completion_length": "48", "num_generations": 2,
             "per_device_train_batch_size": 2, "lora_r": 4, "lora_alpha": 4, "garbled_action": "stop"}[key]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model_name_or_path: tiny-qwen2.5\n{key}: {other}\n", encoding="utf-8")
    assert str(_parse(["--config", str(recipe)]).to_dict()[key]) == str(other)
    cli = _parse(["--model_name_or_path", "tiny-qwen2.5", f"--{key}", str(other)])
    assert str(cli.to_dict()[key]) == str(other) and cli.model.model_name_or_path == "tiny-qwen2.5"


def test_other_models_get_no_model_defaults(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: unsloth/Qwen2.5-1.5B-Instruct\n", encoding="utf-8")
    assert defaults_for(["--config", str(recipe)], choose_backend("plain", False))[1] is None
