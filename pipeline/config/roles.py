"""Each field's roles: which of the run's kept keys and resume checks it is part of, declared with the field
(fields.py; TRL's in trl_fields.py TRL_ROLES), so a new option is one declaration and every key follows it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from grpo_pipeline.pipeline.config.fields import SECTIONS, field_rules
from grpo_pipeline.pipeline.config.trl_fields import trl_fields, trl_with

# role -> what a field with it is part of, and who reads it.
ROLES = {
    "data_key": "the prepared data's cache key (pipeline/data/prepare.py data_fields): a change prepares it again",
    "warmup_input": "the kept format warm-up's key (pipeline/trainer/warmup.py warmup_inputs)",
    "eval_input": "an evaluation's kept result's key (pipeline/infer/evaluate.py eval_inputs; best_lora/)",
    "eval_start": "what eval before measures starts from (pipeline/infer/evaluate.py eval_before_inputs)",
    "resume_shaping": "the shape of a checkpoint's weights: a resume under another value is refused",
    "resume_restored": "restored by a checkpoint over the config: a resume under another value is refused",
    "resume_applied": "applied by a resume from a checkpoint saved with another value, said and recorded",
    "run_owned": "set by the run itself: naming it is refused with the reason (TRL's fields only)",
    "backend_decided": "decided by the backend: a value of the user's is honoured only when it agrees (TRL's only)",
}


def fields_with(role: str, sections: Iterable[type] = SECTIONS) -> dict[str, Any]:
    """The options declaring `role`, name -> the role's value (True, a group, or a reason): ours, then TRL's.

    >>> list(fields_with("resume_applied"))
    ['max_steps', 'num_train_epochs', 'max_grad_norm']
    """
    if role not in ROLES:
        raise KeyError(f"unknown role {role!r}; the roles: {', '.join(ROLES)}")
    ours = {f.name: field_rules(f)["roles"][role] for section in sections for f in dataclasses.fields(section)
            if role in field_rules(f).get("roles", {})}
    return {**ours, **trl_with(role)}


def trl_names(role: str, sections: Iterable[type] = SECTIONS) -> tuple[str, ...]:
    """The options declaring `role` under trl.GRPOConfig's names (our warmup_ratio is TRL's warmup_steps)."""
    renamed = {f.name: field_rules(f).get("trl") for section in sections for f in dataclasses.fields(section)}
    return tuple(renamed[name] if isinstance(renamed.get(name), str) else name for name in fields_with(role, sections))


def role_values(cfg: Any, role: str) -> dict[str, Any]:
    """`cfg`'s values of the options with `role`, by name or {group: {name: value}} (TRL's default when unset)."""
    flat = cfg.to_dict()
    found: dict[str, Any] = {}
    for name, group in fields_with(role, cfg.sections()).items():
        value = flat[name] if name in flat else trl_default(name)  # (flat holds the TRL options set: cfg.trl)
        if group is True or not isinstance(group, str):
            found[name] = value
        else:
            found.setdefault(group, {})[name] = value
    return found


def trl_default(name: str) -> Any:
    """TRL's default for one of its GRPOConfig fields (imports trl)."""
    field = trl_fields()[name]
    return field.default_factory() if callable(field.default_factory) else field.default
