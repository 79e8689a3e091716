"""The config's path options checked before anything runs (grpo_pipeline.env.path_check's table), as ConfigError."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from grpo_pipeline.env.path_check import PathError, check_command_paths
from grpo_pipeline.pipeline.config.fields import ConfigError


def config_paths(paths: Mapping[str, Any], *fields: str) -> dict[str, Path]:
    """Check the path `fields` (grpo_pipeline.env.path_check's table: output_dir, data_cache_dir, a local dataset_name or model
    folder, --resume PATH) before anything runs; `paths`: the path options' values (a config's `to_dict()`: every
    one, so an output is checked against all the run reads). Each refusal is a ConfigError
    naming the field."""
    try:
        return check_command_paths("train", paths, only=fields)
    except PathError as err:
        raise ConfigError(err.option, err.detail) from None
