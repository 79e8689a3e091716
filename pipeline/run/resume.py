"""Resuming: what a checkpoint was trained with (its `grpo_shape.json`, `checkpoint_record`), and whether a resume
under the config may go on (`resume_mismatch`, before anything loads); `resume_changes` are the schedule changes a
resume applies. `load_every_adapter` and `follow_the_rebuilt_schedule` make the Trainer's own checkpoint load
restore what it would miss.

`contents_problem`: what the checkpoint's files hold, checked before anything loads. Another run's optimizer.pt ended
in "size of tensor a (16) must match (64)" mid-resume; a checkpoint without one resumed with a fresh optimizer,
silently. It reads every file a resume restores, as transformers 5.17's `_load_optimizer_and_scheduler` and
`_load_rng_state` do (torch.load, weights_only), and compares them with the LoRA settings, the base model and each
other, where this run's launcher keeps them (launchers.py LAYOUTS).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional

from huggingface_hub import try_to_load_from_cache
from safetensors import safe_open

from grpo_pipeline.env.adapters import AdapterError, verify_adapter_dir
from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.pipeline.config import SECTIONS, fields_with, resolve_optim, trl_names, trl_training_args
from grpo_pipeline.pipeline.config.fields import field_rules
from grpo_pipeline.pipeline.config.roles import trl_default
from grpo_pipeline.pipeline.config.validate import world_size
from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path
from grpo_pipeline.pipeline.run.launchers import (LAYOUTS, Launch, held_layouts, launch_mismatch, recorded_processes,
                                                  this_launch)
from grpo_pipeline.env.kept import canonical, changed_inputs, columns_key, read_record
from grpo_pipeline.env.text import excerpt, printable, shorten

SHAPE_NAME = "grpo_shape.json"


# The same fields as peft's adapter_config.json names them (checkpoints written before grpo_shape.json).
_ADAPTER_CONFIG_NAMES = {"r": "lora_r", "lora_alpha": "lora_alpha", "target_modules": "lora_target_modules",
                         "modules_to_save": "lora_modules_to_save"}


def load_every_adapter(trainer) -> Callable:
    """The replacement of `trainer._load_from_checkpoint`: also restores the trained adapter of a checkpoint holding
    more than one. peft saves the "default" adapter at the top level and any other in a sub-folder (TRL's "ref",
    in checkpoints from before pipeline/health/rollback.py base_model_reference, or a caller's own), and
    transformers 5.17 `Trainer._load_from_checkpoint` then loads only the sub-folders': a resume silently went on
    from the weights in memory. Here the top-level adapter is loaded into the active one after that."""
    load = type(trainer)._load_from_checkpoint

    def load_with_top_level(resume_from_checkpoint, model=None):
        load(trainer, resume_from_checkpoint, model)
        target = model if model is not None else trainer.model
        folder = Path(resume_from_checkpoint)
        configs = getattr(target, "peft_config", None)
        if (not isinstance(configs, dict) or len(configs) < 2 or not hasattr(target, "load_adapter")
                or not any((folder / name).is_file() for name in ("adapter_model.safetensors", "adapter_model.bin"))):
            return
        active = target.active_adapters[0]
        if not (folder / active).is_dir():  # a sub-folder of its own: transformers loaded it
            target.load_adapter(str(folder), active, is_trainable=True)
            target.set_adapter(active)

    return load_with_top_level


@contextlib.contextmanager
def plain_cpu_device(args):
    """`args.device` as `cpu` while a checkpoint's optimizer loads: several CPU processes train on accelerate's
    `cpu:<local rank>`, which transformers 5.17 passes to torch.load as map_location, and torch 2.13 cannot restore
    a storage to `cpu:0` ("don't know how to restore data location"). A GPU's `cuda:N` is left alone."""
    device = args.device
    if device.type == "cpu" and device.index is not None:
        args.__dict__["_setup_devices"] = type(device)("cpu")  # the cached_property behind args.device
    try:
        yield
    finally:
        args.__dict__["_setup_devices"] = device


def follow_the_rebuilt_schedule(trainer) -> Callable:
    """The replacement of `trainer._load_optimizer_and_scheduler`: a resume trains its first step at the rate of the
    schedule rebuilt for this run. transformers 5.17 loads scheduler.pt into a LambdaLR rebuilt for the new
    max_steps but also puts back `_last_lr` and each param group's `lr`: the old schedule's rate (0 at the end of a
    cosine). Here each group's rate is set to the rebuilt schedule's at the restored position."""
    load = type(trainer)._load_optimizer_and_scheduler

    def load_then_follow(checkpoint):
        with plain_cpu_device(trainer.args):
            load(trainer, checkpoint)
        scheduler = getattr(trainer, "lr_scheduler", None)
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if checkpoint is None or not lambdas or trainer.optimizer is None:
            return
        rates = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, lambdas)]
        for group, rate in zip(trainer.optimizer.param_groups, rates):
            group["lr"] = rate
        scheduler._last_lr = rates

    return load_then_follow


