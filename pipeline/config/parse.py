"""Parsing `[--config RECIPE.yaml] [--key value ...]` with TRL's `TrlParser`, as open-r1 does. Unknown names,
a recipe without --config and YAML errors are refused first with the closest name and the fix (argparse's messages
list no alternatives). Imports no torch; trl only when parsing.
"""

from __future__ import annotations

import dataclasses
import os
import stat as stat_module
from pathlib import Path
from typing import Any, Optional

import yaml

from grpo_pipeline.env.path_check import INPUT_FILE, PathError, check_path
from grpo_pipeline.env.secret_fields import remember, remember_argv, unmasked
from grpo_pipeline.env.text import excerpt, shorten
from grpo_pipeline.pipeline.config.fields import SECTIONS, ConfigError, field_names
from grpo_pipeline.pipeline.config.pipeline_config import (
    SECTION_ATTR,
    PipelineConfig,
    check_trl_names,
    coerce,
    field_kind,
    typed_value,
    unwrap_optional,
)
from grpo_pipeline.pipeline.config.trl_fields import trl_fields, trl_section
from grpo_pipeline.rewards.user_code import set_recipe_dir


def parse_config(argv: list[str] | None = None, base: dict[str, Any] | None = None) -> PipelineConfig:
    """Parse `[--config FILE] [--key value ...]`; `base`: defaults below the YAML file (the built-in CPU demo's)."""
    from trl import TrlParser  # lazy: trl comes after the bootstrap's `import unsloth` (TrlParser needs no torch)

    argv = normalize_argv(argv or [])
    remember_argv(argv)  # a Python caller's too (the commands' run_command did it already), before any message
    named = check_option_names(argv)
    path = config_path(argv)
    set_recipe_dir(Path(path).parent if path is not None else None)  # named when a module sits only there
    recipe = read_recipe(path) if path is not None else {}  # syntax errors and unknown keys, with file and line
    env = _load_recipe(path)[0].get("env") or {} if path is not None else {}  # TrlParser's `env:` mapping
    if not isinstance(env, dict):
        raise ConfigError("env", f"{os.path.abspath(path)}: `env` must be a mapping of NAME: value lines.")
    remember({**recipe, **env})
    named += list(recipe) + list(base or {})
    # TRL's own fields (trl_fields.py) join the parser only when one is named: deriving them imports torch.
    trl_names = sorted({name for name in named if name not in field_names()})
    sections = (*SECTIONS, trl_section()) if trl_names else SECTIONS
    parser = TrlParser(sections)
    if base:
        unknown = parser.set_defaults_with_config(**base)
        if unknown:
            raise ConfigError(str(unknown[0]), f"unknown option(s) in built-in defaults: {unknown}")
    # The recipe as read once above: TrlParser.parse_args_and_config would open it again, and a pipe
    # (`--config <(...)`) gives its text only once. What it does with the file is done here.
    for key, value in env.items():
        os.environ[key] = str(value)
    parser.set_defaults_with_config(**recipe)
    at = argv.index("--config") if path is not None else len(argv)  # the command line without `--config FILE`
    parsed = parser.parse_args_into_dataclasses(args=argv[:at] + argv[at + 2:])
    by_cls = {type(p): p for p in parsed}
    trl_values = by_cls[trl_section()] if trl_names else None
    return PipelineConfig(**{SECTION_ATTR[cls]: by_cls[cls] for cls in SECTIONS},
                          trl={name: getattr(trl_values, name) for name in trl_names})


def _default(name: str) -> Any:
    """The default of an option of ours or of TRL's; None for a name that is neither."""
    owner = field_names().get(name)
    f = {f.name: f for f in dataclasses.fields(owner)}[name] if owner else trl_fields().get(name)
    return None if f is None else f.default


def normalize_argv(argv: list[str]) -> list[str]:
    """`--config=FILE` -> `--config FILE`: TrlParser only sees the spaced form (it would ignore the recipe).

    >>> normalize_argv(["--config=r.yaml", "--max_steps=3"])
    ['--config', 'r.yaml', '--max_steps=3']
    """
    return [part for arg in argv
            for part in (["--config", arg.split("=", 1)[1]] if arg.startswith("--config=") else [arg])]


