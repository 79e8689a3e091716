"""Resuming: what a checkpoint was trained with, and whether a resume under the config may go on.

Each checkpoint holds `grpo_shape.json` (written by pipeline/run/checkpoints.py stage_checkpoint_saves): the
settings that shape the weights, and under "settings" those the checkpoint restores over the config or that shape
its schedule (`checkpoint_record`). `resume_mismatch` compares them with the config before anything loads: a
resume under another weight shape or another restored setting is refused, naming each field; `resume_changes` are
the schedule changes a resume applies (max_steps), said and recorded in summary.json. `load_every_adapter` and
`follow_the_rebuilt_schedule` make the Trainer's own checkpoint load restore what it would miss.
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
from grpo_pipeline.pipeline.config.fields import field_rules
from grpo_pipeline.pipeline.config.roles import trl_default
from grpo_pipeline.pipeline.config.validate import world_size
from grpo_pipeline.pipeline.run.launchers import Launch, launch_mismatch, recorded_processes, this_launch
from grpo_pipeline.env.kept import canonical, changed_inputs, columns_key
from grpo_pipeline.env.text import excerpt

SHAPE_NAME = "grpo_shape.json"


# The fields that decide the shape or meaning of a checkpoint's trained weights (role resume_shaping, declared on the
# fields): resuming under other values fails in peft's load_state_dict (size mismatch, after the model has loaded) or
# silently continues another model. Each is compared before anything loads.
WEIGHT_SHAPING_FIELDS = tuple(fields_with("resume_shaping"))


# The same fields as peft's adapter_config.json names them (checkpoints written before grpo_shape.json).
_ADAPTER_CONFIG_NAMES = {"r": "lora_r", "lora_alpha": "lora_alpha", "target_modules": "lora_target_modules",
                         "modules_to_save": "lora_modules_to_save"}


# The settings a checkpoint restores over the config on resume (role resume_restored, under TRL's names), so that a new
# value would not take effect, or would make the resumed run neither the old one nor a new one. transformers 5.17
# `Trainer._load_optimizer_and_scheduler` loads optimizer.pt (`Optimizer.load_state_dict` puts back each param group's
# lr, weight_decay, betas and eps; another optim's state does not fit) and scheduler.pt (`LambdaLR.load_state_dict`
# puts back base_lrs: the old learning_rate, under a lambda rebuilt for the new schedule: a mix of both);
# `Trainer.train` skips the batches of the steps done, counted in the new batch shape, of a sampler seeded by the new
# seed, while rng_state.pth puts back the old random state. A resume under other values is refused (resume_mismatch),
# each field named with its old value (our warmup_ratio reaches TRL as warmup_steps, and is named as the user set it:
# option_name).
RESTORED_SETTINGS = trl_names("resume_restored")


# The schedule settings a resume applies, and says it does (role resume_applied): the scheduler is rebuilt for the new
# number of steps (LambdaLR's state_dict keeps no arguments of transformers' schedule partials, only their position)
# and its rate at the restored step is the one trained with (follow_the_rebuilt_schedule), which is how a finished run
# is trained longer; max_grad_norm is read at every step.
APPLIED_SETTINGS = trl_names("resume_applied")
# (The three lists as the declarations stand at import; the checks below ask the config's own sections at the call.)


def load_every_adapter(trainer) -> Callable:
    """Make a checkpoint load restore the trained adapter also when the checkpoint holds more than one.

    peft's save_pretrained writes the "default" adapter at the checkpoint's top level and any other in a
    sub-folder. TRL's GRPOTrainer adds a frozen "ref" adapter when handed a PeftModel with beta != 0 (after the
    format warm-up); the pipeline removes it (pipeline/health/rollback.py base_model_reference: kl is measured
    against the base model on both backends, and Unsloth's patched trainer never adds it), so only checkpoints of
    runs from before that, or of a caller's own extra adapter, have a sub-folder such as `ref/`. transformers 5.17
    `Trainer._load_from_checkpoint` then loads only the sub-folders' adapters: the trained "default" weights are
    never restored, and a resumed run, a rollback or the final save of a finished run silently carries on from
    the weights in memory (the warm-up's, in a new process). Here the top-level adapter is loaded into the active
    one after that. Returns the replacement of `trainer._load_from_checkpoint` (pipeline/trainer/trl_internals.py
    installs it).
    """
    load = type(trainer)._load_from_checkpoint

    def load_with_top_level(resume_from_checkpoint, model=None):
        load(trainer, resume_from_checkpoint, model)
        target = model if model is not None else trainer.model
        folder = Path(resume_from_checkpoint)
        configs = getattr(target, "peft_config", None)
        if not isinstance(configs, dict) or len(configs) < 2 or not hasattr(target, "load_adapter"):
            return
        if not any((folder / name).is_file() for name in ("adapter_model.safetensors", "adapter_model.bin")):
            return
        active = target.active_adapters[0]
        if (folder / active).is_dir():
            return  # saved in a sub-folder of its own: transformers loaded it
        target.load_adapter(str(folder), active, is_trainable=True)
        target.set_adapter(active)

    return load_with_top_level


@contextlib.contextmanager
def plain_cpu_device(args):
    """`args.device` as `cpu` while a checkpoint's optimizer loads. Several CPU processes (gloo) train on
    accelerate's `cpu:<local rank>`, which transformers 5.17 passes to torch.load as map_location for a world size
    above 1, and torch 2.13 cannot restore a storage to `cpu:0` ("don't know how to restore data location"): every
    resume of a multi-process CPU run failed there. A GPU's `cuda:N` is left alone."""
    device = args.device
    if device.type != "cpu" or device.index is None:
        yield
        return
    args.__dict__["_setup_devices"] = type(device)("cpu")  # the cached_property behind args.device
    try:
        yield
    finally:
        args.__dict__["_setup_devices"] = device


def follow_the_rebuilt_schedule(trainer) -> Callable:
    """Make a resume train its first step at the rate of the schedule the Trainer built for this run.

    transformers 5.17 `Trainer._load_optimizer_and_scheduler` loads scheduler.pt into a LambdaLR rebuilt for the
    run's max_steps (its lambdas keep the new length: LambdaLR.state_dict saves no partial's arguments) but also
    puts back `_last_lr` and optimizer.pt's param-group `lr`: the rate the old schedule had for the next step.
    A run resumed with a larger max_steps (APPLIED_SETTINGS) then trained its first step at the old schedule's
    rate (0 at the end of a cosine) and only later followed the new one. Here, after the load, each group's rate
    is set to the rebuilt schedule's at the restored position (the same rate when nothing changed). Returns the
    replacement of `trainer._load_optimizer_and_scheduler` (pipeline/trainer/trl_internals.py installs it).
    """
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
    """What a checkpoint is compared by, read once from the recipe by `resume_key`: the weight shape (the fields
    declaring resume_shaping, normalised for comparison), the settings a checkpoint restores or a resume applies
    (`settings`, under TRL's names), the names of each of those two roles, the TRL options the user set (an option's
    name in a message: option_name), the training data's name, the base model as given, and how the run is launched
    (`launch`: its processes and the checkpoint layout it reads, pipeline/run/launchers.py)."""

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
    """The recipe's ResumeKey, for a run launched as it is now (pipeline/run/launchers.py this_launch: its
    processes as the batch arithmetic counts them, pipeline/config/validate.py world_size). The shape: lists
    sorted, None as an empty list, a local model folder made absolute. The settings: as trl.GRPOConfig is given
    them (pipeline/config trl_training_args, after resolve_optim), TRL's default for those not given; an option of
    ours TRL does not take, as set."""
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
    """What grpo_shape.json holds: the weight shape, under "settings" the resume settings, under "launch" the
    process layout (ResumeKey.launch), and under "data" what it was trained on (data_record of the prepared
    training rows)."""
    launch = {"processes": key.launch.processes, "global_batch": key.batch(key.launch.processes)[2]}
    return {**key.shape, "settings": dict(key.settings), "launch": launch,
            **({"data": data_record(key.dataset_name, dataset)} if dataset is not None else {})}


ROWS_PER_BATCH = 1000  # rows read at a time for the data fingerprint


def data_record(dataset_name: str, dataset: Any) -> dict[str, Any]:
    """The training data a checkpoint's data position counts: dataset_name, its prepared rows' number, and their
    fingerprint (the rows in order, every column, hashed: a file replaced, edited or cut to other rows differs)."""
    return {"dataset_name": dataset_name, "rows": len(dataset), "fingerprint": rows_fingerprint(dataset)}


def rows_fingerprint(dataset: Any) -> str:
    """`state_key(dataset.to_dict())` (the key checkpoints record), read ROWS_PER_BATCH rows of one column at a
    time (env/kept.py columns_key): every process computes it, and the whole data as Python objects and its JSON
    took 680 MiB more on each for 100 MB of text (200k rows; streamed: 94 MiB, the same key). Each batch is a
    slice of the Arrow table (no copy) as a Python list, JSON fields decoded as datasets 4.8's `to_dict` decodes
    them, so the values are `to_dict`'s. Not datasets' own `_fingerprint`: for data read from its cache files it
    hashes their modification times and the transforms applied (the same rows prepared again get another one; a
    transform it cannot hash, a random one), and older checkpoints' keys would no longer match."""
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
    try:
        saved = json.loads((Path(checkpoint) / SHAPE_NAME).read_text(encoding="utf-8")).get("data")
    except (OSError, ValueError, AttributeError):
        return None
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
    folder = Path(checkpoint)
    for name, rename in ((SHAPE_NAME, None), ("adapter_config.json", _ADAPTER_CONFIG_NAMES)):
        try:
            saved = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(saved, dict):
            continue
        if rename:
            saved = {ours: saved[theirs] for theirs, ours in rename.items() if theirs in saved}
        for key in ("lora_target_modules", "lora_modules_to_save"):
            if key in saved:
                value = saved[key]
                saved[key] = sorted([value] if isinstance(value, str) else (value or []))
        return saved
    return {}


def _record(checkpoint: str | Path) -> dict[str, Any]:
    """A checkpoint's grpo_shape.json ({} when it has none, or none readable)."""
    try:
        saved = json.loads((Path(checkpoint) / SHAPE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def recorded_settings(checkpoint: str | Path) -> dict[str, Any]:
    """The resume settings (ResumeKey.settings) a checkpoint was trained with (its grpo_shape.json); {} for one saved
    before they were recorded, whose settings are then not compared."""
    settings = _record(checkpoint).get("settings")
    return settings if isinstance(settings, dict) else {}


def _changed_settings(checkpoint: str | Path, wanted: dict[str, Any], names: tuple[str, ...]
                      ) -> dict[str, tuple[Any, Any]]:
    """{name: (recorded, wanted)} for the `names` (the settings of one role) that the checkpoint records and
    `wanted` (ResumeKey.settings) sets otherwise."""
    saved = recorded_settings(checkpoint)
    known = {name: saved[name] for name in names if name in saved and name in wanted}
    return {name: (saved[name], wanted[name]) for name in changed_inputs(known, {n: wanted[n] for n in known})}


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
    changed = _changed_settings(checkpoint, dict(key.settings), key.applied)
    return {name: [old, new] for name, (old, new) in changed.items()}


def resume_mismatch(checkpoint: str | Path, key: ResumeKey) -> Optional[str]:
    """Why resuming `checkpoint` under the run's `key` would load weights of another shape, run on settings the
    checkpoint restores over the new values (role resume_restored) or with another process count (another global
    batch: pipeline/run/launchers.py launch_mismatch), or None: what differs (old -> new) and the ways on. A
    ConfigError message for `resume` (exit 2)."""
    saved = recorded_shape(checkpoint)
    wanted = key.shape
    folder = Path(checkpoint)
    changed = [f"{name} {saved[name]!r} -> {wanted[name]!r}" for name in wanted
               if name in saved and saved[name] != wanted[name]]
    if changed:
        return (f"{folder.name} in {folder.parent} was trained with other weights: {'; '.join(changed)}. It cannot "
                f"be resumed under the new values. Train into a new folder (--output_dir NEW_FOLDER), or start this "
                f"one over with --resume never (its checkpoints are then replaced), or put the old values back.")
    restored = _changed_settings(checkpoint, dict(key.settings), key.restored)
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

