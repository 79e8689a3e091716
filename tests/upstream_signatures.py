"""Dev tool: snapshot the real signatures of every upstream call on the GPU boundary into
`tests/upstream_signatures.json`, read from the SOURCE of the pinned wheels (no import, no GPU).

The test double (tests/fake_unsloth.py) binds every call the pipeline makes to these signatures, so a
misspelt, unknown or missing keyword fails on a CPU machine the way it would on a GPU. Re-run after
changing a pin in env/known_good.toml; tests/test_unsloth_double.py checks the snapshot's versions
against the pins.

    python tests/upstream_signatures.py                  # pip download --no-deps the pinned wheels to a temp dir
    python tests/upstream_signatures.py --wheels /tmp/w  # reuse wheels already there (downloads what is missing)

Only the few source files named below are read out of each wheel (zipfile), so vLLM's ~340 MB wheel is
not unpacked. Why `ast` and not `inspect`: importing unsloth or vllm needs a GPU build of torch.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_pipeline.env.matrix import load_matrix

SNAPSHOT = Path(__file__).with_name("upstream_signatures.json")
PACKAGES = ("unsloth", "unsloth_zoo", "vllm", "trl", "transformers")

# name in the snapshot -> (package, file in the wheel, qualified name, how the project reaches it)
CALLABLES: dict[str, tuple[str, str, str, str]] = {
    "FastLanguageModel.from_pretrained": (
        "unsloth", "unsloth/models/loader.py", "FastLanguageModel.from_pretrained",
        "staticmethod; its **kwargs reach FastLlamaModel.from_pretrained (see kwargs_target)"),
    "FastLlamaModel.from_pretrained": (
        "unsloth", "unsloth/models/llama.py", "FastLlamaModel.from_pretrained",
        "where FastLanguageModel.from_pretrained's **kwargs end up for Llama/Qwen2 models"),
    "FastLanguageModel.get_peft_model": (
        "unsloth", "unsloth/models/llama.py", "FastLlamaModel.get_peft_model",
        "FastLanguageModel.get_peft_model is functools.wraps(FastLlamaModel.get_peft_model) over "
        "(model, *args, **kwargs) and forwards everything to it"),
    "FastLanguageModel.for_inference": (
        "unsloth", "unsloth/models/loader.py", "FastLanguageModel.for_inference", "staticmethod"),
    "FastLanguageModel.for_training": (
        "unsloth", "unsloth/models/loader.py", "FastLanguageModel.for_training", "staticmethod"),
    "unsloth.vLLMSamplingParams": (
        "unsloth", "unsloth/models/rl.py", "vLLMSamplingParams",
        "vllm.SamplingParams(**kwargs) plus `_set_kwargs = kwargs`"),
    "model.fast_generate[fast_inference=True]": (
        "vllm", "vllm/entrypoints/llm.py", "LLM.generate",
        "bound method: FastLlamaModel.from_pretrained sets model.fast_generate = model.vllm_engine.generate; "
        "patch_peft_fast_inference (unsloth/models/_utils.py) copies it onto the PeftModel"),
    "model.fast_generate[fast_inference=False]": (
        "unsloth", "unsloth/models/_utils.py", "make_fast_generate_wrapper",
        "without vLLM, FastLlamaModel.from_pretrained sets model.fast_generate = "
        "make_fast_generate_wrapper(model.generate): HF generate kwargs; raises ValueError for "
        "`sampling_params` or vLLM-style string prompts. patch_peft_fast_inference does NOT copy it onto "
        "the PeftModel (only with an engine), so after get_peft_model it is reached through __getattr__"),
    "model.load_lora": (
        "unsloth_zoo", "unsloth_zoo/vllm_utils.py", "load_lora",
        "functools.partial(load_lora, model), set by patch_peft_fast_inference ONLY when the model has "
        "a vllm_engine: absent with fast_inference=False"),
    "model.save_lora[fast_inference=True]": (
        "unsloth_zoo", "unsloth_zoo/vllm_utils.py", "save_lora",
        "functools.partial(save_lora, model), set by patch_peft_fast_inference with an engine"),
    "model.save_lora[fast_inference=False]": (
        "unsloth", "unsloth/models/_utils.py", "save_lora_adapter",
        "functools.partial(save_lora_adapter, model), set by patch_peft_fast_inference without an engine"),
    "model.save_pretrained_merged": (
        "unsloth", "unsloth/save.py", "unsloth_generic_save_pretrained_merged",
        "types.MethodType bound by patch_saving_functions (unsloth/save.py _bind_saving_method)"),
    "model.save_pretrained_gguf": (
        "unsloth", "unsloth/save.py", "unsloth_save_pretrained_gguf",
        "types.MethodType bound by patch_saving_functions (unsloth/save.py _bind_saving_method)"),
    "LLM.sleep": ("vllm", "vllm/entrypoints/llm.py", "LLM.sleep", "model.vllm_engine.sleep"),
    "LLM.wake_up": ("vllm", "vllm/entrypoints/llm.py", "LLM.wake_up", "model.vllm_engine.wake_up"),
    "LLMEngine.sleep": ("vllm", "vllm/v1/engine/llm_engine.py", "LLMEngine.sleep",
                        "what LLM.sleep calls; its body compares `level >= 1`, so a str level raises TypeError"),
}

# name in the snapshot -> (package, file, class): classes whose annotated fields ARE the constructor.
STRUCTS: dict[str, tuple[str, str, str]] = {
    "SamplingParams": ("vllm", "vllm/sampling_params.py", "SamplingParams"),
    "LoRARequest": ("vllm", "vllm/lora/request.py", "LoRARequest"),
}

# How UnslothGRPOConfig / UnslothSFTConfig are generated: unsloth/models/rl.py _patch_trl_rl_trainers_impl fills
# the `class Unsloth{RLConfig_name}({RLConfig_name})` template with TRL's config (a dataclass over transformers'
# TrainingArguments) and adds its own fields. trainer_file -> (TRL file, TRL class).
RL_CONFIGS = {
    "grpo_trainer": ("trl/trainer/grpo_config.py", "GRPOConfig"),
    "sft_trainer": ("trl/trainer/sft_config.py", "SFTConfig"),  # the SFT warm-up
}
BASE_CONFIG_SOURCES = [
    ("transformers", "transformers/training_args.py", "TrainingArguments"),
    ("trl", "trl/trainer/base_config.py", "_BaseConfig"),
]
RL_TEMPLATE = ("unsloth", "unsloth/models/rl.py")


def _pins() -> dict[str, str]:
    matrix = load_matrix()
    pins = {}
    for set_name in ("plain", "gpu"):
        for pin in matrix.packages(set_name).values():
            if pin.name.replace("-", "_") in PACKAGES and pin.exact:
                pins[pin.name.replace("-", "_")] = pin.exact
    return pins


def _wheel(wheels: Path, package: str, version: str) -> Path:
    found = sorted(wheels.glob(f"{package}-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        f"{package}=={version}", "-d", str(wheels)], check=True)
        found = sorted(wheels.glob(f"{package}-{version}-*.whl"))
    if not found:
        raise SystemExit(f"no wheel for {package}=={version} in {wheels}")
    return found[0]


class Sources:
    """Reads single files out of the pinned wheels and caches their parsed trees."""

    def __init__(self, wheels: Path, pins: dict[str, str]):
        self.zips = {p: zipfile.ZipFile(_wheel(wheels, p, pins[p])) for p in PACKAGES}
        self.trees: dict[tuple[str, str], ast.Module] = {}

    def text(self, package: str, path: str) -> str:
        return self.zips[package].read(path).decode("utf-8")

    def tree(self, package: str, path: str) -> ast.Module:
        key = (package, path)
        if key not in self.trees:
            self.trees[key] = ast.parse(self.text(package, path))
        return self.trees[key]


def _find(tree: ast.Module, qualname: str) -> ast.AST:
    node: ast.AST = tree
    for part in qualname.split("."):
        matches = [n for n in ast.iter_child_nodes(node)
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part]
        if not matches:
            raise SystemExit(f"{qualname}: {part} not found")
        node = matches[-1]  # the last definition wins, as at import
    return node


def _module_constants(tree: ast.Module | None) -> dict[str, ast.expr]:
    """Top-level `NAME = <expr>` assignments, to resolve a default such as _DEFAULT_TARGET_MODULES."""
    out: dict[str, ast.expr] = {}
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
    return out


def _default(node: ast.expr | None, constants: dict[str, ast.expr] | None = None) -> dict | None:
    """{'source': text} always, plus {'value': v} when the default is a literal (or a module constant
    holding one)."""
    if node is None:
        return None
    out: dict = {"source": ast.unparse(node)}
    if isinstance(node, ast.Name) and constants and node.id in constants:
        node = constants[node.id]
    try:
        out["value"] = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        pass
    return out


def _param(name: str, kind: str, default: ast.expr | None, constants: dict | None = None) -> dict:
    entry: dict = {"name": name, "kind": kind}
    if default is not None:
        entry["default"] = _default(default, constants)
    return entry


def function_signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, constants: dict | None = None) -> list[dict]:
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults: list = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = []
    for i, arg in enumerate(positional):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        params.append(_param(arg.arg, kind, defaults[i], constants))
    if a.vararg:
        params.append(_param(a.vararg.arg, "VAR_POSITIONAL", None))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append(_param(arg.arg, "KEYWORD_ONLY", default, constants))
    if a.kwarg:
        params.append(_param(a.kwarg.arg, "VAR_KEYWORD", None))
    return params


def struct_fields(cls: ast.ClassDef) -> list[dict]:
    """Annotated class-level fields in order (dataclass / msgspec.Struct), without ClassVar ones."""
    fields = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if "ClassVar" in ast.unparse(node.annotation):
                continue
            entry: dict = {"name": node.target.id, "annotation": ast.unparse(node.annotation)}
            if node.value is not None:
                value = node.value
                if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field"):
                    kw = {k.arg: k.value for k in value.keywords}
                    value = kw.get("default") or kw.get("default_factory")
                if value is not None:
                    entry["default"] = _default(value)
            fields.append(entry)
    return fields


def _method_raises(fn: ast.AST) -> list[str]:
    """The exception types a function body raises directly (for the record, not for binding)."""
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            names.add(ast.unparse(exc))
    return sorted(names)


def _replacements(stmts: list[ast.stmt]) -> dict:
    """The `replacements = {...}` dict literals (and `replacements[k] = v`) among these statements."""
    out = {}
    for stmt in stmts:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Dict) \
                and ast.unparse(stmt.targets[0]) == "replacements":
            out.update({ast.literal_eval(k): _default(v) for k, v in zip(stmt.value.keys, stmt.value.values)})
        elif isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]).startswith("replacements["):
            out[ast.literal_eval(stmt.targets[0].slice)] = _default(stmt.value)
    return out


def rl_config_fields(src: Sources, trainer_file: str) -> dict:
    """The fields of the config class Unsloth generates for `trainer_file`: TrainingArguments + TRL's config +
    Unsloth's additions, and the defaults Unsloth's generated __init__ replaces."""
    trl_path, trl_class = RL_CONFIGS[trainer_file]
    fields: dict[str, dict] = {}
    origin: dict[str, str] = {}
    for package, path, cls in [*BASE_CONFIG_SOURCES, ("trl", trl_path, trl_class)]:
        for f in struct_fields(_find(src.tree(package, path), cls)):
            fields[f["name"]] = f
            origin[f["name"]] = f"{package}:{cls}"
    template = src.text(*RL_TEMPLATE)
    start = template.index("class Unsloth{RLConfig_name}({RLConfig_name}):")
    body = template[start:template.index("def __init__(", start)]
    extras = re.findall(r"^    (\w+)\s*:\s*[^=\n]+=\s*field\(\s*\n\s*default\s*=\s*([^,\n]+),", body, re.M)
    # The conditional extras (_patch_trl_rl_trainers_impl): max_seq_length only when the TRL config has
    # max_length but no max_seq_length; context parallel fields when TRL lacks them.
    if "max_seq_length" not in fields and "max_length" in fields:
        extras.append(("max_seq_length", "None"))
    if "context_parallel_size" not in fields:
        if trainer_file == "sft_trainer":
            extras += [("context_parallel_size", "1"), ("context_parallel_backend", "'ring'"),
                       ("context_parallel_rotate_method", "'allgather'")]
        else:
            extras += [("context_parallel_size", "1"), ("context_parallel_backend", "'ulysses'")]
    unsloth_class = f"Unsloth{trl_class}"
    for name, default in extras:
        fields[name] = {"name": name, "default": _default(ast.parse(default, mode="eval").body)}
        origin[name] = f"unsloth:{unsloth_class}"
    # Defaults Unsloth's generated __init__ replaces: for every trainer (+ warmup_steps on transformers 5),
    # then the trainer-specific ones.
    fn = _find(src.tree(*RL_TEMPLATE), "_patch_trl_rl_trainers_impl")
    overrides = _replacements(fn.body)
    for node in fn.body:
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if test.startswith("transformers_version >="):
                overrides.update(_replacements(node.body))
            elif test == f"trainer_file == '{trainer_file}'":
                overrides.update(_replacements(node.body))
    return {
        "fields": sorted(fields),
        "origin": origin,
        # the regex in _patch_trl_rl_trainers_impl only rewrites parameters the config has
        "unsloth_default_overrides": {k: v for k, v in overrides.items() if k in fields},
        "unknown_keywords": "dropped with a printed notice by unsloth/models/rl_config_compat.py "
                            "filter_config_init_kwargs (not an error for real); the fake refuses them",
    }


def build(src: Sources, pins: dict[str, str]) -> dict:
    callables = {}
    for name, (package, path, qualname, note) in CALLABLES.items():
        tree = src.tree(package, path)
        node = _find(tree, qualname)
        callables[name] = {"package": package, "file": path, "qualname": qualname, "how": note,
                           "parameters": function_signature(node, _module_constants(tree)),
                           "raises": _method_raises(node)}
    structs = {}
    for name, (package, path, cls) in STRUCTS.items():
        structs[name] = {"package": package, "file": path, "qualname": cls,
                         "fields": struct_fields(_find(src.tree(package, path), cls))}
    return {
        "generated_by": "python tests/upstream_signatures.py",
        "versions": {p: pins[p] for p in PACKAGES},
        "callables": callables,
        "structs": structs,
        "UnslothGRPOConfig": rl_config_fields(src, "grpo_trainer"),
        "UnslothSFTConfig": rl_config_fields(src, "sft_trainer"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheels", type=Path, help="folder with (or for) the pinned wheels")
    parser.add_argument("--out", type=Path, default=SNAPSHOT)
    args = parser.parse_args(argv)
    pins = _pins()
    with tempfile.TemporaryDirectory() as tmp:
        wheels = args.wheels or Path(tmp)
        wheels.mkdir(parents=True, exist_ok=True)
        snapshot = build(Sources(wheels, pins), pins)
    args.out.write_text(json.dumps(snapshot, indent=1, sort_keys=False, default=str) + "\n")
    print(f"wrote {args.out} from {', '.join(f'{p}=={v}' for p, v in snapshot['versions'].items())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
