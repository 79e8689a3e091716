"""Reward functions by name: our short names ("correctness"), the notebook's function names (TRL logs
`rewards/<__name__>/mean`, so dashboards match the notebook's), TRL's registry, and "package.module:function".
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.machinery
import importlib.util
import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.rewards.contract import SignalInterrupt, is_async_reward
from grpo_pipeline.rewards import format as _format  # noqa: F401  (a reward module declares its built-in rewards on import:
from grpo_pipeline.rewards import language as _language  # noqa: F401  rewards/declared.py)
from grpo_pipeline.rewards.correctness import correctness_reward_func
from grpo_pipeline.rewards.declared import DECLARED, facts_of
from grpo_pipeline.rewards.trl_source import trl_reward, trl_reward_names
from grpo_pipeline.rewards.user_code import (OURS, beside_the_recipe, import_user_module, search_dirs, spec_of_ours,
                                             user_module_file)

RewardFunc = Callable[..., list]

# The notebook's trainer order.
DEFAULT_REWARDS: list[str] = ["xmlcount", "soft_format", "strict_format", "int", "correctness"]
DEFAULT_REWARD_WEIGHTS: list[float] = [1.0] * len(DEFAULT_REWARDS)

# The built-in rewards by the short name each declares (rewards/declared.py `@builtin_reward`), the notebook's first.
REWARD_FUNCS: dict[str, RewardFunc] = {
    name: DECLARED[name].func for name in sorted(
        DECLARED, key=lambda n: DEFAULT_REWARDS.index(n) if n in DEFAULT_REWARDS else len(DEFAULT_REWARDS))}


def _known_names(unknown: str = "") -> str:
    """Ours and TRL's (trl/scripts/grpo.py's registry, read from the installed TRL), with the nearest to `unknown`."""
    ours, trls = [*REWARD_FUNCS, *(func.__name__ for func in REWARD_FUNCS.values())], trl_reward_names()
    nearest = difflib.get_close_matches(unknown, ours + trls, n=1) if unknown else []
    return ((f"did you mean {nearest[0]!r}? " if nearest else "") + f"known: ours {', '.join(ours)}; "
            f"TRL's (trl/scripts/grpo.py) {', '.join(trls)}")


def resolve_reward(name: str | RewardFunc, fresh: bool = False) -> RewardFunc:
    """The reward for our name, a notebook alias, a name of TRL's registry (`trl grpo --reward_funcs`), or
    "module:function" (or a dotted path); a callable as it is. `fresh`: a user's module as a separate instance (for
    the check). Raises a ValueError saying the fix.

    >>> resolve_reward("correctness").__name__
    'correctness_reward_func'
    """
    if callable(name):
        return name
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{name!r} is not a reward name; {_known_names()}; or 'package.module:function'.")
    key = name.strip()
    builtin = facts_of(key)  # a short name, or the notebook's function name
    if builtin is not None:
        return builtin.func
    if key in trl_reward_names():
        return trl_reward(key)
    if _is_spec(key):
        spec = ":".join(_spec_parts(key))
        obj = load_user_object(spec, "reward", fresh)
        if not callable(obj):
            raise ValueError(f"{spec!r} is a {type(obj).__name__}, not a function.")
        return obj
    raise ValueError(f"unknown reward {key!r}; {_known_names(key)}; or 'package.module:function' (or "
                     "package.module.function) for your own.")


def is_builtin_reward(name: Any) -> bool:
    """A name the registry answers without importing anyone's module: ours, the notebook's aliases, TRL's registry.

    >>> is_builtin_reward("correctness"), is_builtin_reward("accuracy_reward"), is_builtin_reward("my_rewards:score")
    (True, True, False)
    """
    key = name.strip() if isinstance(name, str) else None
    return key is not None and (facts_of(key) is not None or key in trl_reward_names())


def reads_reference(names: Sequence[str | RewardFunc]) -> Optional[bool]:
    """True when one of the rewards is the built-in correctness reward (which reads `grpo_answer`), by any name;
    None when a module's text cannot tell. Imports no module: `grpo data` and `grpo plan` run no user code.

    >>> reads_reference(["strict_format", "correctness"]), reads_reference(["trl.rewards.accuracy_reward"])
    (True, False)
    """
    answers = [_is_correctness(name) for name in names]
    return True if True in answers else (None if None in answers else False)


def _is_correctness(name: str | RewardFunc) -> Optional[bool]:
    """Read from the module's text, without running it: True for ours or an import of it under that name; False for
    a function or class of its own, another import, or no such module (validate() names it); None when the text does
    not say (an assignment, a name made at run time)."""
    facts = facts_of(name.strip() if isinstance(name, str) else name)
    if facts is not None or callable(name):
        return facts is not None and facts.reads_reference
    module, function = _spec_parts(name)
    source = module_source(module) if module and function else None
    if source is None:
        return False
    ours = Path(inspect.getsourcefile(correctness_reward_func)).resolve()
    if source.resolve() == ours:
        return function == correctness_reward_func.__name__
    try:
        tree = ast.parse(source.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    answer: Optional[bool] = None
    for node in ast.walk(tree):  # an import under `if TYPE_CHECKING:` or `try:` counts too
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == function:
            answer = False
        elif isinstance(node, ast.ImportFrom):
            from_ours = f"{node.module}.".startswith(f"{__package__}.") if node.level == 0 else \
                source.resolve().parent == ours.parent
            for alias in node.names:
                if (alias.asname or alias.name) == function:
                    answer = from_ours and alias.name == correctness_reward_func.__name__
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and function in {
                getattr(t, "id", None) for t in getattr(node, "targets", [getattr(node, "target", None)])}:
            answer = None
    return answer


def module_source(module_name: str) -> Optional[Path]:
    """The .py file `import module_name` would run, found as import_user_module finds it, without running any of
    it; None when there is none."""
    top, *rest = module_name.split(".")
    if top == OURS:  # our own modules (grpo_pipeline.rewards.correctness)
        spec = spec_of_ours(module_name)
        return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None
    path = user_module_file(top)
    if path is None:
        spec = importlib.machinery.PathFinder.find_spec(top)  # a finder, not an import: no code runs
        path = Path(spec.origin) if spec is not None and spec.origin else None
    for part in rest:
        if path is None or path.name != "__init__.py":
            return None
        spec = importlib.machinery.PathFinder.find_spec(part, [str(path.parent)])
        path = Path(spec.origin) if spec is not None and spec.origin else None
    return path if path is not None and path.suffix == ".py" else None


def _is_spec(key: str) -> bool:
    """'package.module:function', or a dotted path as TRL's docs and open-r1 write one."""
    return ":" in key or "." in key.strip(".")


