"""The config's path options checked before anything runs (env.path_check's table), as ConfigError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from env.path_check import PathError, check_command_paths
from pipeline.config.fields import ConfigError
from pipeline.config.pipeline_config import PipelineConfig


def config_paths(cfg: PipelineConfig | dict[str, Any], *fields: str) -> dict[str, Path]:
    """Check the config's path `fields` (env.path_check's table: output_dir, data_cache_dir, a local dataset_name
    or model folder, --resume PATH) before anything runs; each refusal is a ConfigError naming the field."""
    try:
        return check_command_paths("train", cfg.to_dict() if isinstance(cfg, PipelineConfig) else cfg, only=fields)
    except PathError as err:
        raise ConfigError(err.option, err.detail) from None
