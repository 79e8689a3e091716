"""The config's path options checked before anything runs (grpo_pipeline.env.path_check's table), as ConfigError."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from grpo_pipeline.env.path_check import PathError, check_command_paths
from grpo_pipeline.pipeline.config.fields import ConfigError


def config_paths(paths: Mapping[str, Any], *fields: str) -> dict[str, Path]:
    """Check the path `fields` before anything runs, each refusal a ConfigError naming the field; `paths`: every path
    option's value (a config's `to_dict()`), so an output is checked against all the run reads."""
    try:
        return check_command_paths("train", paths, only=fields)
    except PathError as err:
        raise ConfigError(err.option, err.detail) from None
