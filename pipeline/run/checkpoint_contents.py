"""What a checkpoint's files hold, checked against the run that resumes it, before anything loads.

Another run's optimizer.pt ended in "size of tensor a (16) must match (64)" mid-resume; a checkpoint without one
resumed with a fresh optimizer, silently. `contents_problem` reads every file a resume restores, as transformers
5.17's `_load_optimizer_and_scheduler` and `_load_rng_state` do (torch.load, weights_only), and compares them with the
LoRA settings, the base model and each other, where this run's launcher keeps them (launchers.py LAYOUTS).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

from huggingface_hub import try_to_load_from_cache
from safetensors import safe_open

from grpo_pipeline.env.adapters import AdapterError, verify_adapter_dir
from grpo_pipeline.env.text import excerpt, printable, shorten
from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path
from grpo_pipeline.pipeline.run.launchers import LAYOUTS, Launch, held_layouts
from grpo_pipeline.pipeline.run.resume import ResumeKey

RESTORED_FILES = ("optimizer.pt", "scheduler.pt")  # a plain or DDP resume without them starts afresh, silently
TORCH_OPTIMIZER = ("plain", "ddp")  # the layouts whose optimizer.pt is read here (the others' are the engine's own)
MOMENTS = ("exp_avg", "momentum_buffer")  # a state entry shaped as its parameter (Adam's, SGD's)


def tensor_shapes(files: list) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) from safetensors headers only (nothing is loaded)."""
    shapes = {}
    for path in files:
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                shapes[name] = (tuple(piece.get_shape()), piece.get_dtype())
    return shapes


def local_model_files(base_model: str) -> list:
    """The base model's *.safetensors when they are on this machine (a folder or the HF cache), else []."""
    folder = Path(resolve_model_path(base_model)).expanduser()
    if not folder.is_dir():
        try:
            cached = try_to_load_from_cache(base_model, "config.json")
        except Exception:  # not a valid repo id: nothing cached to compare with
            return []
        if not isinstance(cached, str):
            return []
        folder = Path(cached).parent
    return sorted(folder.glob("*.safetensors"))


def adapter_mismatch(adapter: Any, base_model: str, lora: Optional[dict] = None) -> Optional[str]:
    """Why `adapter` cannot load on `base_model`, or None: adapter_config.json's rank and each LoRA matrix's shape
    (`lora`: tensor_shapes of its weights, when read already) against the base's weights, from the headers (peft
    would fail after the model has loaded). Quantized (4-bit) base weights have packed shapes and are not compared."""
    if adapter.weights_file.suffix != ".safetensors":
        return None
    lora = lora or tensor_shapes([adapter.weights_file])
    base = tensor_shapes(local_model_files(base_model))
    rank_pattern = adapter.config.get("rank_pattern") or {}
    trained_on = adapter.base_model_name_or_path
    for name, (shape, _) in sorted(lora.items()):
        if ".lora_A." not in name or len(shape) != 2:
            continue
        module = name.split(".lora_A.")[0]
        rank = next((r for key, r in rank_pattern.items() if module.endswith(key)), adapter.r)
        if shape[0] != rank:
            return (f"adapter {adapter.path}: adapter_config.json says rank r={rank}, but {module} has rank "
                    f"{shape[0]} in {adapter.weights_file.name}. The config and the weights come from different "
                    "adapters: copy the adapter_config.json saved with these weights.")
        b_shape = lora.get(name.replace(".lora_A.", ".lora_B."), ((None, None), ""))[0]
        base_name = module.removeprefix("base_model.model.") + ".weight"
        if base_name not in base or base[base_name][1] in ("U8", "I8"):
            continue
        out_features, in_features = base[base_name][0]
        if (b_shape[0], shape[1]) != (out_features, in_features):
            return (f"adapter {adapter.path} does not fit base model {excerpt(base_model)}: its {module} maps "
                    f"{shape[1]} -> {b_shape[0]} features, the base's maps {in_features} -> {out_features}. "
                    f"The adapter was trained on {excerpt(trained_on)}; pass that model (--model), or an adapter "
                    f"trained on {excerpt(base_model)}.")
    return None


def _fix(folder: Path) -> str:
    return (f"Resume another checkpoint (--resume {folder.parent}/checkpoint-N), or start over in this folder "
            "(--resume never; the earlier run is moved to previous/) or in a new --output_dir.")


def contents_problem(checkpoint: str | Path, key: ResumeKey) -> Optional[str]:
    """Why the files of `checkpoint` do not fit the run that would resume it (`key`: its LoRA shape, base model and
    launch, pipeline/run/resume.py), or None (module docstring)."""
    folder = Path(checkpoint)
    missing = _restored_missing(folder, key.launch)
    if missing:
        return missing
    try:
        trained = _adapter_problem(folder, key.shape["lora_r"], key.shape["lora_target_modules"], key.base_model)
        if isinstance(trained, str):
            return trained
        if key.launch.layout in TORCH_OPTIMIZER:  # optimizer.pt: its groups and shapes are read
            return _optimizer_problem(folder, trained) or _rng_problem(folder)
        return (_scheduler_problem(folder, None) if key.launch.scheduler_file else None) or _rng_problem(folder)
    except _Unreadable as err:
        return (f"{err.path} is not a checkpoint this run can read ({err.why}): a file of another program or "
                f"version, or not a checkpoint at all; nothing in it was run. {_fix(folder)}")


