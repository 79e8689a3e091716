"""The whole config: `PipelineConfig` (every section together, plus the TRL options a user set) and how it is
built from a flat mapping (a recipe, a manifest's config): our field names first, then TRL's GRPOConfig fields
(pipeline/config/trl_fields.py), every unknown name refused in one error with its nearest options.
Imports no torch, transformers or trl (TRL's fields are looked up only for a name that is not ours).
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from typing import Any

from grpo_pipeline.pipeline.config.field_help import field_rules
from grpo_pipeline.pipeline.config.fields import (
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
)
from grpo_pipeline.pipeline.config.trl_fields import trl_option_names, trl_with


@dataclass
class PipelineConfig:
    """All sections together. Access `cfg.model.max_seq_length`, `cfg.grpo.beta`, ..."""

    model: ModelArguments = field(default_factory=ModelArguments)
    lora: LoraArguments = field(default_factory=LoraArguments)
    data: DataArguments = field(default_factory=DataArguments)
    grpo: GRPOArguments = field(default_factory=GRPOArguments)
    generation: GenerationArguments = field(default_factory=GenerationArguments)
    health: HealthArguments = field(default_factory=HealthArguments)
    eval: EvalArguments = field(default_factory=EvalArguments)
    # The options set from TRL's own GRPOConfig / TrainingArguments fields (pipeline/config/trl_fields.py), by
    # TRL's names, as given; passed to trl.GRPOConfig as they are.
    trl: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every way a config is made (TrlParser, a recipe through from_mapping, replace) passes here, so this is
        # the one place a lone value becomes a list: YAML `lora_target_modules: q_proj` arrives as the string
        # "q_proj", which peft would otherwise read character by character.
        for values in self._sections():
            for name in list_fields(type(values)):
                value = getattr(values, name)
                if value is not None and not isinstance(value, list):
                    setattr(values, name, list(value) if isinstance(value, tuple) else [value])
                if getattr(values, name) == ["[]"]:  # `--lora_modules_to_save []` on the command line: YAML's `[]`
                    setattr(values, name, [])

    def to_dict(self) -> dict[str, Any]:
        """Flat mapping, the same shape as a YAML recipe."""
        flat = {key: value for values in self._sections() for key, value in dataclasses.asdict(values).items()}
        return {**flat, **self.trl}

    def _sections(self) -> list[Any]:
        return [value for value in vars(self).values() if dataclasses.is_dataclass(value)]

    def sections(self) -> list[type]:
        """The section classes this config is made of (a caller's subclass of a section included)."""
        return [type(value) for value in self._sections()]

    def replace(self, **flat_overrides: Any) -> "PipelineConfig":
        """Return a copy with flat field overrides applied (unknown keys raise ConfigError)."""
        return from_mapping({**self.to_dict(), **flat_overrides})


SECTION_ATTR = {kind: name for name, kind in typing.get_type_hints(PipelineConfig).items() if kind in SECTIONS}


def list_fields(section_cls: type) -> dict[str, type]:
    """The list-typed fields of one section -> their item type.

    >>> list_fields(LoraArguments)
    {'lora_target_modules': <class 'str'>, 'lora_modules_to_save': <class 'str'>}
    """
    found = {}
    for name, kind in typing.get_type_hints(section_cls).items():
        kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind) \
            if type(None) in typing.get_args(kind) else kind
        if typing.get_origin(kind) is list:
            found[name] = typing.get_args(kind)[0]
    return found


def field_choices(name: str) -> tuple[str, ...]:
    """A choice field's declared choices, e.g. for a command's flag of the same name.

    >>> field_choices("backend")
    ('auto', 'unsloth', 'plain')
    """
    return _rules(name)["choices"]


def set_field_choices(name: str, choices: tuple[str, ...]) -> None:
    """Replace a choice field's choices: grpo_pipeline.pipeline.backends.register_backend adds a backend to `backend`'s."""
    _rules(name)["choices"] = tuple(choices)