@dataclass(frozen=True)
class ResumeKey:
    """What a checkpoint is compared by (`resume_key`): the weight shape, the settings a checkpoint restores or a
    resume applies (TRL's names) and each role's names, the TRL options the user set, the data's name, the base
    model as given, and how the run is launched (pipeline/run/launchers.py)."""

    shape: Mapping[str, Any]
    settings: Mapping[str, Any]
    restored: tuple[str, ...]
    applied: tuple[str, ...]
    trl_options: tuple[str, ...]
    dataset_name: Any
    base_model: str
    launch: Launch = Launch()

    def batch(self, processes: int) -> tuple[int, int, int]:
        """per_device_train_batch_size, gradient_accumulation_steps and the global batch of `processes`."""
        per_device = self.settings.get("per_device_train_batch_size", 1)
        accumulation = self.settings.get("gradient_accumulation_steps", 1)
        return per_device, accumulation, per_device * accumulation * processes


def resume_key(cfg) -> ResumeKey:
    """The recipe's ResumeKey, for a run launched as it is now. The shape (role resume_shaping): the fields that shape
    the trained weights (under other values, peft's load_state_dict fails after the model has loaded, or another model
    goes on silently), module lists sorted, a local model folder made absolute. The settings, as trl.GRPOConfig is
    given them (after resolve_optim), else TRL's default: those a checkpoint restores over the config (role
    resume_restored: transformers 5.17 `Trainer._load_optimizer_and_scheduler` loads optimizer.pt, each group's lr,
    weight_decay, betas, eps, and scheduler.pt, LambdaLR's base_lrs under a lambda rebuilt for the new schedule;
    `Trainer.train` skips the steps done counted in the new batch shape, of a sampler seeded by the new seed, while
    rng_state.pth puts back the old random state), and the schedule settings a resume applies and says it does (role
    resume_applied: the scheduler is rebuilt for the new number of steps, LambdaLR keeping only the position, and
    followed, follow_the_rebuilt_schedule; max_grad_norm is read at every step)."""
    flat, sections = cfg.to_dict(), cfg.sections()
    shape = {name: flat[name] for name in fields_with("resume_shaping", sections)}
    for name in ("lora_target_modules", "lora_modules_to_save"):  # module lists: their order means nothing
        shape[name] = sorted(shape[name] or [])
    if os.path.exists(shape["model_name_or_path"]):
        shape["model_name_or_path"] = str(absolute_path(shape["model_name_or_path"]))
    given = {**flat, **trl_training_args(resolve_optim(cfg)[0])}
    restored, applied = tuple(trl_names("resume_restored", sections)), tuple(trl_names("resume_applied", sections))
    # TRL's default imports trl (and torch): the run and --check load it anyway
    settings = canonical({name: given[name] if name in given else trl_default(name) for name in (*restored, *applied)})
    return ResumeKey(MappingProxyType(shape), MappingProxyType(settings), restored, applied, tuple(cfg.trl),
                     cfg.data.dataset_name, cfg.model.model_name_or_path, this_launch(cfg.trl, world_size()))


