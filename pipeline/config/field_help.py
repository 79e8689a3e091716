"""A config field with its help text, its rules (bounds, choices, what goes to TRL) and its roles (which of the
run's kept keys and resume checks it is part of): `_help` declares one, `field_rules` and `field_roles` read them
back. Imports nothing of ours.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, Optional


# A field's roles: role names, or role -> the group its value is kept under (True: its own name).
Roles = tuple[str, ...] | dict[str, Any]


def _help(text: str, *, gt: Optional[float] = None, ge: Optional[float] = None, lt: Optional[float] = None,
          le: Optional[float] = None, why: str = "", choices: tuple[str, ...] = (), trl: bool | str = False,
          roles: Roles = (), **kw) -> Any:
    """A field with its help text and the rules `check_field_values` enforces: bounds for numbers (`why`: the
    reason, said when a value is refused), `choices` for a choice field. `trl=True` forwards the field to
    trl.GRPOConfig under its own name (`trl="name"`: under TRL's name). `roles`: what the field is part of
    (pipeline/config/roles.py ROLES), role names or role -> the group its value is kept under (True: its name)."""
    made = field(metadata={"help": text}, **kw)
    rules = {"gt": gt, "ge": ge, "lt": lt, "le": le, "why": why or None, "choices": tuple(choices) or None,
             "trl": trl or None, "roles": dict(roles) if isinstance(roles, dict) else dict.fromkeys(roles, True)}
    # Beside the metadata, not in it: HfArgumentParser passes every metadata key to argparse, whose own
    # `choices` check would refuse `--vllm_standby True` and print a usage dump instead of our one-line fix.
    _FIELD_RULES[id(made)] = {key: value for key, value in rules.items() if value not in (None, {})}
    return made


_FIELD_RULES: dict[int, dict[str, Any]] = {}


def field_rules(f: dataclasses.Field) -> dict[str, Any]:
    """The rules `_help` declared for a dataclass field: gt/ge/lt/le, why, choices, trl, roles."""
    return _FIELD_RULES.get(id(f), {})


def field_roles(f: dataclasses.Field) -> dict[str, Any]:
    """The roles `_help` declared for a dataclass field: role -> its group (True: the field's own name)."""
    return field_rules(f).get("roles", {})
