"""Every message suggests only options of the command that printed it: each command's error paths are run through
the real CLI, and each `--option` its output names is checked against that command's own parser (recorded as the
command parsed its arguments); a field only a recipe can set is said as `name: value` in the recipe
(pipeline/errors.py fit_to_command, the one place)."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from grpo_pipeline.pipeline.config.fields import field_names
from grpo_pipeline.pipeline.config.trl_fields import trl_option_names
from tests.cli_helpers import run_cli

OPTION = re.compile(r"(?<![\w-])--([A-Za-z][\w-]*)")
ALWAYS = {"--debug", "--help"}  # grpo's own, for every command
# These take every config field as --name value, and --config (parse_config reads it before TrlParser parses)
TAKES_CONFIG_FIELDS = {"rewards", "train", "data"}


@pytest.fixture
def parsers(monkeypatch):
    """The parsers the commands parse their arguments with, in order (a spy: each parses for real)."""
    seen: list[argparse.ArgumentParser] = []
    for name in ("parse_args", "parse_known_args"):
        real = getattr(argparse.ArgumentParser, name)

        def spy(self, *args, _real=real, **kwargs):
            seen.append(self)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(argparse.ArgumentParser, name, spy)
    return seen


def _verl(tmp_path):
    folder = tmp_path / "verl"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({
        "data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{i} + 5?"}], "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i + 5)}}) + "\n" for i in range(4)))
    return folder


def _cases(tmp_path):
    verl = _verl(tmp_path)
    missing = str(tmp_path / "no-such-adapter")
    recipe = tmp_path / "verl.yaml"  # its dataset_name has a train split only: the eval set is to be named
    recipe.write_text(f"model_name_or_path: tiny-demo\ndataset_name: {verl}\n")
    return [
        ["eval", "--base", "--model", "tiny-demo", "--data", str(recipe), "--output", str(tmp_path / "e.json")],
        ["eval", "--base", "--data", str(verl / "train.jsonl")],
        ["eval", "--lora", missing, "--data", str(verl / "train.jsonl")],
        ["eval", "--base", "--model", "tiny-demo", "--data", str(verl / "train.jsonl"), "--output",
         str(tmp_path / "e.json")],
        ["generate", "--lora", missing, "--prompt", "1+1?"],
        ["export", "--lora", missing, "--to", "merged16", "--out", str(tmp_path / "out")],
        ["rewards", "--reward_funcs", "acuracy_reward", "--output_dir", str(tmp_path / "r")],
        ["data", "--dataset_name", str(tmp_path / "missing.jsonl"), "--output_dir", str(tmp_path / "d")],
        ["train", "--check", "--dataset_name", str(verl), "--eval_after", "true", "--output_dir", str(tmp_path / "t")],
    ]


def test_each_suggested_option_is_one_the_printing_command_takes(tmp_path, monkeypatch, capsys, parsers):
    monkeypatch.chdir(tmp_path)
    translated = []
    for argv in _cases(tmp_path):
        parsers.clear()
        code, out = run_cli(argv, capsys)
        assert code == 2 and "Traceback" not in out, (argv, out)
        own = {option for parser in parsers for action in parser._actions for option in action.option_strings}
        for name in OPTION.findall(out):
            option = f"--{name}"
            ok = option in own | ALWAYS or (argv[0] in TAKES_CONFIG_FIELDS and (
                name == "config" or name in field_names() or name in trl_option_names()))
            assert ok, (argv[0], option, out)
        translated += re.findall(r"`(\w+): [^`]+`", out) if "takes the fields in `backquotes`" in out else []
    # grpo eval on a folder without a test split: the data layer's --eval_dataset_name, said as the recipe field
    assert "eval_dataset_name" in translated
