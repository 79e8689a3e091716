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
    trl.GRPOConfig under its own name (`trl="name"`: under TRL's name), so a new TRL setting is one declaration
    here. `roles`: what the field is part of (pipeline/config/roles.py ROLES), each role's name, or a mapping
    role -> the group the field's value is kept under in that role's key (True: under its own name)."""
    made = field(metadata={"help": text}, **kw)
    rules: dict[str, Any] = {key: value for key, value in (("gt", gt), ("ge", ge), ("lt", lt), ("le", le))
                             if value is not None}
    if why:
        rules["why"] = why
    if choices:
        rules["choices"] = tuple(choices)
    if trl:
        rules["trl"] = trl
    if roles:
        rules["roles"] = dict(roles) if isinstance(roles, dict) else {role: True for role in roles}
    # Beside the metadata, not in it: HfArgumentParser passes every metadata key to argparse, whose own
    # `choices` check would refuse `--vllm_standby True` and print a usage dump instead of our one-line fix.
    _FIELD_RULES[id(made)] = rules
    return made


_FIELD_RULES: dict[int, dict[str, Any]] = {}


def field_rules(f: dataclasses.Field) -> dict[str, Any]:
    """The rules `_help` declared for a dataclass field: gt/ge/lt/le, choices, trl."""
    return _FIELD_RULES.get(id(f), {})


def field_roles(f: dataclasses.Field) -> dict[str, Any]:
    """The roles `_help` declared for a dataclass field: role -> its group (True: the field's own name)."""
    return field_rules(f).get("roles", {})
