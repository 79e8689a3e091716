"""A value of the wrong type, for every field, in a recipe or on the command line: one ConfigError naming the
field (and for a recipe the file and line), never argparse's usage dump."""

from __future__ import annotations

import typing

import pytest

from grpo_pipeline.pipeline.config import ConfigError, field_names, parse_config

FIELDS = field_names()


def _kind(name: str):
    kind = typing.get_type_hints(FIELDS[name])[name]
    if type(None) in typing.get_args(kind):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    return kind


def wrong_yaml_value(name: str) -> str:
    kind = _kind(name)
    if typing.get_origin(kind) is list:
        return "[a, 1]" if typing.get_args(kind)[0] is float else "[[q_proj]]"
    return {int: "abc", float: "fast", bool: "maybe"}.get(kind, "[one, two]")


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_a_recipe_value_of_the_wrong_type_names_file_line_and_key(tmp_path, name, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"# my recipe\noutput_dir: runs/x\n{name}: {wrong_yaml_value(name)}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        parse_config(["--config", str(recipe)])
    assert err.value.field == name and f"{recipe} line 3" in str(err.value)
    assert "usage:" not in capsys.readouterr().err


SCALAR_FIELDS = sorted(n for n in FIELDS if _kind(n) in (int, float, bool))


@pytest.mark.parametrize("name", SCALAR_FIELDS)
@pytest.mark.parametrize("form", ["spaced", "inline"])
def test_a_command_line_value_of_the_wrong_type_names_the_option(name, form, capsys):
    value = {int: "abc", float: "fast", bool: "maybe"}[_kind(name)]
    argv = [f"--{name}", value] if form == "spaced" else [f"--{name}={value}"]
    with pytest.raises(ConfigError) as err:
        parse_config(argv)
    assert err.value.field == name
    assert "usage:" not in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--load_in_4bit"], ["--load_in_4bit", "--max_steps", "3"], ["--load_in_4bit", "no"],
                                  ["--strict=yes"]])
def test_bool_options_still_take_their_forms(argv):
    parse_config(argv)