def _rules(name: str) -> dict[str, Any]:
    return field_rules(next(f for f in dataclasses.fields(field_names()[name]) if f.name == name))


def trl_training_args(cfg: PipelineConfig) -> dict[str, Any]:
    """trl.GRPOConfig keyword arguments: the fields declared with `trl=`, under TRL's names, then the TRL options
    the user set (`cfg.trl`), which win: `warmup_steps: 10` replaces the warmup_ratio default.

    >>> args = trl_training_args(PipelineConfig())
    >>> args["learning_rate"], args["warmup_steps"], "warmup_ratio" in args
    (5e-06, 0.1, False)
    >>> trl_training_args(PipelineConfig(trl={"warmup_steps": 10, "scale_rewards": "none"}))["warmup_steps"]
    10
    """
    forwarded = {f.name if field_rules(f)["trl"] is True else field_rules(f)["trl"]: getattr(values, f.name)
                 for values in cfg._sections() for f in dataclasses.fields(values) if "trl" in field_rules(f)}
    return {**forwarded, **cfg.trl}


def from_mapping(values: dict[str, Any]) -> PipelineConfig:
    """Build a config from a flat mapping (e.g. a parsed YAML recipe): our fields, then TRL's GRPOConfig fields
    (only looked up when a key is not ours: trl imports torch); every unknown key is named in one error."""
    owners = field_names()
    rest = [key for key in values if key not in owners]
    if rest:
        check_trl_names(rest)
    parts: dict[type, dict[str, Any]] = {cls: {} for cls in SECTIONS}
    for key, value in values.items():
        if key in owners:
            parts[owners[key]][key] = value
    return PipelineConfig(**{SECTION_ATTR[cls]: cls(**kw) for cls, kw in parts.items()},
                          trl={key: values[key] for key in rest})


def check_trl_names(names: list[str]) -> None:
    """Refuse, in one error, every name that is neither ours nor one of TRL's options (each with its nearest
    option from both sets), and a TRL field the run owns (with the reason)."""
    known = set(trl_option_names())
    for name in names:
        reason = trl_with("run_owned").get(name)
        if reason:
            raise ConfigError(name, f"`{name}` is TRL's, but the run sets it itself: {reason}.")
    unknown = [name for name in names if name not in known]
    if unknown:
        raise unknown_options_error(unknown, [*field_names(), *known])


# Names users bring from TRL's ModelConfig / ScriptArguments and open-r1's recipes, which are not GRPOConfig
# fields: the option of ours that does that job.
ALIASES = {
    "torch_dtype": "dtype", "model_revision": "model_name_or_path (a local folder of that revision)",
    "dataset_train_split": "dataset_split", "dataset_test_split": "eval_split",
    "dataset_prompt_column": "question_field (or a `prompt` column, used as it is)", "use_peft": "lora_r (LoRA is "
    "always on)", "lora_task_type": "lora_target_modules", "attn_implementation": "backend",
    "load_in_8bit": "load_in_4bit", "chat_template": "system_prompt",
}


def unknown_options_error(names: list[str], known: list[str] | None = None) -> ConfigError:
    """Every unknown option in one message, each with its closest names (difflib over ours and TRL's, and
    ALIASES) as the likely fix. The error's field is the first unknown name."""
    known = list(field_names()) if known is None else known
    lines = []
    for name in names:
        close = list(dict.fromkeys(([ALIASES[name]] if name in ALIASES else [])
                                   + difflib.get_close_matches(name, known, n=3, cutoff=0.6)))
        hint = f"did you mean {' or '.join(f'`{c}`' for c in close)}?" if close else "no option has a similar name."
        lines.append(f"`{name}`: {hint}")
    head = f"unknown option `{names[0]}`; " if len(names) == 1 else f"{len(names)} unknown options: "
    body = lines[0].split(": ", 1)[1] if len(names) == 1 else "; ".join(lines)
    return ConfigError(names[0], f"{head}{body} All options: `grpo train --help` (ours, then TRL's GRPOConfig).")
