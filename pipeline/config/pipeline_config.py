"""The whole config: `PipelineConfig` (every section, plus the TRL options a user set), built from a flat mapping
with every unknown name refused in one error; and each field's value alone (type, bounds, choices), before the
cross-field rules of validate.py. Imports no torch, transformers or trl.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import operator
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.config.fields import (
    MIN_SAMPLING_TEMPERATURE,
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
    field_rules,
)
from grpo_pipeline.pipeline.config.trl_fields import TRL_BOUNDS, trl_option_names, trl_section, trl_with


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
    # The TRL options set (pipeline/config/trl_fields.py), by TRL's names; passed to trl.GRPOConfig as they are.
    trl: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every way a config is made passes here: a lone value becomes a list (YAML `lora_target_modules: q_proj`
        # arrives as "q_proj", which peft would read character by character).
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
    hints = {name: unwrap_optional(kind)[0] for name, kind in _type_hints(section_cls).items()}
    return {name: typing.get_args(kind)[0] for name, kind in hints.items() if typing.get_origin(kind) is list}


def unwrap_optional(kind: Any) -> tuple[Any, bool]:
    """(X, True) for Optional[X], (kind, False) for a hint that takes no None; a wider union (TRL's `dict | str |
    None`) stays whole: TRL checks those itself.

    >>> unwrap_optional(Optional[int]), unwrap_optional(list[str])
    ((<class 'int'>, True), (list[str], False))
    """
    args = typing.get_args(kind)
    others = [a for a in args if a is not type(None)]
    return (others[0] if len(others) == 1 and len(args) == 2 else kind), type(None) in args


# Once per section class: a recipe asks for the hints once per value (~450 times for one `grpo train --config`).
_type_hints = functools.lru_cache(maxsize=None)(typing.get_type_hints)


def field_kind(name: str) -> Any:
    """The type hint of an option of ours or of TRL's."""
    return _type_hints(field_names().get(name) or trl_section())[name]


def field_choices(name: str) -> tuple[str, ...]:
    """A choice field's declared choices.

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
    """trl.GRPOConfig keyword arguments: the fields declared with `trl=`, under TRL's names, then `cfg.trl`, which
    wins (`warmup_steps: 10` replaces the warmup_ratio default).

    >>> args = trl_training_args(PipelineConfig())
    >>> args["learning_rate"], args["warmup_steps"], "warmup_ratio" in args
    (5e-06, 0.1, False)
    """
    forwarded = {f.name if field_rules(f)["trl"] is True else field_rules(f)["trl"]: getattr(values, f.name)
                 for values in cfg._sections() for f in dataclasses.fields(values) if "trl" in field_rules(f)}
    return {**forwarded, **cfg.trl}


def from_mapping(values: dict[str, Any]) -> PipelineConfig:
    """A config from a flat mapping (a recipe): our fields, then TRL's (looked up only for a key not ours)."""
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
    """Refuse a TRL field the run owns, and in one error every name neither ours nor TRL's."""
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
    """Every unknown option in one message, each with its closest names (difflib, and ALIASES)."""
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


def coerce(value: Any, kind: type, name: str) -> Any:
    """`value` as int/float/bool, or a ConfigError (a float for an int only when whole: 1.5 steps would truncate)."""
    article = "an integer" if kind is int else "a number" if kind is float else "true or false"
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(name, f"got {excerpt(value)}; use true or false.")
    if isinstance(value, bool):
        raise ConfigError(name, f"got {excerpt(value)}; use {article}.")
    if isinstance(value, str):
        try:
            value = float(value) if kind is float else int(value)
        except ValueError:
            raise ConfigError(name, f"got {excerpt(value)}; use {article}.") from None
    if not isinstance(value, (int, float)):
        raise ConfigError(name, f"got {excerpt(value)} ({type(value).__name__}); use {article}.")
    if not math.isfinite(value):
        raise ConfigError(name, f"got {excerpt(value)}; use a finite number.")
    if kind is int:
        if value != int(value):
            raise ConfigError(name, f"got {excerpt(value)}; use a whole number such as {max(int(value), 1)}.")
        return int(value)
    return float(value)


def typed_value(name: str, value: Any, kind: Any = None) -> Any:
    """`value` as the type hint `kind` (by default the option's own) says, or a ConfigError naming the field: the one
    type check of a recipe's values and of the config's. A list field takes a lone value; a single one no list.

    >>> typed_value("reward_weights", ["1", 2]), typed_value("max_steps", "3"), typed_value("min_p", None)
    ([1.0, 2.0], 3, None)
    """
    kind, optional = unwrap_optional(field_kind(name) if kind is None else kind)
    if value is None:
        if optional:
            return None
        raise ConfigError(name, "is empty; give a value or remove the line to use the default.")
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if item in (int, float, bool):
            return [coerce(entry, item, name) for entry in values]
        bad = [v for v in values if not isinstance(v, str) or not v.strip()] if item is str else []
        if bad:
            raise ConfigError(name, f"got {excerpt(bad[0])} in {excerpt(values)}; each entry is a name (text).")
        return values
    if kind in (int, float, bool):
        return coerce(value, kind, name)
    if isinstance(value, (list, tuple)) and typing.get_origin(kind) not in (typing.Union, types.UnionType):
        raise ConfigError(name, f"got the list {excerpt(value)}; give one value.")
    return value


def check_choices(section: Any) -> None:
    """The one check of choice fields, for one section (code that takes a section without validate() runs it).

    >>> from grpo_pipeline.pipeline.config import HealthArguments
    >>> check_choices(HealthArguments(kl_action="halt"))
    Traceback (most recent call last):
    ...
    grpo_pipeline.pipeline.config.fields.ConfigError: config error in `kl_action`: got 'halt'; choose one of warn, stop.
    """
    for f in dataclasses.fields(section):
        choices = field_rules(f).get("choices")
        if choices:
            check_choice(f.name, getattr(section, f.name), choices)


def check_choice(name: str, value: Any, choices: Optional[tuple[str, ...]] = None) -> None:
    """One choice field's value against its `choices` (by default its declared ones).

    >>> check_choice("overlong_policy", "cut")
    Traceback (most recent call last):
    ...
    grpo_pipeline.pipeline.config.fields.ConfigError: config error in `overlong_policy`: got 'cut'; choose one of drop, error.
    """
    choices = field_choices(name) if choices is None else choices
    if value not in choices:
        raise ConfigError(name, f"got {excerpt(value)}; choose one of {', '.join(choices)}.")


_BOUNDS = {"gt": (operator.gt, ">"), "ge": (operator.ge, ">="), "lt": (operator.lt, "<"), "le": (operator.le, "<=")}


def check_bounds(value: float, name: str, rules: dict[str, Any], default: Any) -> None:
    """The one bounds check: `rules` as `_help` declares them."""
    bounds = {key: rules[key] for key in _BOUNDS if key in rules}
    if not all(_BOUNDS[key][0](value, bound) for key, bound in bounds.items()):
        wanted = " and ".join(f"{_BOUNDS[key][1]} {bound}" for key, bound in bounds.items())
        suggestion = f" (the default is {default})" if default is not None else ""
        why = f": {rules['why']}" if rules.get("why") else ""
        raise ConfigError(name, f"got {value:g}; it must be {wanted}{suggestion}{why}.")


def check_generation_temperature(value: float, name: str) -> None:
    """generate/eval's temperature: 0 is greedy, sampling starts at MIN_SAMPLING_TEMPERATURE (fields.py says why)."""
    if 0 < value < MIN_SAMPLING_TEMPERATURE:
        raise ConfigError(name, f"got {value:g}; use 0 for greedy decoding, or at least {MIN_SAMPLING_TEMPERATURE:g} "
                          "to sample (below it logits / temperature overflow float32).")


def check_field_values(cfg: PipelineConfig) -> None:
    """Check (and normalise) every field against its declared type, bounds and choices: YAML and the parser's
    defaults pass values through untyped, to reach the trainer after the model has loaded.

    >>> check_field_values(PipelineConfig().replace(learning_rate=0))
    Traceback (most recent call last):
    ...
    grpo_pipeline.pipeline.config.fields.ConfigError: config error in `learning_rate`: got 0; it must be > 0 and <= 1.0 (the ...
    """
    for section_cls in SECTIONS:
        section = getattr(cfg, SECTION_ATTR[section_cls])
        hints = _type_hints(section_cls)
        for f in dataclasses.fields(section_cls):
            rules = field_rules(f)
            if "choices" in rules:
                continue  # check_choices below
            value = typed_value(f.name, getattr(section, f.name), hints[f.name])
            setattr(section, f.name, value)
            if type(value) in (int, float) and rules:
                check_bounds(value, f.name, rules, f.default if f.default is not dataclasses.MISSING else None)
        check_choices(section)
    for name, value in cfg.trl.items():  # TRL's numeric options as set, against TRL_BOUNDS
        if name in TRL_BOUNDS and isinstance(value, (int, float)) and not isinstance(value, bool):
            check_bounds(coerce(value, float, name), name, TRL_BOUNDS[name], None)
