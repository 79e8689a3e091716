"""Loading a user's reward module (`my_rewards:score`): looked for in the working folder (the base of every
relative path of a run), then on the import path, as `trl grpo` looks; one only beside the recipe is named in the
error, with the fix. A working-folder file whose name is taken (`json.py`) loads under another name
(`_user_json_<sha1 of its path>`), and argparse at its top level sees `sys.argv == [its path]`, none of grpo's.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, Iterator, Optional

# The recipe's folder, set when a recipe is read (pipeline/config/parse.py config_path): not searched, only named
# when a module is missing from the working folder but sits there.
_recipe_dirs: list[Path] = []
ALIAS_PREFIX = "_user_"
OURS = __name__.partition(".")[0]  # grpo_pipeline: every module of ours is under it


def set_recipe_dir(folder: Optional[Path]) -> None:
    """The --config recipe's folder (None: no recipe), for `beside_the_recipe`'s hint."""
    _recipe_dirs[:] = [Path(folder).resolve()] if folder is not None else []


def search_dirs() -> list[Path]:
    """Where a user's module is looked for before the import path: the working folder."""
    return [Path(os.getcwd()).resolve()]


def beside_the_recipe(top: str) -> str:
    """A hint when module `top` is not in the working folder but beside the recipe; "" otherwise."""
    for folder in _recipe_dirs:
        for candidate in (folder / f"{top}.py", folder / top / "__init__.py"):
            if candidate.is_file() and folder not in search_dirs():
                return (f" {candidate} is beside the recipe, but reward modules, like every relative path of a run, "
                        f"are read against the working folder ({os.getcwd()}), as TRL reads them: run grpo from "
                        f"{folder}, or add it to PYTHONPATH.")
    return ""


def user_module_file(top: str) -> Optional[Path]:
    """`top.py` or `top/__init__.py` in the first search dir that has one; never a file of ours (grpo run from our
    checkout's root sees pipeline/, rewards/ and env/ there: they are ours, as grpo_pipeline.pipeline, ...)."""
    ours = spec_of_ours(f"{OURS}.{top}")
    our_file = Path(ours.origin).resolve() if ours is not None and ours.origin else None
    for folder in search_dirs():
        for candidate in (folder / f"{top}.py", folder / top / "__init__.py"):
            if candidate.is_file() and candidate.resolve() != our_file:
                return candidate
    return None


def spec_of_ours(module_name: str) -> Any:
    """The spec of our module `module_name` (grpo_pipeline.rewards.correctness), or None when there is none. Finding
    it imports only our own packages above it, never user code."""
    try:
        return importlib.util.find_spec(module_name)
    except ImportError:  # a parent that is not a package of ours
        return None


@contextlib.contextmanager
def isolated_argv(path: Path) -> Iterator[None]:
    """sys.argv is `[path]` while the user's module imports, as for `python path`, then grpo's again."""
    saved = sys.argv
    sys.argv = [str(path)]
    try:
        yield
    finally:
        sys.argv = saved


def import_user_module(module_name: str, fresh: bool = False) -> Any:
    """The module `module_name` (`my_rewards`, `pkg.sub`): the user's file when a search dir has it, else the
    import path's. With `fresh`, a user's module is a separate instance executed again from its file, so the
    check's probe leaves the run's instance (a counter in it) as if never called. Raises what importing raises."""
    top, _, rest = module_name.partition(".")
    found = user_module_file(top)
    if found is None:
        with isolated_argv(Path(module_name)):
            module = importlib.import_module(module_name)
        return _fresh_copy(module) if fresh and _is_users(module) else module
    folder = found.parent if found.name != "__init__.py" else found.parent.parent
    if str(folder) not in sys.path:
        sys.path.append(str(folder))  # its sibling imports; appended, so it never hides an installed package
    name = _module_name_for(top, found)
    if name not in sys.modules:
        _run_file(name, found, package_dir=[str(found.parent)] if found.name == "__init__.py" else None)
    if not rest:
        return _fresh_copy(sys.modules[name]) if fresh else sys.modules[name]
    sub = found.parent / (rest.replace(".", "/") + ".py")
    with isolated_argv(sub if sub.is_file() else found):
        module = importlib.import_module(f"{name}.{rest}")
    return _fresh_copy(module) if fresh else module


def _is_users(module: Any) -> bool:
    """A module from a source file of the user's: not the standard library's, an installed package's, nor ours."""
    origin = getattr(module, "__file__", None)
    if not origin or not origin.endswith(".py") or module.__name__.partition(".")[0] == OURS:
        return False
    installed = {sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib")}
    return not any(Path(origin).resolve().is_relative_to(Path(path).resolve()) for path in installed)


def _fresh_copy(module: Any) -> Any:
    """`module` executed again from its file as a separate module (`_grpo_probe_<name>`, its package the same, so
    relative imports resolve as the original's), not kept in sys.modules: once the check's calls are done, nothing
    holds it (a model it loaded is freed). Raises what executing it raises."""
    return _run_file(f"_grpo_probe_{module.__name__.replace('.', '_')}", Path(module.__file__),
                     package=module.__package__, keep=False)


def _run_file(name: str, path: Path, package_dir: Optional[list[str]] = None, package: Optional[str] = None,
              keep: bool = True) -> Any:
    """The module `name` executed from `path` under `isolated_argv`, in sys.modules while it runs (dataclasses look a
    module up by name) and after, when `keep` and it did not raise."""
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=package_dir)
    module = importlib.util.module_from_spec(spec)
    if package is not None:
        module.__package__ = package
    sys.modules[name] = module
    try:
        with isolated_argv(path):
            spec.loader.exec_module(module)
    except BaseException:
        keep = False
        raise
    finally:
        if not keep:
            del sys.modules[name]
    return module


def _module_name_for(top: str, found: Path) -> str:
    """`top` itself when nothing else answers to it, else `_user_<top>_<sha1 of its path>`, so a package (`json`,
    `trl`) or another folder's file of that name keeps its name (find_spec also answers for a loaded module)."""
    alias = f"{ALIAS_PREFIX}{top}_{hashlib.sha1(str(found.resolve()).encode()).hexdigest()}"
    try:
        spec = importlib.util.find_spec(top)
    except ModuleNotFoundError:  # a finder that says "no such module" by raising: the name is free
        return top
    except (ImportError, ValueError):  # a loaded module without a spec: something else owns the name
        return alias
    origin = getattr(spec, "origin", None)
    return top if spec is None or (origin and Path(origin).resolve() == found.resolve()) else alias