def _spec_parts(name: Any) -> tuple[str, str]:
    """('package.module', 'function') of a spec `_is_spec` takes (one part may be empty)."""
    key = name.strip() if isinstance(name, str) else ""
    module, _, function = key.partition(":") if ":" in key else key.rpartition(".")
    return module, function


def check_reward_names(names: Sequence[str | RewardFunc], modules: bool = True) -> None:
    """What get_reward_funcs refuses, seen without importing anything: not a list, an empty list, and with
    `modules` an unknown bare name or a module that is nowhere to be found."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ValueError(f"expected a list of names, got {names!r}; write e.g. [{names!r}].")
    if not names:
        raise ValueError(f"the list is empty; use e.g. {DEFAULT_REWARDS}.")
    for name in names if modules else ():
        if callable(name) or is_builtin_reward(name):
            continue
        if not isinstance(name, str) or not _is_spec(name.strip()):
            resolve_reward(name)  # raises its message
        module = _spec_parts(name)[0]
        if module_source(module) is None and importlib.util.find_spec(module.split(".")[0]) is None:
            raise ValueError(f"reward {name.strip()!r}: no module {module!r} in {', '.join(map(str, search_dirs()))} "
                             "or on the import path; put its .py file beside the recipe.")


def get_reward_funcs(names: Sequence[str | RewardFunc], fresh: bool = False) -> list[RewardFunc]:
    """`resolve_reward` of each name, in order, under the name TRL logs it by (`rewards/<__name__>/mean`): a
    callable without a name of its own is named after its attribute (`scoring:length_penalty`), two with one name
    (`a:score`, `b:score`) after their spec (`a.score`). ValueError for a bare string, an empty list, a repeat.

    >>> [f.__name__ for f in get_reward_funcs(["int", "correctness"])]
    ['int_reward_func', 'correctness_reward_func']
    """
    check_reward_names(names, modules=False)
    funcs = [resolve_reward(n, fresh) for n in names]
    first_listed: dict[int, Any] = {}
    for name, func in zip(names, funcs):
        if id(func) in first_listed:
            raise ValueError(f"{name!r} and {first_listed[id(func)]!r} are the same reward "
                             f"({_own_name(name, func)}); list each reward once and give it a weight instead.")
        first_listed[id(func)] = name
    labels = [_own_name(name, func) for name, func in zip(names, funcs)]
    shared = {label for label in labels if labels.count(label) > 1}
    labels = [_spec_name(name) or label if label in shared else label for name, label in zip(names, labels)]
    for label in set(labels):
        if labels.count(label) > 1:
            listed = [name for name, other in zip(names, labels) if other == label]
            raise ValueError(f"{listed} would all be logged as rewards/{label}/mean; give each its own name "
                             "(a function's __name__, or load each as 'module:name').")
    return [func if getattr(func, "__name__", None) == label else _named(func, label)
            for func, label in zip(funcs, labels)]


def _spec_name(spec: Any) -> str | None:
    """'my_rewards:scorers.length' -> 'my_rewards.scorers.length'; None for anything but a 'module:attr' spec."""
    return spec.strip().replace(":", ".") if isinstance(spec, str) and ":" in spec else None


def _own_name(spec: Any, func: RewardFunc) -> str:
    """A reward's own name: its __name__, else the last part of the attribute it was loaded as, else its type's."""
    name = getattr(func, "__name__", None)
    if isinstance(name, str) and name.isidentifier():  # not "<lambda>", not a partial's missing one
        return name
    spec = _spec_name(spec)
    return spec.rpartition(".")[2] if spec else type(func).__name__


def _named(func: RewardFunc, name: str) -> RewardFunc:
    """`func` under `name`, async if it is; inspect.signature still reads func's parameters (__wrapped__)."""
    if is_async_reward(func):
        async def named(*args: Any, **kwargs: Any) -> Any:
            return await func(*args, **kwargs)
    else:
        def named(*args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)
    functools.update_wrapper(named, func)
    named.__name__ = named.__qualname__ = name
    return named