def config_path(argv: list[str]) -> Optional[str]:
    """The `--config` file of a normalised argv, or None; a missing value or file is a ConfigError."""
    if "--config" not in argv:
        return None
    index = argv.index("--config")
    if index + 1 >= len(argv) or argv[index + 1].startswith("--"):
        raise ConfigError("config", "--config needs a file, e.g. --config configs/qwen2.5-1.5b-gsm8k.yaml")
    path = argv[index + 1]
    try:
        check_path("config", path, INPUT_FILE)  # missing, a folder, unreadable, an unset $VAR, a symlink loop
    except PathError as err:
        raise ConfigError("config", f"{err.detail} Pass a YAML recipe, e.g. --config "
                          "configs/qwen2.5-1.5b-gsm8k.yaml") from None
    return path


# A recipe is a few KiB; a larger one is refused before it is parsed (no YAML document of ours needs more).
MAX_RECIPE_BYTES = 1 << 20
_RECIPE_TEXT: dict[tuple, str] = {}


def recipe_text(path: str) -> str:
    """The recipe's text, read once per file per process (a pipe, `--config <(...)`, gives it only once)."""
    info = os.stat(path)
    regular = stat_module.S_ISREG(info.st_mode)
    key = (os.path.abspath(path), info.st_dev, info.st_ino) + ((info.st_size, info.st_mtime_ns) if regular else ())
    if key not in _RECIPE_TEXT:
        with open(path, "rb") as f:
            data = f.read(MAX_RECIPE_BYTES + 1)
        if len(data) > MAX_RECIPE_BYTES:
            raise ConfigError("config", f"{os.path.abspath(path)} is over {MAX_RECIPE_BYTES >> 20} MiB; a recipe is "
                              "a short list of `key: value` lines.")
        try:
            _RECIPE_TEXT[key] = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError("config", f"{os.path.abspath(path)} is not UTF-8 text ({err.reason} at byte "
                              f"{err.start}); save it as UTF-8.") from None
    return _RECIPE_TEXT[key]


# What HfArgumentParser's string_to_bool takes for a bool option.
BOOL_WORDS = ("yes", "no", "true", "false", "t", "f", "y", "n", "1", "0")


def check_option_names(argv: list[str]) -> list[str]:
    """The option names given (`--no_X` as X); unknown `--name`s, a recipe without --config or a non-number are
    refused before argparse buries the fix under its usage dump."""
    # argparse also accepts --max-steps; HfArgumentParser adds --no_X for bool fields that default to True.
    names = {i: arg[2:].partition("=")[0].replace("-", "_") for i, arg in enumerate(argv)
             if arg.startswith("--") and len(arg) > 2}
    negated = {name for name in names.values() if name.startswith("no_") and _default(name[3:]) is True}
    given_names = [name[3:] if name in negated else name for name in names.values() if name != "config"]
    not_ours = [name for name in dict.fromkeys(given_names) if name not in field_names()]
    if not_ours:
        check_trl_names(not_ours)
    for i, arg in enumerate(argv):
        if arg.endswith((".yaml", ".yml")) and (i == 0 or not argv[i - 1].startswith("--")):
            raise ConfigError("config", f"{excerpt(arg)} is not an option; to read a recipe write --config {arg}")
        name = names.get(i, "config")
        value = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else None)
        if name == "config" or name in negated or value is None:
            continue
        kind, optional = unwrap_optional(field_kind(name))
        if kind is bool and ("=" in arg or not value.startswith("--")) \
                and value.strip().lower() not in BOOL_WORDS:  # `--flag` alone (nargs="?") is true
            raise ConfigError(name, f"got {excerpt(value)}; use true or false.")
        if kind in (int, float) and not (optional and value.lower() in ("none", "null")):
            coerce(value, kind, name)
    return given_names


def read_recipe(path: str) -> dict[str, Any]:
    """The recipe as a flat mapping; an error names the file and line, an unknown key the closest field name."""
    loaded, lines = _load_recipe(path)
    # `env:` is TrlParser's own key (parse_config sets it); a secret's placeholder (`grpo plan --write`) is unset.
    loaded = unmasked({key: value for key, value in loaded.items() if key != "env"})
    not_ours = sorted(str(k) for k in set(loaded) - set(field_names()))
    if not_ours:
        try:
            check_trl_names(not_ours)
        except ConfigError as err:
            raise ConfigError(err.field, f"{os.path.abspath(path)}: {str(err).split(': ', 1)[1]}") from None
    for key, value in loaded.items():
        try:
            typed_value(key, value)
        except ConfigError as err:
            line = lines.get(key)
            where = f"{os.path.abspath(path)}" + (f" line {line}" if line else "")
            raise ConfigError(key, f"{where}: {str(err).split(': ', 1)[1]}") from None
    return loaded