def checkpoint_record(key: ResumeKey, dataset: Any = None) -> dict[str, Any]:
    """What grpo_shape.json holds: the weight shape, and the "settings", "launch" and "data" (data_record)."""
    launch = {"processes": key.launch.processes, "global_batch": key.batch(key.launch.processes)[2]}
    return {**key.shape, "settings": dict(key.settings), "launch": launch,
            **({"data": data_record(key.dataset_name, dataset)} if dataset is not None else {})}


ROWS_PER_BATCH = 1000  # rows read at a time for the data fingerprint


def data_record(dataset_name: str, dataset: Any) -> dict[str, Any]:
    """The training data a checkpoint's data position counts: dataset_name, its rows' number and fingerprint."""
    return {"dataset_name": dataset_name, "rows": len(dataset), "fingerprint": rows_fingerprint(dataset)}


def rows_fingerprint(dataset: Any) -> str:
    """`state_key(dataset.to_dict())`, streamed ROWS_PER_BATCH rows of one column at a time (env/kept.py
    columns_key): the whole data as Python objects took 680 MiB more on every process for 100 MB of text. JSON
    fields are decoded as datasets 4.8's `to_dict` decodes them. Not datasets' `_fingerprint`: it hashes cache
    files' modification times and the transforms applied, so the same rows prepared again would differ."""
    try:  # datasets >= 4.8 has a Json feature, whose fields to_dict decodes
        from datasets.utils.json import (  # lazy: only in datasets >= 4.8, which the pin allows but does not require
            get_json_field_paths_from_feature, json_decode_field)
        json_paths = list(get_json_field_paths_from_feature(dataset.features))
    except ImportError:
        json_paths = []

    def batches(name: str):
        column = dataset.select_columns([name]).with_format("arrow")
        decoded = [subpath for col, *subpath in json_paths if col == name]
        for start in range(0, len(column), ROWS_PER_BATCH):
            values = column[start:start + ROWS_PER_BATCH].column(0).to_pylist()
            for subpath in decoded:
                values = [json_decode_field(row, subpath) for row in values]
            yield values

    return columns_key(dataset.column_names, batches)


def data_change(checkpoint: str | Path, dataset_name: str, dataset: Any) -> Optional[str]:
    """What changed in the training data since `checkpoint` was saved (its recorded data_record against this run's
    rows), or None: the same rows, or a checkpoint saved before the data was recorded."""
    saved = _record(checkpoint).get("data")
    now = data_record(dataset_name, dataset)
    if not isinstance(saved, dict) or saved.get("fingerprint") == now["fingerprint"]:
        return None
    before = saved.get("dataset_name")
    name = "" if before == now["dataset_name"] else f" (it was {excerpt(before)})"
    rows = (f"{saved.get('rows')} rows then, {now['rows']} other rows now" if saved.get("rows") != now["rows"] else
            f"{now['rows']} rows then and now, with other content")
    return f"dataset_name {excerpt(now['dataset_name'])}{name} gives other training rows: {rows}"


def data_mismatch(checkpoint: str | Path, dataset_name: str, dataset: Any, resume_other_data: bool) -> Optional[str]:
    """Why resuming `checkpoint` on this data is refused (a ConfigError message for dataset_name, exit 2), or None:
    the same data, or resume_other_data set (then `other_data_note` says what the position means)."""
    change = data_change(checkpoint, dataset_name, dataset)
    if change is None or resume_other_data:
        return None
    folder = Path(checkpoint)
    return (f"{folder.name} in {folder.parent} was trained on other data: {change}. A resume restores the data "
            "position (how many batches of the shuffled rows were used), which on other rows is no position at all. "
            "Put the old data back, or start over (--resume never, or a new --output_dir), or pass "
            "--resume_other_data true to go on training on the new data from the checkpoint's step.")


def other_data_note(checkpoint: str | Path, dataset_name: str, dataset: Any) -> Optional[str]:
    """The line a run resumed with resume_other_data prints when the data did change, else None."""
    change = data_change(checkpoint, dataset_name, dataset)
    if change is None:
        return None
    return (f"resuming on other data (resume_other_data): {change}. The weights, optimizer and schedule go on from "
            f"{Path(checkpoint).name}; the data position skips as many batches of the new rows' shuffled order as "
            "were trained, so the rows that come next are not where the old data stopped, and some new rows are "
            "never seen in this epoch.")


