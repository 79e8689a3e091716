"""TRL's own rules, read from the installed TRL's source with `ast` (without importing trl, so no torch), not
copied: what `GRPOTrainer._calculate_rewards` passes a reward (`trl_rule`; with `remove_unused_columns`, only the
columns `_set_signature_columns_if_needed` keeps; tests/test_trl_call.py holds it against the real trainer's
calls), and `reward_funcs_registry` in `trl/scripts/grpo.py` (only resolving one of its names imports trl).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable

# The reward_kwargs dict of TRL's _calculate_rewards; what the parse below looks for.
_KWARGS_NAME = "reward_kwargs"


class TrlSourceChanged(RuntimeError):
    """The installed TRL's source no longer has the shape read here (a TRL upgrade): a bug of ours to fix."""


def _trl_file(relative: str) -> Path:
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise TrlSourceChanged("trl is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / relative


@functools.cache
def _function(relative: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(_trl_file(relative).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise TrlSourceChanged(f"trl/{relative} has no {name}()")


def _strings(node: ast.AST) -> list[str] | None:
    """The strings of a list/tuple/set literal of string constants, else None."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]
    return None


@functools.cache
def trl_rule() -> dict[str, tuple[str, ...]]:
    """TRL's rule, as four lists read from its source:

    >>> rule = trl_rule()
    >>> rule["call"], rule["not_columns"], rule["trainer"], rule["signature"]
    (('prompts', 'completions', 'completion_ids'), ('prompt', 'completion', 'completion_ids'), \
('trainer_state', 'log_extra', 'log_metric'), ('prompt', 'image', 'images'))
    """
    rewards = _function("trainer/grpo_trainer.py", "_calculate_rewards")
    not_columns = next((_strings(c.comparators[0]) for c in ast.walk(rewards) if isinstance(c, ast.Compare)
                        and isinstance(c.ops[0], ast.NotIn) and isinstance(c.left, ast.Name) and c.left.id == "key"
                        and _strings(c.comparators[0])), None)
    # set at the top of the function, not under an `if` (environments: only with an environment_factory)
    trainer = [t.slice.value for node in rewards.body if isinstance(node, ast.Assign) for t in node.targets
               if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == _KWARGS_NAME
               and isinstance(t.slice, ast.Constant)]
    call = next(([k.arg for k in c.keywords if k.arg] for c in ast.walk(rewards) if isinstance(c, ast.Call)
                 and any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == _KWARGS_NAME
                         for k in c.keywords)), None)
    signature_fn = _function("trainer/grpo_trainer.py", "_set_signature_columns_if_needed")
    signature = next((_strings(a.value) for a in ast.walk(signature_fn) if isinstance(a, ast.Assign)
                      and _strings(a.value)), None)
    if not (not_columns and trainer and call and signature):
        raise TrlSourceChanged("GRPOTrainer._calculate_rewards or _set_signature_columns_if_needed changed shape")
    return {"call": tuple(call), "not_columns": tuple(not_columns), "trainer": tuple(trainer),
            "signature": tuple(signature)}


def reward_columns(column_names: Iterable[str], remove_unused_columns: Any = False) -> list[str]:
    """The dataset columns that reach a reward as keywords, in the dataset's order.

    >>> reward_columns(["prompt", "completion", "solution"]), reward_columns(["prompt", "solution"], True)
    (['solution'], [])
    """
    rule = trl_rule()
    seen = [c for c in column_names if c in rule["signature"]] if remove_unused_columns else list(column_names)
    return [c for c in seen if c not in rule["not_columns"]]


def reward_keywords(column_names: Iterable[str], remove_unused_columns: Any = False) -> set[str]:
    """Every keyword a reward is called with (TRL passes everything by keyword)."""
    rule = trl_rule()
    return {*rule["call"], *reward_columns(column_names, remove_unused_columns), *rule["trainer"]}


def reward_call_kwargs(columns: dict[str, list[Any]], remove_unused_columns: Any, trainer_objects: dict[str, Any],
                       completion_ids: list[Any]) -> dict[str, Any]:
    """The keyword arguments of a reward call but `prompts` and `completions`: the columns TRL passes,
    `completion_ids`, and the trainer's own objects (`trainer_objects`, by TRL's names)."""
    rule = trl_rule()
    kwargs = {name: columns[name] for name in reward_columns(columns, remove_unused_columns)}
    kwargs["completion_ids"] = completion_ids
    kwargs.update({name: trainer_objects[name] for name in rule["trainer"]})
    return kwargs


def _registry() -> tuple[ast.Dict, dict[str, str]]:
    """trl/scripts/grpo.py main()'s `reward_funcs_registry` literal, and where each name in main() is imported from."""
    main = _function("scripts/grpo.py", "main")
    registry = next((a.value for a in ast.walk(main) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Dict)
                     and any(isinstance(t, ast.Name) and t.id == "reward_funcs_registry" for t in a.targets)), None)
    if registry is None:
        raise TrlSourceChanged("trl/scripts/grpo.py has no reward_funcs_registry")
    modules = {alias.asname or alias.name: node.module for node in ast.walk(main) if isinstance(node, ast.ImportFrom)
               for alias in node.names}
    return registry, modules


def trl_reward_names() -> list[str]:
    """The registry's names, read without importing trl.

    >>> trl_reward_names()
    ['accuracy_reward', 'reasoning_accuracy_reward', 'think_format_reward', 'get_soft_overlong_punishment']
    """
    return [key.value for key in _registry()[0].keys]


@functools.cache
def trl_reward(name: str) -> Callable:
    """The reward `trl grpo --reward_funcs NAME` stands for, built as trl/scripts/grpo.py builds it (a factory called
    with the script's own constant arguments). Imports trl.rewards. KeyError for a name not in the registry.

    >>> trl_reward("get_soft_overlong_punishment").__name__
    'soft_overlong_punishment_reward'
    """
    registry, modules = _registry()
    value = dict(zip((key.value for key in registry.keys), registry.values))[name]
    call = value if isinstance(value, ast.Call) else None
    target = (call.func if call else value).id
    func = getattr(importlib.import_module(modules[target]), target)
    return func(**{k.arg: ast.literal_eval(k.value) for k in call.keywords}) if call else func