# How many values a recipe's YAML may expand to, aliases counted each time they are used: a recipe has a few
# dozen; a "billion laughs" alias bomb expands a few lines to billions (and its message, to megabytes).
MAX_RECIPE_VALUES = 100_000


def _load_recipe(path: str) -> tuple[dict[str, Any], dict[str, int]]:
    """The recipe's mapping and each key's line; an alias bomb is refused before anything is expanded."""
    where = os.path.abspath(path)
    loader = UniqueKeyLoader(recipe_text(path))
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_expanded_size(node, where)
        loaded = loader.construct_document(node) if node is not None else None
    except DuplicateKeyError as err:
        raise ConfigError(str(err.key), f"{where} line {err.line}: `{shorten(str(err.key), 80)}` is set twice (first "
                          f"on line {err.first_line}); YAML would silently keep the last one. Keep one.") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError("config", f"{where}{at}: YAML syntax error ({excerpt(problem)}). Each line is `key: "
                          "value`; quote values that contain `: ` or `#`.") from None
    except RecursionError:
        raise ConfigError("config", f"{where}: nested too deeply to be a recipe of `key: value` lines.") from None
    finally:
        loader.dispose()
    if loaded is None:
        return {}, {}
    if not isinstance(loaded, dict):
        raise ConfigError("config", f"{where} must be a mapping of `key: value` lines, got a "
                          f"{type(loaded).__name__}.")
    return loaded, {key.value: key.start_mark.line + 1 for key, _ in node.value if hasattr(key, "value")}


def _check_expanded_size(root: Any, where: str) -> None:
    """Refuse a YAML node graph that expands to more than MAX_RECIPE_VALUES values, or that refers to itself."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: Any) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise ConfigError("config", f"{where} line {node.start_mark.line + 1}: a YAML alias refers to the "
                              "value that holds it; write the value out.")
        open_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(key) + size(value) for key, value in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(item) for item in node.value)
        else:
            total = 1
        open_nodes.discard(id(node))
        sizes[id(node)] = total
        if total > MAX_RECIPE_VALUES:
            raise ConfigError("config", f"{where} line {node.start_mark.line + 1}: its YAML aliases expand to more "
                              f"than {MAX_RECIPE_VALUES:,} values (an alias bomb?); a recipe is a short list of "
                              "`key: value` lines. Write the values out.")
        return total

    size(root)


class DuplicateKeyError(Exception):
    """A key given twice in one YAML mapping (`line`, `first_line`: 1-based)."""

    def __init__(self, key: Any, line: int, first_line: int):
        super().__init__(f"duplicate key {excerpt(key)} on line {line} (first on line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


# libyaml's parser where PyYAML was built with it (its wheels are), with SafeLoader's constructor and resolver:
# ~7x faster than the pure-Python parser (0.4 ms against 2.6 ms a recipe), and a command reads its recipe a few times.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UniqueKeyLoader(_SAFE_LOADER):
    """yaml.SafeLoader (libyaml's when present) refusing a key given twice in a mapping (PyYAML keeps the last); merge
    keys still override.

    >>> yaml.load("a: 1\\nb: 2\\na: 3\\n", Loader=UniqueKeyLoader)
    Traceback (most recent call last):
    ...
    grpo_pipeline.pipeline.config.parse.DuplicateKeyError: duplicate key 'a' on line 3 (first on line 1)
    """

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = key in first
                except TypeError:  # an unhashable key: SafeLoader's own error names it
                    continue
                if seen:
                    raise DuplicateKeyError(key, key_node.start_mark.line + 1, first[key] + 1)
                first[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def peek_option(argv: list[str], name: str, default: Any = None) -> Any:
    """One option from argv or the recipe without importing trl (Unsloth is set up before trl loads)."""
    flag = f"--{name}"
    argv = normalize_argv(argv)
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    path = config_path(argv)
    if path is not None:
        loaded = read_recipe(path)  # a broken recipe is a ConfigError here already
        if name in loaded:
            return loaded[name]
    return default
