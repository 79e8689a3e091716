"""How the house is laid out, measured from the code's own imports and definitions.

    python scripts/layout_metrics.py           # rooms, arrows up, loops, sizes, issue 52's counts
    python scripts/layout_metrics.py --json    # the same as JSON (for tests and before/after notes)
    python scripts/layout_metrics.py --root DIR  # another checkout (e.g. `git worktree add DIR COMMIT`)

Words:
- a *room* is a folder of `pipeline/` or one of its top-level modules (`pipeline/train.py` is the room `train`);
- an *arrow* is "room A imports something from room B" (A != B), counted once per pair;
- an arrow *runs up* when it points from a room lower in `FLOORS` to a higher one. `FLOORS` is the design,
  bottom to top (docs/layout.md): a room may import only from rooms below it;
- a *cycle* (a file loop) is a set of modules that import one another, module-level and function-local imports
  alike (a function-local import still ties the two modules together; it only delays the tie). Measured over the
  three trees `TREES` (pipeline/, env/, rewards/), across them too;
- a *folder loop* is the same between folders: a room of any tree (`pipeline/demo`, `pipeline/train`; env/ and
  rewards/ have no sub-folders, so each of their modules is a room) imports one that imports it back, through any
  of their modules; a *tree loop* is one between the trees themselves (env/ importing pipeline/ and back);
- sizes: no module over `MODULE_LIMIT` lines, no function over `FUNCTION_LIMIT`, in the trees and in scripts/ and
  bench/ (`SIZED`);
- *recipe takers* (issue 52): functions with a parameter named cfg, config, plan or run_plan, the whole recipe or a
  whole-run holder, or annotated `PipelineConfig` under another name, in the three trees; *backend-name comparisons*: `==`/`!=`/`in` against "unsloth" or "plain",
  or of a `.NAME`/`.backend` against a string, outside pipeline/backends/ (the backend answers for itself);
- a function-local import is *lazy for torch* when what it imports reaches torch, Unsloth or vLLM (directly, or
  through a module that imports one of them at its top); every other one could sit at the top, and is listed
  unless a comment at it says why it stays (`grpo`'s start-up order, matplotlib's backend): *lazy for another
  reason*;
- every function-local import carries a comment saying why, with the word "lazy" in it (`# lazy: loads torch`): on
  its line or its group's, or in the comment just above the group of imports it belongs to. One without is
  *uncommented*.

Hand-written on `ast` because no library measures these: pydeps/import-linter draw or enforce a graph but
do not count floors, lazy imports or function sizes together.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pipeline"  # the tree FLOORS places, whose rooms, arrows and lazy imports are measured
TREES = ("pipeline", "env", "rewards")  # the code measured for loops (files, folders, trees) and issue 52's counts
SIZED = TREES + ("scripts", "bench")  # where no module or function may pass the limits below
RECIPE_PARAMETERS = {"cfg", "config", "plan", "run_plan"}  # the whole recipe, or a holder of the whole run
RECIPE_CLASS = "PipelineConfig"  # a parameter annotated with it takes the whole recipe, whatever its name
BACKEND_NAMES = {"unsloth", "plain"}
BACKEND_ATTRIBUTES = {"NAME"}  # Backend.NAME
BACKENDS_HOME = "pipeline/backends/"  # the one place that may compare a backend's name

# The design, bottom to top: the data path config -> check -> data -> model -> trainer -> save -> generate/eval,
# with the helpers everyone uses at the bottom and the commands that drive a run at the top. Rooms are placed by
# what they import, not by when they run:
# - bootstrap (the start-up defaults and backend set-up) and errors (the one handler, which names every room's
#   user-error types) run first but import config, demo, run and backends, so they sit above those; only
#   commands import them (the `grpo data` command is pipeline/data_command.py, above the data layer);
# - plan (`grpo plan`) reads backends' GPU settings and bootstrap's GPU recipe: above both;
# - preflight (the run's contract) sits below infer: `grpo rewards` (infer/dry_run.py) runs the check, and the
#   check imports no inference;
# - train_state (what train.py's phases share) and train_help (`grpo train --help`) are train.py's own, below it.
# No arrow runs up (issue 52 took the last three down: the one prompt builder is rewards/completions.py, the logged
# measures' names are run/metric_names.py, the eval during training is infer/periodic_eval.py).
FLOORS = ["assets", "config", "demo", "data", "run", "backends", "health", "bootstrap", "errors", "plan",
          "trainer", "preflight", "infer", "data_command", "train_state", "train_help", "train", "cli", "__main__",
          "__init__"]

# Importing any of these loads torch (or is torch, Unsloth, vLLM): the reason a function-local import is kept.
HEAVY = {"torch", "unsloth", "unsloth_zoo", "vllm", "transformers", "trl", "peft", "accelerate", "datasets",
         "bitsandbytes", "deepspeed", "triton", "safetensors.torch"}

MODULE_LIMIT = 400
FUNCTION_LIMIT = 80


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(tree: ast.Module, module: str, is_package: bool, known: set[str]) -> list[tuple[str, bool, int]]:
    """(imported module, at the top of the module?, line) for every import in `tree`."""
    found: list[tuple[str, bool, int]] = []
    top = set(id(node) for node in tree.body)
    for holder in ast.walk(tree):
        for node in ast.iter_child_nodes(holder):
            at_top = id(node) in top or (isinstance(holder, (ast.If, ast.Try)) and id(holder) in top)
            if isinstance(node, ast.Import):
                found += [(alias.name, at_top, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, module, is_package)
                for alias in node.names:  # `from pipeline.data import report` imports the module report
                    sub = f"{base}.{alias.name}"
                    found.append((sub if sub in known else base, at_top, node.lineno))
    return found


def commented(lines: list[str], lineno: int) -> bool:
    """True when the import on line `lineno` (1-based) has a "lazy" comment: on its line, on another line of the
    group of import lines (their continuations and blank lines between them) it belongs to, or in the block of
    comment lines just above that group."""
    if "lazy" in lines[lineno - 1].partition("#")[2].lower():
        return True
    index = lineno - 2
    while index >= 0:
        text = lines[index].strip()
        if text.startswith("#"):
            while index >= 0 and lines[index].strip().startswith("#"):
                if "lazy" in lines[index].lower():
                    return True
                index -= 1
            return False
        if text.startswith(("import ", "from ")) and "lazy" in text.partition("#")[2].lower():
            return True  # the group's own comment, on one of its lines
        if text and not (text.startswith(("import ", "from ")) or text.endswith((",", "(")) or text == ")"):
            return False
        index -= 1
    return False


def _functions(tree: ast.Module, module: str) -> list[tuple[str, int]]:
    sizes = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            sizes.append((f"{module}.{node.name}", node.end_lineno - node.lineno + 1))
    return sizes


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def folder_of(module: str) -> str:
    """The room a module sits in, named with its tree: `pipeline/demo`, `pipeline/train`, `env/paths`."""
    parts = module.split(".")
    return f"{parts[0]}/{parts[1] if len(parts) > 1 else '__init__'}"


def _takes_the_recipe(argument: ast.arg) -> bool:
    """Named cfg/config/plan/run_plan, or annotated with the recipe's class under any name (`settings:
    PipelineConfig`): renaming the parameter does not make it narrower."""
    return argument.arg in RECIPE_PARAMETERS or (
        argument.annotation is not None and RECIPE_CLASS in ast.unparse(argument.annotation))


def _recipe_takers(tree: ast.Module) -> int:
    return sum(1 for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and any(_takes_the_recipe(a) for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs))


def _names_a_backend(node: ast.expr) -> bool:
    """A string constant naming a backend ("plain"), a tuple/list/set holding one (`in ("unsloth", ...)`), a backend's
    NAME, or a backend choice's name (`choice.name`; a file's `.name` is not one: `path.name == "__init__.py"`)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_backend(item) for item in node.elts)
    if isinstance(node, ast.Attribute):
        return node.attr in BACKEND_ATTRIBUTES or (node.attr == "name" and isinstance(node.value, ast.Name)
                                                   and node.value.id == "choice")
    return isinstance(node, ast.Constant) and node.value in BACKEND_NAMES


def _install_set_or_package(node: ast.expr) -> bool:
    """env/'s install sets are named "plain" and "gpu" (env/known_good.toml), and "unsloth" is also a package
    (`"unsloth" in sys.modules`): those comparisons name an install set or a module, not a backend."""
    if isinstance(node, ast.Name):
        return node.id in {"mode", "set_name", "modules"}
    if isinstance(node, ast.Attribute):
        return node.attr in {"install", "modules"}
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "mode"
    if isinstance(node, ast.IfExp):
        return _install_set_or_package(node.body) or _install_set_or_package(node.orelse)
    return False


def _backend_name_comparisons(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, source) of each comparison with a backend's name (`choice.name == "plain"`, `x in ("unsloth", ...)`,
    `backend.NAME != other`), not counting install sets and packages (`_install_set_or_package`)."""
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(tree) if isinstance(node, ast.Compare)
            and any(map(_names_a_backend, [node.left, *node.comparators]))
            and not any(map(_install_set_or_package, [node.left, *node.comparators]))]


def _per_tree(names: dict[str, Path], cycles: list[list[str]], folder_cycles: list[list[str]],
              over: dict[str, int], functions_over: dict[str, int]) -> dict[str, dict[str, int]]:
    """Each tree's count of loops (a loop across trees counts in each) and of modules and functions over the limits."""
    def count(groups, tree):
        return sum(1 for group in groups if any(member.split(".")[0].split("/")[0] == tree for member in group))
    return {tree: {"modules": sum(1 for m in names if m.split(".")[0] == tree),
                   "file_loops": count(cycles, tree), "folder_loops": count(folder_cycles, tree),
                   "modules_over_limit": sum(1 for m in over if m.split(".")[0] == tree),
                   "functions_over_limit": sum(1 for f in functions_over if f.split(".")[0] == tree)}
            for tree in SIZED}


def _sizes(root: Path) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """Every module's lines and every function's, in `SIZED`."""
    lines: dict[str, int] = {}
    functions: list[tuple[str, int]] = []
    for path in [path for tree in SIZED for path in sorted((root / tree).rglob("*.py"))]:
        text = path.read_text(encoding="utf-8")
        lines[module_name(path, root)] = len(text.splitlines())
        functions += _functions(ast.parse(text), module_name(path, root))
    return lines, functions


def measure(root: Path = ROOT) -> dict:
    files = [path for tree in TREES for path in sorted((root / tree).rglob("*.py"))]
    names = {module_name(path, root): path for path in files}
    known = set(names)
    graph: dict[str, set[str]] = defaultdict(set)
    top_level: dict[str, set[str]] = defaultdict(set)  # module -> what it imports at its top (any package)
    local: dict[str, list[tuple[str, int, bool]]] = defaultdict(list)  # module -> (target, line, commented)
    takers: dict[str, int] = {}
    comparisons: list[str] = []
    for module, path in names.items():
        text = path.read_text(encoding="utf-8")
        source_lines = text.splitlines()
        tree = ast.parse(text)
        relative = path.relative_to(root).as_posix()
        if _recipe_takers(tree):
            takers[relative] = _recipe_takers(tree)
        if not relative.startswith(BACKENDS_HOME):
            comparisons += [f"{relative}:{n}: {source}" for n, source in _backend_name_comparisons(tree)]
        for target, at_top, lineno in _imports(tree, module, path.name == "__init__.py", known):
            inside = target if target in known else None
            if inside is None and target.split(".")[0] in TREES:
                inside = next((k for k in sorted(known, key=len, reverse=True) if target.startswith(k + ".")), None)
            if inside and inside != module:
                graph[module].add(inside)
            if at_top:
                top_level[module].add(inside or target)
            elif module.split(".")[0] == PACKAGE:
                local[module].append((inside or target, lineno, commented(source_lines, lineno)))
    lines, functions = _sizes(root)

    def heavy(module: str, seen: set[str]) -> bool:
        if module.split(".")[0] in HEAVY or module in HEAVY:
            return True
        if module in seen or module not in known:
            return False
        seen.add(module)
        return any(heavy(child, seen) for child in top_level.get(module, ()))

    ours = [m for m in known if m.split(".")[0] == PACKAGE]
    arrows = sorted({(room_of(a), room_of(b)) for a in ours for b in graph.get(a, ())
                     if b.split(".")[0] == PACKAGE and room_of(a) != room_of(b)})
    floor = {room: i for i, room in enumerate(FLOORS)}
    up = [(a, b) for a, b in arrows if floor.get(a, len(FLOORS)) < floor.get(b, len(FLOORS))]
    folders, trees = defaultdict(set), defaultdict(set)
    for a, targets in graph.items():
        folders[folder_of(a)] |= {folder_of(b) for b in targets} - {folder_of(a)}
        trees[a.split(".")[0]] |= {b.split(".")[0] for b in targets} - {a.split(".")[0]}
    for_torch = sorted({(m, t, n) for m, targets in local.items() for t, n, _ in targets if heavy(t, set())})
    other = sorted({(m, t, n) for m, targets in local.items() for t, n, note in targets
                    if note and not heavy(t, set())})
    unjustified = sorted({(m, t) for m, targets in local.items() for t, _, note in targets
                          if not note and not heavy(t, set())})
    uncommented = sorted({(m, t, n) for m, targets in local.items() for t, n, note in targets if not note})
    rooms = sorted({room_of(m) for m in ours})
    over = {m: n for m, n in sorted(lines.items(), key=lambda kv: -kv[1]) if n > MODULE_LIMIT}
    functions_over = {f: n for f, n in sorted(functions, key=lambda kv: -kv[1]) if n > FUNCTION_LIMIT}
    cycles, folder_cycles = _cycles(graph), _cycles(folders)
    return {
        "rooms": rooms,
        "unplaced_rooms": [room for room in rooms if room not in floor],
        "arrows": len(arrows),
        "arrows_up": [f"{a} -> {b}" for a, b in up],
        "cycles": cycles,
        "folder_cycles": folder_cycles,
        "tree_cycles": _cycles(trees),
        "per_tree": _per_tree(names | {m: Path() for m in lines}, cycles, folder_cycles, over, functions_over),
        "modules_over_limit": over,
        "functions_over_limit": functions_over,
        "recipe_takers": sum(takers.values()),
        "recipe_takers_per_file": dict(sorted(takers.items(), key=lambda kv: (-kv[1], kv[0]))),
        "backend_name_comparisons": comparisons,
        "local_imports_for_torch": len(for_torch),
        "local_imports_for_another_reason": [f"{m}:{n}: {t}" for m, t, n in other],
        "local_imports_without_reason": [f"{m}: {t}" for m, t in unjustified],
        "local_imports_uncommented": [f"{m}:{n}: {t}" for m, t, n in uncommented],
    }


def command_line(argv: list[str] | None, description: str, measure_tree, show) -> int:
    """The two scripts' shared command line: `--root` (another checkout, e.g. an older commit's worktree) and
    `--json`; `show` prints the measures for people."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    parser.add_argument("--json", action="store_true", help="print the measures as JSON")
    args = parser.parse_args(argv)
    found = measure_tree(args.root.resolve())
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        show(found)
    return 0


def _listed(title: str, items, label: str = "") -> None:
    print(title)
    for item in items:
        print(f"  {label}{item}")


def show(found: dict) -> None:
    _listed(f"rooms: {len(found['rooms'])}  arrows: {found['arrows']}  running up: {len(found['arrows_up'])}  "
            f"file loops: {len(found['cycles'])}  folder loops: {len(found['folder_cycles'])}  "
            f"tree loops: {len(found['tree_cycles'])}",
            [f"up: {arrow}" for arrow in found["arrows_up"]]
            + [f"file loop: {' <-> '.join(c)}" for c in found["cycles"]]
            + [f"folder loop: {' <-> '.join(c)}" for c in found["folder_cycles"]]
            + [f"tree loop: {' <-> '.join(c)}" for c in found["tree_cycles"]])
    _listed("per tree:", [f"{tree:9s} {n['modules']:4d} modules, {n['file_loops']} file loops, {n['folder_loops']} "
                          f"folder loops, {n['modules_over_limit']} modules and {n['functions_over_limit']} functions "
                          f"over the limits" for tree, n in found["per_tree"].items()])
    _listed(f"modules over {MODULE_LIMIT} lines: {len(found['modules_over_limit'])}",
            [f"{n:5d}  {module}" for module, n in found["modules_over_limit"].items()])
    _listed(f"functions over {FUNCTION_LIMIT} lines: {len(found['functions_over_limit'])}",
            [f"{n:5d}  {function}" for function, n in found["functions_over_limit"].items()])
    _listed(f"function-local imports: {found['local_imports_for_torch']} reach torch/unsloth/vllm, "
            f"{len(found['local_imports_for_another_reason'])} stay for another reason said at them, "
            f"{len(found['local_imports_without_reason'])} could sit at the top",
            [f"another reason: {i}" for i in found["local_imports_for_another_reason"]]
            + [f"could sit at the top: {i}" for i in found["local_imports_without_reason"]])
    _listed(f"function-local imports without a comment saying why: {len(found['local_imports_uncommented'])}",
            found["local_imports_uncommented"], "uncommented: ")
    _listed(f"functions taking the whole recipe or run (a parameter named {'/'.join(sorted(RECIPE_PARAMETERS))}): "
            f"{found['recipe_takers']}", [f"{n:4d}  {path}" for path, n in found["recipe_takers_per_file"].items()])
    _listed(f"comparisons with a backend's name outside {BACKENDS_HOME}: {len(found['backend_name_comparisons'])}",
            found["backend_name_comparisons"], "compares: ")
    if found["unplaced_rooms"]:
        print(f"rooms missing from FLOORS: {', '.join(found['unplaced_rooms'])}")


def main(argv: list[str] | None = None) -> int:
    return command_line(argv, __doc__.splitlines()[0], measure, show)


if __name__ == "__main__":
    sys.exit(main())