def _restored_missing(folder: Path, launch: Launch) -> Optional[str]:
    """Why the optimizer or the schedule of `folder` would not be restored under this run's launch, or None."""
    layout = LAYOUTS[launch.layout]
    missing = layout.missing(folder)
    held = [LAYOUTS[name] for name in held_layouts(folder)]
    if missing and held:
        return (f"{folder} holds its optimizer as {held[0].saved_by} saves it ({held[0].holds}), and this run is "
                f"launched {layout.launched}, which reads {layout.holds}: a resume would not restore the optimizer. "
                f"Launch it as it was trained ({held[0].launch}), or: {_fix(folder)}")
    if missing is None and launch.scheduler_file and not (folder / "scheduler.pt").is_file():
        missing = "scheduler.pt"
    if missing is None:
        return None
    return (f"{folder / missing} is missing: a resume {layout.without} (this run is launched {layout.launched}, "
            f"which keeps the optimizer in {layout.holds}). Put the file back (from where the checkpoint was "
            f"copied), or: {_fix(folder)}")


class _Unreadable(Exception):
    def __init__(self, path: Path, why: str):
        self.path, self.why = path, why


def _adapter_problem(folder: Path, lora_r: int, target_modules: Any, base_model: str) -> Any:
    """The adapter's matrices' shapes (a Counter), or why they do not fit the LoRA settings and the base model."""
    try:
        adapter = verify_adapter_dir(folder)
    except AdapterError as err:
        raise _Unreadable(folder / "adapter_model.safetensors", printable(err)) from None
    if adapter.weights_file.suffix != ".safetensors":
        return None  # an old .bin adapter: its shapes are read by peft only
    try:
        shapes = tensor_shapes([adapter.weights_file])
    except Exception as err:  # noqa: BLE001 - safetensors' own error classes: the file is not one
        raise _Unreadable(adapter.weights_file, f"{type(err).__name__}: {printable(err)}") from None
    ranks = {shape[0] for name, (shape, _) in shapes.items() if ".lora_A." in name and len(shape) == 2}
    modules = {name.split(".lora_A.")[0].rsplit(".", 1)[-1] for name in shapes if ".lora_A." in name}
    wanted = set(target_modules or [])
    where = f"{adapter.weights_file} holds a LoRA"
    if ranks and ranks != {lora_r}:
        return (f"{where} of rank {sorted(ranks)}, and this run trains lora_r {lora_r}: it is another run's "
                f"adapter. {_fix(folder)}")
    if modules and wanted and all(w.isidentifier() for w in wanted) and modules != wanted:
        return (f"{where} on {sorted(modules)}, and this run's lora_target_modules are {sorted(wanted)}: it is "
                f"another run's adapter. {_fix(folder)}")
    mismatch = adapter_mismatch(adapter, base_model, shapes)
    if mismatch:
        return f"{mismatch} (in {folder}) {_fix(folder)}"
    return Counter(shape for _, (shape, _) in shapes.items())


def _load(path: Path, fits: Callable[[Any], bool], unfit: str) -> Any:
    """A torch-saved file as transformers loads it on resume (weights_only, with its `safe_globals`: no code runs);
    _Unreadable(`unfit`) when it is not what `fits` expects there."""
    # lazy: transformers imports torch; the resume check is the first place a run reads a torch file
    import torch
    from transformers.trainer_pt_utils import safe_globals

    try:
        with safe_globals():
            loaded = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)  # reads what it needs
    except Exception as err:  # noqa: BLE001 - an UnpicklingError, a zip error: the file is not ours to read
        first = re.sub(r"\x1b\[[0-9;]*m", "", printable(err)).splitlines()[0] if str(err) else ""
        raise _Unreadable(path, shorten(f"{type(err).__name__}: {first}", 200)) from None
    if not fits(loaded):
        raise _Unreadable(path, unfit)
    return loaded


def _optimizer_problem(folder: Path, trained: Optional[Counter]) -> Optional[str]:
    """optimizer.pt's groups and state shapes against the adapter's matrices, then scheduler.pt's."""
    path = folder / "optimizer.pt"
    state = _load(path, lambda s: isinstance(s, dict) and isinstance(s.get("param_groups"), list),
                  "no param_groups: not an optimizer's state_dict")
    groups = state["param_groups"]
    count = sum(len(group.get("params", [])) for group in groups if isinstance(group, dict))
    shapes = Counter(tuple(value.shape) for entry in (state.get("state") or {}).values() if isinstance(entry, dict)
                     for key, value in entry.items() if key in MOMENTS and hasattr(value, "shape"))
    if trained is not None and (count != sum(trained.values()) or shapes - trained):
        extra = sorted(shapes - trained)[:3]
        return (f"{path} is the optimizer of another model: it holds {count} parameters"
                + (f", of shapes such as {extra}," if extra else "")
                + f" and this checkpoint's adapter trains {sum(trained.values())}. {_fix(folder)}")
    return _scheduler_problem(folder, groups)


def _scheduler_problem(folder: Path, groups: Optional[list]) -> Optional[str]:
    """scheduler.pt is a scheduler's state; its rates against the optimizer's `groups` (when they were read)."""
    scheduler_path = folder / "scheduler.pt"
    scheduler = _load(scheduler_path, lambda s: isinstance(s, dict) and "last_epoch" in s,
                      "no last_epoch: not a learning-rate scheduler's state_dict")
    rates = scheduler.get("base_lrs")
    if groups is not None and isinstance(rates, list) and len(rates) != len(groups):
        return (f"{scheduler_path} schedules {len(rates)} parameter group(s) and {folder / 'optimizer.pt'} holds "
                f"{len(groups)}: the two come from different runs. {_fix(folder)}")
    return None


def _rng_problem(folder: Path) -> Optional[str]:
    """Each rng_state*.pth (one a process) holds the parts transformers puts back."""
    for path in sorted(folder.glob("rng_state*.pth")):
        _load(path, lambda rng: isinstance(rng, dict) and {"python", "numpy", "cpu"} <= set(rng),
              "not a random-number state (python, numpy, cpu)")
    return None
