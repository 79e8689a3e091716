"""How a run is launched, and how each launcher lays out a checkpoint's optimizer: the one table of layouts.

transformers 5.17 `Trainer._save_optimizer_and_scheduler` saves the optimizer one of three ways and reads it back
only the same way: `optimizer.pt` (plain, DDP); DeepSpeed's `latest` naming `global_stepN/` with each process's
`*optim_states.pt`; FSDP's `optimizer.bin` or `optimizer_0/` (accelerate 1.16 `save_fsdp_optimizer`; `.metadata`
written last). `scheduler.pt` is beside each, except under a DeepSpeed config with an `optimizer` or `scheduler`
section (`is_deepspeed_custom_scheduler`). No torch here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

_TRUE = ("y", "yes", "t", "true", "on", "1")  # transformers' strtobool, which reads ACCELERATE_USE_DEEPSPEED


def _torch_optimizer(folder: Path) -> Optional[str]:
    return None if (folder / "optimizer.pt").is_file() else "optimizer.pt"


def _deepspeed_optimizer(folder: Path) -> Optional[str]:
    try:  # the tag folder `latest` names (DeepSpeed's `load_checkpoint` reads it)
        tag = (folder / "latest").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return "latest"
    if not (tag and Path(tag).name == tag and tag not in (".", "..") and (folder / tag).is_dir()):
        return "latest"  # naming no folder here
    return None if any((folder / tag).glob("*optim_states.pt")) else f"{tag}/*optim_states.pt"


def _fsdp_optimizer(folder: Path) -> Optional[str]:
    found = (folder / "optimizer.bin").is_file() or (folder / "optimizer_0" / ".metadata").is_file()
    return None if found else "optimizer.bin"


# The torch.save files a launcher writes in a sub-folder (DeepSpeed's default TorchCheckpointEngine), which the
# whole-checkpoint check (pipeline/run/checkpoints.py checkpoint_problem) reads as it reads the top-level ones.
# torch.distributed.checkpoint's optimizer_0/*.distcp are not zip archives: not listed.
NESTED_TORCH_FILES = ("global_step*/*.pt",)


@dataclass(frozen=True)
class Layout:
    """One launcher's checkpoint, as messages name it: a run launched so, a checkpoint saved so, what holds the
    optimizer, `missing(folder)` (the file missing there, or None), what a resume does without it (`without`) and
    how such a run is launched again (`launch`)."""
    launched: str
    saved_by: str
    holds: str
    missing: Callable[[Path], Optional[str]]
    without: str
    launch: str


# transformers loads optimizer.pt / FSDP's files only when scheduler.pt is there too, and skips both silently
_FRESH = "would start a fresh optimizer and learning-rate schedule at the checkpoint's step without saying so"
_TORCH_LAUNCH = ("grpo train without accelerate launch, or for several processes accelerate launch --config_file "
                 "configs/accelerate/ddp.yaml -m grpo_pipeline.pipeline train ...")
LAYOUTS: dict[str, Layout] = {
    "plain": Layout("as one process", "a plain or DDP run", "optimizer.pt", _torch_optimizer, _FRESH, _TORCH_LAUNCH),
    "ddp": Layout("as several processes (DDP)", "a plain or DDP run", "optimizer.pt", _torch_optimizer, _FRESH,
                  _TORCH_LAUNCH),
    "deepspeed": Layout("under DeepSpeed ZeRO", "DeepSpeed ZeRO", "`latest` and the global_stepN/*optim_states.pt "
                        "it names", _deepspeed_optimizer, "would fail after the model has loaded (transformers' "
                        "DeepSpeed resume finds nothing to load)", "accelerate launch --config_file "
                        "configs/accelerate/zero2.yaml (or zero3.yaml) -m grpo_pipeline.pipeline train ..."),
    "fsdp": Layout("under FSDP", "FSDP", "optimizer.bin or optimizer_0/", _fsdp_optimizer, _FRESH,
                   "accelerate launch with the FSDP config it was trained with, or the recipe's fsdp option"),
}


@dataclass(frozen=True)
class Launch:
    """How this run is launched: its processes, its layout (a key of LAYOUTS), whether scheduler.pt is written."""
    processes: int = 1
    layout: str = "plain"
    scheduler_file: bool = True


def _deepspeed_config(value: Any) -> dict:
    """The DeepSpeed config a recipe's `deepspeed` option or accelerate's config file names ({} unreadable)."""
    if isinstance(value, Mapping):
        return dict(value)
    try:
        loaded = json.loads(Path(str(value)).expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def this_launch(trl_options: Mapping[str, Any], processes: int, environ: Mapping[str, str] = os.environ) -> Launch:
    """The Launch of a run with TRL options `trl_options` and `processes` processes: DeepSpeed as transformers 5.17
    TrainingArguments decides it, FSDP as accelerate's Accelerator does, else DDP for several processes, plain for one.

    >>> this_launch({}, 1), this_launch({}, 4).layout, this_launch({"fsdp": "full_shard"}, 4).layout
    (Launch(processes=1, layout='plain', scheduler_file=True), 'ddp', 'fsdp')
    >>> this_launch({}, 8, {"ACCELERATE_USE_DEEPSPEED": "true"}).layout
    'deepspeed'
    >>> this_launch({"deepspeed": {"scheduler": {"type": "WarmupLR"}}}, 8).scheduler_file
    False
    """
    deepspeed = trl_options.get("deepspeed")
    if deepspeed or str(environ.get("ACCELERATE_USE_DEEPSPEED", "false")).lower() in _TRUE:
        config = _deepspeed_config(deepspeed or environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE") or {})
        return Launch(processes, "deepspeed", not ({"optimizer", "scheduler"} & set(config)))
    if trl_options.get("fsdp") or str(environ.get("ACCELERATE_USE_FSDP", "false")).lower() == "true":
        return Launch(processes, "fsdp")
    return Launch(processes, "ddp" if processes > 1 else "plain")


def held_layouts(folder: Path) -> list[str]:
    """The layouts (keys of LAYOUTS) whose optimizer `folder` holds, one a way of holding it."""
    found: dict[str, str] = {}
    for name, layout in LAYOUTS.items():
        if layout.missing(folder) is None:
            found.setdefault(layout.holds, name)
    return list(found.values())


def recorded_processes(folder: Path, launch: Any) -> Optional[int]:
    """How many processes trained the checkpoint in `folder`: `launch` (grpo_shape.json's record), else the random
    states `Trainer._save_rng_state` wrote (`rng_state.pth`, or one `rng_state_<rank>.pth` a process); else None."""
    if isinstance(launch, dict) and isinstance(launch.get("processes"), int):
        return launch["processes"]
    ranks = [path for path in folder.glob("rng_state_*.pth") if path.stem.removeprefix("rng_state_").isdigit()]
    return len(ranks) if ranks else 1 if (folder / "rng_state.pth").is_file() else None


def _processes(count: int) -> str:
    return f"{count} process" + ("" if count == 1 else "es")


def launch_mismatch(folder: Path, before: Optional[int], processes: int, per_device: int,
                    accumulation: int) -> Optional[str]:
    """Why resuming the checkpoint in `folder`, trained by `before` processes, with `processes` is refused, or None.
    Another count is another global batch, and a resume restores what was counted in it: the data position, each
    rank's random state (a rank without its rng_state_<rank>.pth starts afresh, silently), DeepSpeed's partitions."""
    if before is None or before == processes:
        return None
    again = ("run it without accelerate launch (or with accelerate launch --num_processes 1)" if before == 1 else
             f"launch it with accelerate launch --num_processes {before} (the processes of all machines together), "
             "as it was launched")
    batch = lambda count: per_device * accumulation * count  # noqa: E731
    return (f"{folder.name} in {folder.parent} was trained by {_processes(before)} (a global batch of "
            f"{batch(before)} completions: per_device_train_batch_size {per_device} x gradient_accumulation_steps "
            f"{accumulation} x {_processes(before)}), and this run has {_processes(processes)} (a global batch of "
            f"{batch(processes)}). A resume restores the data position counted in the old global batch and each "
            f"process's random state, so under another process count it would skip other rows and start some "
            f"processes' random state afresh. To resume, {again}; or start a fresh run: --resume never (the "
            f"earlier run is moved to previous/) or a new --output_dir.")