def recorded_shape(checkpoint: str | Path) -> dict[str, Any]:
    """The weight-shaping settings a checkpoint was trained with: its grpo_shape.json, else (older
    checkpoints) what peft's adapter_config.json records of them; {} when neither can be read."""
    saved = read_record(Path(checkpoint) / SHAPE_NAME)
    if saved is None:
        config = read_record(Path(checkpoint) / "adapter_config.json") or {}
        saved = {ours: config[theirs] for theirs, ours in _ADAPTER_CONFIG_NAMES.items() if theirs in config}
    for key in ("lora_target_modules", "lora_modules_to_save"):
        if key in saved:
            value = saved[key]
            saved[key] = sorted([value] if isinstance(value, str) else (value or []))
    return saved


def _record(checkpoint: str | Path) -> dict[str, Any]:
    """A checkpoint's grpo_shape.json ({} when it has none, or none readable)."""
    return read_record(Path(checkpoint) / SHAPE_NAME) or {}


def _changed_settings(checkpoint: str | Path, wanted: Mapping[str, Any], names: tuple[str, ...]
                      ) -> dict[str, list[Any]]:
    """{name: [recorded, wanted]} for the `names` (one role's settings) that the checkpoint's grpo_shape.json records
    (one saved before settings were recorded: none) and `wanted` (ResumeKey.settings) sets otherwise."""
    saved = _record(checkpoint).get("settings")
    saved = saved if isinstance(saved, dict) else {}
    known = {name: saved[name] for name in names if name in saved and name in wanted}
    return {name: [saved[name], wanted[name]] for name in changed_inputs(known, {n: wanted[n] for n in known})}


def resume_changes(checkpoint: str | Path, key: ResumeKey) -> dict[str, list[Any]]:
    """The settings declaring resume_applied that a resume of `checkpoint` under the run's `key` changes,
    {name: [old, new]}: the run applies them, says so, and summary.json records them."""
    return _changed_settings(checkpoint, key.settings, key.applied)


def resume_mismatch(checkpoint: str | Path, key: ResumeKey) -> Optional[str]:
    """Why resuming `checkpoint` under the run's `key` is refused (a ConfigError message for `resume`, exit 2): weights
    of another shape, settings the checkpoint restores over the new values, or another process count
    (launchers.py launch_mismatch); None when it may go on."""
    saved = recorded_shape(checkpoint)
    wanted = key.shape
    folder = Path(checkpoint)
    changed = [f"{name} {saved[name]!r} -> {wanted[name]!r}" for name in wanted
               if name in saved and saved[name] != wanted[name]]
    if changed:
        return (f"{folder.name} in {folder.parent} was trained with other weights: {'; '.join(changed)}. It cannot "
                f"be resumed under the new values. Train into a new folder (--output_dir NEW_FOLDER), or start this "
                f"one over with --resume never (its checkpoints are then replaced), or put the old values back.")
    restored = _changed_settings(checkpoint, key.settings, key.restored)
    if not restored:
        before = recorded_processes(folder, _record(folder).get("launch"))
        return launch_mismatch(folder, before, key.launch.processes, *key.batch(1)[:2])
    # each by the option a user sets: ours where one of our fields forwards under its name (warmup_ratio for
    # warmup_steps) and the TRL option itself is not set, else the TRL name
    ours = {field_rules(f).get("trl"): f.name for section in SECTIONS for f in dataclasses.fields(section)}
    named = {name if name in key.trl_options else ours.get(name, name): values for name, values in restored.items()}
    listed = "; ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in named.items())
    back = ", ".join(f"{name}: {json.dumps(old)}" for name, (old, new) in named.items())
    return (f"{folder.name} in {folder.parent} was trained with other optimiser, schedule or batch settings: "
            f"{listed}. A resume restores the checkpoint's optimizer.pt, scheduler.pt, random state and data "
            f"position, so the new values would not take effect (the learning rate, the optimiser's settings and "
            f"the step count stay the checkpoint's). Set them back ({back}), or start a fresh run: --resume never "
            f"(the earlier run is moved to previous/) or a new --output_dir. To train longer, change only max_steps.")


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
