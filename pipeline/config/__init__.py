"""One config for the whole pipeline: fields.py declares the options, parse.py reads them with TRL's `TrlParser`,
validate.py refuses what would fail later inside TRL or Unsloth. Imports no torch, transformers or trl.
"""

from grpo_pipeline.pipeline.config.fields import (
    DEFAULT_SYSTEM_PROMPT,
    SECTIONS,
    ConfigError,
    DataArguments,
    EvalArguments,
    GenerationArguments,
    GRPOArguments,
    HealthArguments,
    LoraArguments,
    ModelArguments,
    field_names,
    given,
)
from grpo_pipeline.pipeline.config.pipeline_config import (
    PipelineConfig,
    check_choice,
    check_choices,
    check_field_values,
    field_choices,
    from_mapping,
    trl_training_args,
)
from grpo_pipeline.pipeline.config.roles import ROLES, fields_with, role_values, trl_names
from grpo_pipeline.pipeline.config.parse import normalize_argv, parse_config, peek_option, read_recipe
from grpo_pipeline.pipeline.config.validate import (
    UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS,
    check_adapter_rank,
    parse_limit,
    resolve_optim,
    sampling_params_mapping,
    validate,
    validate_unsloth,
)

__all__ = [
    "DEFAULT_SYSTEM_PROMPT", "ROLES", "SECTIONS", "UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS", "ConfigError", "DataArguments",
    "EvalArguments", "GRPOArguments", "GenerationArguments", "HealthArguments", "LoraArguments", "ModelArguments",
    "PipelineConfig", "check_adapter_rank", "check_choice", "check_choices", "check_field_values", "field_choices",
    "field_names", "fields_with", "from_mapping", "given", "normalize_argv", "parse_config", "parse_limit",
    "peek_option", "read_recipe", "resolve_optim", "role_values", "sampling_params_mapping", "trl_names",
    "trl_training_args", "validate", "validate_unsloth",
]
