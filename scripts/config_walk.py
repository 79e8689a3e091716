"""Where the config goes: the walk of `cfg` from `pipeline/train.py run_training`, read from the code's own
imports and definitions.

    python scripts/config_walk.py            # the summary, then the walk as an indented call tree
    python scripts/config_walk.py --json     # the same as JSON
    python scripts/config_walk.py --root DIR # another checkout (e.g. `git worktree add DIR COMMIT`)

The walk starts in `run_training` with its parameter `cfg` and follows every call that hands the config on:
the config itself, one of its sections (`cfg.grpo`), or an object holding it (`run = Run(cfg, ...)` then
`_data(run)`, where `run.cfg` is the config). It enters the called function with the parameters that received
it and goes on from there, depth first, in source order. Each function is walked once per way of receiving the
config, so the walk ends. What it cannot resolve from imports (a call through an object: `run.backend.x(cfg)`,
`trainer.train()`) it counts as not followed; the config's own methods (`cfg.replace`) are not a step of the walk.

For every step from one module into another it says:
- *entered*: a module the walk had not been in;
- *return*: a module the walk had already been in and left (every entry after the first);
- *climb*: the callee's room sits on a higher floor than the caller's (scripts/layout_metrics.py FLOORS; env/ and
  rewards/ are below every room of pipeline/): the config going back up the data path.
And it names every place outside the pre-flight check that calls into it (issue 39: entered from one place).

Hand-written on `ast`, as layout_metrics.py is: call-graph tools (pyan, code2flow) draw who calls whom but do
not follow one value through the calls.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layout_metrics import FLOORS, ROOT, _absolute, command_line, module_name, room_of  # noqa: E402

PACKAGES = ("pipeline", "env", "rewards")
START = ("pipeline.train", "run_training", ("cfg",))
CHECK_MODULE = "pipeline.preflight"


@dataclass
class Module:
    name: str
    tree: ast.Module
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)  # "f" and "Class.method"
    dataclass_fields: dict[str, list[str]] = field(default_factory=dict)  # a dataclass's fields, in order
    bindings: dict[str, str] = field(default_factory=dict)  # name -> "module" or "module:attr"


def _index(root: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    paths = [p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))]
    known = {module_name(p, root) for p in paths}
    for path in paths:
        name = module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = modules[name] = Module(name, tree)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                module.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                module.bindings[node.name] = f"{name}:{node.name}"
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        module.functions[f"{node.name}.{item.name}"] = item
                if any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                    module.dataclass_fields[node.name] = [
                        item.target.id for item in node.body
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)]
        # every import, at the top or inside a function: a name means one thing in a module of ours
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        module.bindings[alias.asname] = alias.name
                    else:  # `import pipeline.data.tokenizer` binds the dotted name
                        module.bindings[alias.name] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, name, path.name == "__init__.py")
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    module.bindings[alias.asname or alias.name] = sub if sub in known else f"{base}:{alias.name}"
    return modules


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _carries(expr: ast.AST, tracked: dict[str, str]) -> tuple[str, str] | None:
    """How `expr` reaches the config, as it continues in the callee: ("", "config") for the config itself,
    ("", "section") for one of its sections (`cfg.grpo`), (".cfg", kind) for an object holding it (`run` when
    `run.cfg` is tracked); None otherwise (a leaf value such as `cfg.grpo.output_dir` is not the config)."""
    text = _dotted(expr)
    if text is None:
        return None
    for path, kind in tracked.items():
        if text == path:
            return "", kind
        if kind == "config" and text.startswith(path + ".") and text.count(".") == path.count(".") + 1:
            return "", "section"
        if path.startswith(text + "."):
            return path[len(text):], kind
    return None


def _resolve(modules: dict[str, Module], module: Module, func: ast.AST, cls: str | None) -> tuple[str, str] | None:
    """(module, function or Class.method or Class) a call goes to, when the imports say."""
    text = _dotted(func)
    if text is None:
        return None
    head, _, rest = text.partition(".")
    if head == "self" and cls and rest and "." not in rest:
        return (module.name, f"{cls}.{rest}") if f"{cls}.{rest}" in module.functions else None
    if not rest and head in module.functions:
        return module.name, head
    bound = module.bindings.get(head)
    if bound is None:
        return None
    if ":" in bound:  # a name imported from a module
        target, attr = bound.split(":")
        return (target, attr) if not rest and target in modules else None
    # a module: walk the dotted rest down to a module, then the function in it
    target, parts = bound, rest.split(".") if rest else []
    while parts and f"{target}.{parts[0]}" in modules:
        target = f"{target}.{parts.pop(0)}"
    if len(parts) == 1 and target in modules:
        return target, parts[0]
    return None


def _calls_in_order(node: ast.AST) -> list[ast.Call]:
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


@dataclass
class Step:
    caller: str  # module:function
    callee: str
    line: int
    depth: int
    kind: str  # entered | return | inside (same module)
    climb: bool


def _floor(module: str) -> int:
    if module.split(".")[0] != "pipeline":
        return -1  # env/ and rewards/: below every room
    room = room_of(module)
    return FLOORS.index(room) if room in FLOORS else len(FLOORS)


def walk(root: Path = ROOT) -> dict:
    modules = _index(root)
    steps: list[Step] = []
    seen_modules: list[str] = []
    expanded: set[tuple[str, str, frozenset[tuple[str, str]]]] = set()
    not_followed = 0

    def visit(module_name_: str, function: str, tracked: dict[str, str], depth: int) -> None:
        nonlocal not_followed
        key = (module_name_, function, frozenset(tracked.items()))
        if key in expanded:
            return
        expanded.add(key)
        module = modules[module_name_]
        node = module.functions[function]
        cls = function.split(".")[0] if "." in function else None
        tracked = dict(tracked)
        for statement in _statements_in_order(node):
            if isinstance(statement, (ast.Assign, ast.AnnAssign)):
                _taint(modules, module, statement, tracked)
            for call in _calls_in_order(statement):
                passes = _bound_arguments(modules, module, call, cls, tracked)
                if passes is None:
                    if any(_carries(a, tracked) is not None for a in [*call.args, *(k.value for k in call.keywords)]) \
                            and not _on_config(call, tracked):
                        not_followed += 1
                    continue
                target, callee_tracked = passes
                callee_module, callee_function = target
                if callee_module != module_name_:
                    kind = "return" if callee_module in seen_modules else "entered"
                    if kind == "entered":
                        seen_modules.append(callee_module)
                else:
                    kind = "inside"
                steps.append(Step(f"{module_name_}:{function}", f"{callee_module}:{callee_function}", call.lineno,
                                  depth, kind, _floor(callee_module) > _floor(module_name_)))
                if callee_tracked and callee_function in modules[callee_module].functions:
                    visit(callee_module, callee_function, callee_tracked, depth + 1)

    seen_modules.append(START[0])
    visit(START[0], START[1], {name: "config" for name in START[2]}, 0)
    crossings = [s for s in steps if s.kind != "inside"]
    check_sites = sorted({f"{s.caller}:{s.line}" for s in steps
                          if s.callee.split(":")[0] == CHECK_MODULE and s.caller.split(":")[0] != CHECK_MODULE})
    entries: dict[str, int] = {}
    for s in crossings:
        module = s.callee.split(":")[0]
        entries[module] = entries.get(module, 0) + 1
    return {
        "start": f"{START[0]}:{START[1]}",
        "modules_entered": len(seen_modules) - 1,
        "steps": len(steps),
        "returns": sum(s.kind == "return" for s in steps),
        "climbs": [f"{s.caller}:{s.line} -> {s.callee}" for s in steps if s.climb],
        "check_entered_from": check_sites,
        "entries_per_module": dict(sorted(entries.items(), key=lambda kv: (-kv[1], kv[0]))),
        "not_followed": not_followed,
        "walk": [f"{'  ' * s.depth}{s.caller} -> {s.callee} (line {s.line}, {s.kind}{', climb' if s.climb else ''})"
                 for s in steps],
    }


def _compound(statement: ast.stmt) -> bool:
    return isinstance(statement, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
                                  ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or \
        type(statement).__name__ in ("TryStar", "Match")


def _statements_in_order(function: ast.AST) -> list[ast.AST]:
    """Every simple statement of a function in source order, with the headers of compound ones (an `if`'s test,
    a `with`'s items, a `for`'s iterable) as expressions before their bodies; nested functions and lambdas are
    walked where they are written (they close over the config)."""
    out: list[ast.AST] = []

    def add(body: list[ast.stmt]) -> None:
        for statement in body:
            if not _compound(statement):
                out.append(statement)
                continue
            for name in ("test", "iter", "subject"):
                if getattr(statement, name, None) is not None:
                    out.append(ast.Expr(getattr(statement, name)))
            for item in getattr(statement, "items", []):
                out.append(ast.Expr(item.context_expr))
            for name in ("body", "orelse", "finalbody"):
                add(getattr(statement, name, []) or [])
            for handler in getattr(statement, "handlers", []):
                add(handler.body)
            for case in getattr(statement, "cases", []):
                add(case.body)

    add(function.body)
    return out


def _on_config(call: ast.Call, tracked: dict[str, str]) -> bool:
    """A method of the config itself (cfg.replace, cfg.grpo.reporters): not a step of the walk."""
    carried = _carries(call.func.value, tracked) if isinstance(call.func, ast.Attribute) else None
    return carried is not None and carried[0] == ""


def _taint(modules: dict[str, Module], module: Module, statement: ast.AST, tracked: dict[str, str]) -> None:
    """Names that hold the config after an assignment: an alias (`c = cfg.grpo`), the config's own copy
    (`cfg2 = cfg.replace(...)`), or a dataclass of ours built with it (`run = Run(cfg, ...)`: `run.cfg`)."""
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    value = statement.value
    names = [t.id for t in targets if isinstance(t, ast.Name)]
    if value is None or not names:
        return
    carried = _carries(value, tracked)
    if carried is not None and carried[0] == "":
        tracked.update((n, carried[1]) for n in names)
        return
    if isinstance(value, ast.Call) and _on_config(value, tracked):  # cfg.replace(...): a config
        tracked.update((n, "config") for n in names)
        return
    if isinstance(value, ast.Call):
        target = _resolve(modules, module, value.func, None)
        fields = modules[target[0]].dataclass_fields.get(target[1]) if target and target[0] in modules else None
        if fields:
            bound = list(zip(fields, value.args)) + [(k.arg, k.value) for k in value.keywords if k.arg]
            for field_name, arg in bound:
                carried = _carries(arg, tracked)
                if carried is not None and carried[0] == "":
                    tracked.update((f"{n}.{field_name}", carried[1]) for n in names)


def _bound_arguments(modules: dict[str, Module], module: Module, call: ast.Call, cls: str | None,
                     tracked: dict[str, str]) -> tuple[tuple[str, str], dict[str, str]] | None:
    """(callee, what the callee's parameters hold of the config) for a call that hands the config on, else None."""
    if _on_config(call, tracked):
        return None
    passed = [(i, None, a) for i, a in enumerate(call.args)] + [(None, k.arg, k.value) for k in call.keywords]
    carried = [(i, kw, _carries(a, tracked)) for i, kw, a in passed]
    carried = [(i, kw, how) for i, kw, how in carried if how is not None]
    if not carried:
        return None
    target = _resolve(modules, module, call.func, cls)
    if target is None or target[0] not in modules:
        return None
    callee = modules[target[0]].functions.get(target[1])
    if callee is None:  # a class: its dataclass fields, or nothing to follow
        return target, {}
    params = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args]]
    if "." in target[1] and params[:1] in (["self"], ["cls"]):
        params = params[1:]
    names = set(params) | {a.arg for a in callee.args.kwonlyargs}
    callee_tracked: dict[str, str] = {}
    for i, kw, (suffix, kind) in carried:
        param = params[i] if i is not None and i < len(params) else kw
        if param in names:
            callee_tracked[param + suffix] = kind
    return target, callee_tracked


def show(found: dict) -> None:
    print(f"the config's walk from {found['start']}: {found['steps']} calls hand it on, "
          f"{found['modules_entered']} modules entered, {found['returns']} returns to a module already left, "
          f"{len(found['climbs'])} climbs back up, {found['not_followed']} calls through an object not followed")
    for climb in found["climbs"]:
        print(f"  climb: {climb}")
    print(f"the pre-flight check ({CHECK_MODULE}) entered from {len(found['check_entered_from'])} place(s): "
          + ", ".join(found["check_entered_from"]))
    print("entries per module: " + ", ".join(f"{m} {n}" for m, n in list(found["entries_per_module"].items())[:8]))
    print("\nthe walk:")
    print("\n".join(found["walk"]))


def main(argv: list[str] | None = None) -> int:
    return command_line(argv, __doc__.splitlines()[0], walk, show)


if __name__ == "__main__":
    sys.exit(main())
