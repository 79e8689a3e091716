"""Resuming: what a checkpoint was trained with (its `grpo_shape.json`, `checkpoint_record`), and whether a resume
under the config may go on (`resume_mismatch`, before anything loads); `resume_changes` are the schedule changes a
resume applies. `load_every_adapter` and `follow_the_rebuilt_schedule` make the Trainer's own checkpoint load
restore what it would miss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional

from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.pipeline.config import SECTIONS, fields_with, resolve_optim, trl_names, trl_training_args
from grpo_pipeline.pipeline.config.field_help import field_rules
from grpo_pipeline.pipeline.config.roles import trl_default
from grpo_pipeline.pipeline.config.validate import world_size
from grpo_pipeline.pipeline.run.launchers import Launch, launch_mismatch, recorded_processes, this_launch
from grpo_pipeline.env.kept import canonical, changed_inputs, columns_key, read_record
from grpo_pipeline.env.text import excerpt

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


def option_name(trl_name: str, trl_options: Any) -> str:
    """The option a user sets for a TRL field: ours when one of our fields forwards under that name (warmup_ratio
    for warmup_steps) and the TRL option itself is not set (`trl_options`: those set), else the TRL name."""
    if trl_name in trl_options:
        return trl_name
    for section in SECTIONS:
        for f in dataclasses.fields(section):
            if field_rules(f).get("trl") == trl_name:
                return f.name
    return trl_name


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
    named = {option_name(name, key.trl_options): values for name, values in restored.items()}
    listed = "; ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in named.items())
    back = ", ".join(f"{name}: {json.dumps(old)}" for name, (old, new) in named.items())
    return (f"{folder.name} in {folder.parent} was trained with other optimiser, schedule or batch settings: "
            f"{listed}. A resume restores the checkpoint's optimizer.pt, scheduler.pt, random state and data "
            f"position, so the new values would not take effect (the learning rate, the optimiser's settings and "
            f"the step count stay the checkpoint's). Set them back ({back}), or start a fresh run: --resume never "
            f"(the earlier run is moved to previous/) or a new --output_dir. To train longer, change only max_steps.")