def check_reward_weights(names: Sequence[Any], weights: Sequence[float] | None) -> list[float]:
    """One finite float weight per reward function (negative: a penalty); None means all 1.0.

    >>> check_reward_weights(["int", "correctness"], [0.5, 2])
    [0.5, 2.0]
    """
    if weights is None:
        return [1.0] * len(names)
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ValueError(f"expected a list of numbers, got {weights!r}.")
    if len(weights) != len(names):
        raise ValueError(f"{len(weights)} weights for {len(names)} reward functions "
                         f"{list(names)}; give one weight per function (or none for all 1.0).")
    checked = []
    for i, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            raise ValueError(f"weight {i} ({weight!r}, for {list(names)[i]!r}) must be a finite number.")
        checked.append(float(weight))
    return checked


def load_user_object(spec: str, kind: str, fresh: bool = False) -> Any:
    """The object `package.module:attr` (or `package.module.attr`) names; `kind` ("reward", "tool") is what the
    messages call it. Raises a ValueError saying the fix."""
    if ":" not in spec and "." in spec.strip("."):
        spec = ":".join(spec.rsplit(".", 1))
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        what = "Class" if kind == "environment" else "function"
        raise ValueError(f"{spec!r} must look like 'package.module:{what}'.")
    try:
        obj: Any = import_user_module(module_name, fresh)
    except ImportError as exc:
        where = ", ".join(str(d) for d in search_dirs())
        ours = f"{OURS}.{spec}"  # one of our modules named by its folder (`pipeline.demo.calculator:calculator`)
        moved = f" Our own modules are under one import name now: write {ours!r}." if spec_of_ours(
            ours.partition(":")[0]) is not None else ""
        raise ValueError(f"cannot import module {module_name!r} for {kind} {spec!r} "
                         f"({exc}); check the name and that it is in the working folder ({where}), or on "
                         f"PYTHONPATH.{beside_the_recipe(module_name.partition('.')[0])}{moved}") from exc
    except BaseException as exc:  # noqa: BLE001 - a syntax error, a raise or a sys.exit() at import time
        if isinstance(exc, SignalInterrupt):  # a real Ctrl-C / SIGTERM while importing: the run's to handle
            raise
        raise ValueError(f"module {module_name!r} ({kind} {spec!r}) failed while importing: "
                         f"{type(exc).__name__}: {exc}. Fix the module; `python -c 'import {module_name}'` "
                         "shows the full error.") from None
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no {attr_path!r} ({kind} {spec!r}).")
        obj = getattr(obj, part)
    return obj
