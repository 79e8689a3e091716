"""`grpo train --help`: lists --check, and every option's shown default is the value a run with the same
arguments gets; help texts never state a value of their own that a recipe could contradict."""

from __future__ import annotations

import dataclasses
import re

import pytest

from grpo_pipeline.pipeline.backends import choose_backend
from grpo_pipeline.pipeline.bootstrap import defaults_for
from grpo_pipeline.pipeline.config import SECTIONS, parse_config
from grpo_pipeline.pipeline.train import print_help as _print_help

OPTION = re.compile(r"^  (--\w+)")


def help_blocks(argv, capsys) -> dict[str, str]:
    assert _print_help([*argv, "--help"]) == 0
    blocks: dict[str, str] = {}
    current = None
    for line in capsys.readouterr().out.splitlines():
        match = OPTION.match(line)
        if match:
            current = match.group(1)[2:]
            blocks[current] = line
        elif current and line.startswith("      "):
            blocks[current] += " " + line.strip()
        else:
            current = None
    return blocks


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.fixture
def tiny_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: tiny-qwen2.5\ndataset_name: sample\nlearning_rate: 1.0e-4\n")
    return str(recipe)


@pytest.mark.parametrize("which", ["cpu-demo", "gpu-recipe", "tiny-qwen-recipe"])
def test_every_shown_default_is_what_the_run_gets(which, capsys, tiny_recipe):
    argv = {"cpu-demo": [], "gpu-recipe": ["--config", "configs/qwen2.5-1.5b-gsm8k.yaml"],
            "tiny-qwen-recipe": ["--config", tiny_recipe]}[which]
    blocks = help_blocks(argv, capsys)
    assert "check" in blocks
    run_argv, base, _ = defaults_for(argv, choose_backend("plain", False))
    values = parse_config(run_argv, base=base).to_dict()
    for name, value in values.items():
        assert name in blocks, name
        shown = re.search(r"\(default: (.*)\)\s*$", blocks[name])
        assert shown, (name, blocks[name])
        assert _squash(shown.group(1)) == _squash(str(value)), (which, name, shown.group(1), value)


BAD_PHRASES = re.compile(r"\bby default\b|\bthe default is\b|^\S+ as in\b|^(true|false|[-+]?[\d.]+(e-?\d+)?)\b(?! *[=|])",
                         re.I)


@pytest.mark.parametrize("field", [f for cls in SECTIONS for f in dataclasses.fields(cls)], ids=lambda f: f.name)
def test_help_texts_state_no_value_of_their_own(field):
    assert not BAD_PHRASES.search(field.metadata["help"]), field.metadata["help"]
