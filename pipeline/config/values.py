"""Each field's value alone, before the cross-field rules of validate.py: its type (`coerce`), the bounds and
choices declared with it in fields.py, and TRL's own fields' bounds. One ConfigError naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import typing
from typing import Any, Optional

from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.config.field_help import field_rules
from grpo_pipeline.pipeline.config.fields import MIN_SAMPLING_TEMPERATURE, SECTIONS, ConfigError
from grpo_pipeline.pipeline.config.pipeline_config import SECTION_ATTR, PipelineConfig, field_choices
from grpo_pipeline.pipeline.config.trl_fields import TRL_BOUNDS


def coerce(value: Any, kind: type, name: str) -> Any:
    """`value` as `kind` (int/float/bool), or a ConfigError. A float for an int field is refused unless whole:
    1.5 steps would otherwise be truncated (or fail deep inside the trainer)."""
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


def check_choices(section: Any) -> None:
    """The one check of choice fields: each field of `section` (one section's dataclass) that declares
    `choices` in fields.py. check_field_values runs it on every section; code that takes one section without
    validate() (data preparation, the health rules) runs it on its own.

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
    """One choice field's value against its `choices` (by default the ones declared with it: fields.py).

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
    """The one bounds check: `rules` as `_help` declares them (gt/ge/lt/le, and `why`, the reason)."""
    bounds = {key: rules[key] for key in _BOUNDS if key in rules}
    if not all(_BOUNDS[key][0](value, bound) for key, bound in bounds.items()):
        wanted = " and ".join(f"{_BOUNDS[key][1]} {bound}" for key, bound in bounds.items())
        suggestion = f" (the default is {default})" if default is not None else ""
        why = f": {rules['why']}" if rules.get("why") else ""
        raise ConfigError(name, f"got {value:g}; it must be {wanted}{suggestion}{why}.")


def check_generation_temperature(value: float, name: str) -> None:
    """generate/eval's temperature: 0 is greedy, and sampling starts at MIN_SAMPLING_TEMPERATURE (below it the
    plain backend's logits / temperature overflow float32, fields.py says why). [0, 2] is checked with the field."""
    if 0 < value < MIN_SAMPLING_TEMPERATURE:
        raise ConfigError(name, f"got {value:g}; use 0 for greedy decoding, or at least {MIN_SAMPLING_TEMPERATURE:g} "
                          "to sample (below it logits / temperature overflow float32).")


def check_field_values(cfg: PipelineConfig) -> None:
    """Check (and normalise) every field against its declared type, bounds and choices.

    YAML and the parser's defaults pass values through untyped, so `max_steps: 1.5` or `learning_rate: -1`
    would otherwise reach the trainer after the model has loaded.

    >>> check_field_values(PipelineConfig().replace(max_steps=1.5))
    Traceback (most recent call last):
    ...
    grpo_pipeline.pipeline.config.fields.ConfigError: config error in `max_steps`: got 1.5; use a whole number such as 1.
    >>> check_field_values(PipelineConfig().replace(learning_rate=0))
    Traceback (most recent call last):
    ...
    grpo_pipeline.pipeline.config.fields.ConfigError: config error in `learning_rate`: got 0; it must be > 0 and <= 1.0 (the ...
    """
    for section_cls in SECTIONS:
        section = getattr(cfg, SECTION_ATTR[section_cls])
        hints = typing.get_type_hints(section_cls)
        for f in dataclasses.fields(section_cls):
            kind = hints[f.name]
            optional = type(None) in typing.get_args(kind)
            if optional:
                kind = next(a for a in typing.get_args(kind) if a is not type(None))
            value = getattr(section, f.name)
            rules = field_rules(f)
            if "choices" in rules:
                continue  # check_choices below
            if value is None:
                if optional:
                    continue
                raise ConfigError(f.name, "is empty; give a value or remove the line to use the default.")
            if typing.get_origin(kind) is list:
                (item_kind,) = typing.get_args(kind)
                if item_kind in (int, float):
                    setattr(section, f.name, [coerce(v, item_kind, f.name) for v in value])
                elif item_kind is str and any(not isinstance(v, str) or not v.strip() for v in value):
                    bad = next(v for v in value if not isinstance(v, str) or not v.strip())
                    raise ConfigError(f.name, f"got {excerpt(bad)} in {excerpt(list(value))}; each entry is a name "
                                              "(text).")
                continue
            if kind not in (int, float, bool):
                continue
            value = coerce(value, kind, f.name)
            setattr(section, f.name, value)
            if kind is not bool and rules:
                check_bounds(value, f.name, rules, f.default if f.default is not dataclasses.MISSING else None)
        check_choices(section)
    for name, value in cfg.trl.items():  # TRL's numeric options as set, against TRL_BOUNDS
        if name in TRL_BOUNDS and isinstance(value, (int, float)) and not isinstance(value, bool):
            check_bounds(coerce(value, float, name), name, TRL_BOUNDS[name], None)
