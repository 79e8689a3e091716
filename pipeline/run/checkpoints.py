"""Checkpoints: save them whole, find the newest complete one, set broken ones and earlier runs aside (never delete).

A checkpoint is complete with trainer_state.json (transformers 5.17 writes it last), weights, and no truncated file
(a full disk or a cut copy leaves files that exist, and `--resume auto` would crash on them every time).
"""

from __future__ import annotations

import json
import re
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from grpo_pipeline.env.adapters import safetensors_problem
from grpo_pipeline.env.disk import storage_errors_named
from grpo_pipeline.env.file_modes import normalize_file_modes
from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.env.paths import atomic_write_json, publish_directory, staging_leftovers
from grpo_pipeline.env.secret_fields import masked
from grpo_pipeline.pipeline.run.launchers import NESTED_TORCH_FILES
from grpo_pipeline.pipeline.run.manifest import record_adapter_base
from grpo_pipeline.pipeline.run.resume import SHAPE_NAME, ResumeKey, checkpoint_record

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# Where a checkpoint is written before it is renamed into place (ours), and the staging folder older
# transformers versions used; both are left only by a killed save and are removed at the next start.
STAGING_RE = re.compile(r"^\.checkpoint-\d+\.staging$|^tmp-checkpoint-\d+$")
WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors", "adapter_model.bin", "pytorch_model.bin",
                "model.safetensors.index.json")


@dataclass(frozen=True)
class CheckpointProblem:
    path: Path
    problem: str


def checkpoint_problem(path: Path) -> Optional[str]:
    """Why a checkpoint folder cannot be resumed from, or None when it is complete."""
    if not (path / "trainer_state.json").is_file():
        return "trainer_state.json is missing (the save was interrupted)"
    try:
        checkpoint_step(path)
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"trainer_state.json is unreadable ({type(err).__name__}: {err})"
    if not any((path / name).is_file() and (path / name).stat().st_size > 0 for name in WEIGHT_FILES):
        return f"no model weights ({' / '.join(WEIGHT_FILES[:2])})"
    for weights in sorted(path.glob("*.safetensors")):
        problem = safetensors_problem(weights)
        if problem:
            return problem
    nested = [found for pattern in NESTED_TORCH_FILES for found in path.glob(pattern)]  # DeepSpeed's global_stepN/
    for torch_file in sorted([*path.glob("*.pt"), *path.glob("*.pth"), *path.glob("*.bin"), *nested]):
        problem = torch_zip_problem(torch_file)
        if problem:
            return problem
    return None


def torch_zip_problem(path: Path) -> Optional[str]:
    """Why a torch.save file cannot be loaded, or None: torch.save (since 1.6) writes a zip archive whose directory
    sits at the end, so a truncated file has none and a damaged one lists members past its end. Reads a few KB."""
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if member.header_offset + member.compress_size > size:
                    return f"{path.name} is truncated: member {member.filename} runs past the end ({size} bytes)"
    except zipfile.BadZipFile:
        return f"{path.name} is truncated or corrupt (no readable torch zip directory)"
    except OSError as err:
        return f"{path.name} cannot be read: {err}"
    return None


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """checkpoint-N folders in output_dir, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def complete_checkpoints(output_dir: str | Path, below_step: Optional[int] = None) -> list[Path]:
    """The complete checkpoint-N folders of output_dir, oldest first (broken ones skipped, not moved); with
    `below_step`, only those of an earlier step. For `--resume auto`, the resume check and a rollback."""
    return [path for path in list_checkpoints(output_dir)
            if checkpoint_problem(path) is None and (below_step is None or checkpoint_step(path) < below_step)]


# What a run leaves in its folder that describes one trajectory. A fresh start in a used folder moves these aside
# first: left in place, the old metrics would show in the new plots and `--resume auto` could pick an old
# checkpoint-N. Keyed caches of deterministic work stay (warmup/, eval_before.json, the data report), and logs/.
TRAJECTORY_FILES = ("metrics.jsonl", "summary.json", "manifest.json", "lora", "best_lora", "plots", "corrupt")
PREVIOUS_DIR = "previous"


def previous_run_entries(output_dir: str | Path) -> list[Path]:
    """What an earlier run left in output_dir that a fresh start moves aside (see TRAJECTORY_FILES); no side effect."""
    root = Path(output_dir)
    named = [root / name for name in TRAJECTORY_FILES if (root / name).exists() or (root / name).is_symlink()]
    return list_checkpoints(root) + named


def set_aside_previous_run(output_dir: str | Path, log=print) -> Optional[Path]:
    """Move an earlier run's trajectory to output_dir/previous/<time>/, and say so; None when there is none."""
    return _move_aside(previous_run_entries(output_dir), output_dir, "", log,
                       "a fresh start in a used folder: the earlier run's")


def set_aside_checkpoints_after(output_dir: str | Path, step: int, log=print) -> Optional[Path]:
    """A rollback to checkpoint-`step`: the later checkpoints (the collapsed trajectory, which a later `--resume
    auto` would pick) go to output_dir/previous/<time>-rollback/; None when there are none."""
    later = [path for path in list_checkpoints(output_dir) if int(path.name.removeprefix("checkpoint-")) > step]
    return _move_aside(later, output_dir, "-rollback", log, f"rolling back to checkpoint-{step}: the collapsed")


def set_aside_stale(path: Path, output_dir: str | Path, why: str, log=print) -> Optional[Path]:
    """Move one kept entry that no longer fits the run (`why`) to output_dir/previous/<time>-stale/; None when it
    is not there."""
    entries = [path] if path.exists() or path.is_symlink() else []
    return _move_aside(entries, output_dir, "-stale", log, f"{why}: the kept")


def _move_aside(entries: list[Path], output_dir: str | Path, suffix: str, log, said: str) -> Optional[Path]:
    if not entries:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S") + suffix
    target = Path(output_dir) / PREVIOUS_DIR / stamp
    number = 1
    while target.exists():
        number += 1
        target = Path(output_dir) / PREVIOUS_DIR / f"{stamp}-{number}"
    target.mkdir(parents=True)
    for entry in entries:
        entry.rename(target / entry.name)  # the same file system: a rename, nothing copied
    log(f"{said} {', '.join(e.name for e in entries)} moved to {target} (not deleted)")
    return target


def set_aside_corrupt(output_dir: str | Path, log=print) -> list[CheckpointProblem]:
    """Move every incomplete checkpoint to output_dir/corrupt/ (kept for inspection) and report it."""
    moved = []
    for path in list_checkpoints(output_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            continue
        target = Path(output_dir) / "corrupt" / f"{path.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        target.parent.mkdir(exist_ok=True)
        shutil.move(str(path), str(target))
        log(f"[checkpoints] {path.name} is incomplete: {problem}. Moved to {target} (not deleted).")
        moved.append(CheckpointProblem(target, problem))
    return moved


def resolve_resume(resume: str, output_dir: str | Path, log=print) -> Optional[str]:
    """Turn `--resume auto|never|PATH` into the checkpoint path for `trainer.train(resume_from_checkpoint=...)`."""
    if resume == "never":
        return None
    if resume == "auto":
        set_aside_corrupt(output_dir, log=log)  # what is left is complete
        complete = list_checkpoints(output_dir)
        return str(complete[-1].resolve()) if complete else None
    path = absolute_path(resume)
    if not path.is_dir():
        raise FileNotFoundError(f"--resume {resume!r}: no checkpoint folder at {path}. Use --resume auto to pick "
                                f"the newest complete checkpoint in {absolute_path(output_dir)}.")
    problem = checkpoint_problem(path)
    if problem:
        raise ValueError(f"--resume {path}: cannot resume from this checkpoint: {problem}.")
    return str(path)


def checkpoint_state(path: str | Path) -> dict[str, Any]:
    """A checkpoint's trainer_state.json (global_step, max_steps, log history...): its one reader."""
    return json.loads((Path(path) / "trainer_state.json").read_text(encoding="utf-8"))


def checkpoint_step(path: str | Path) -> int:
    return int(checkpoint_state(path)["global_step"])


def save_checkpoint_now(trainer, output_dir: Path) -> Optional[Path]:
    """Write checkpoint-<global_step> after a reward failure ended the loop mid-step (TRL scores a batch before any
    backward: the state is the last completed step's); the folder, None at step 0. A complete one is kept."""
    step = trainer.state.global_step
    if step <= 0:
        return None
    folder = output_dir / f"checkpoint-{step}"
    if folder.is_dir() and not checkpoint_problem(folder):
        return folder
    trainer._save_checkpoint(trainer.model, trial=None)  # transformers Trainer: model, optimizer, rng, state
    trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)  # file modes, as at any save
    return folder


def file_mode_callback():
    """A TrainerCallback that gives each saved checkpoint's files the usual permissions (safetensors writes its
    weights 0600; env/file_modes.py normalize_file_modes)."""
    from transformers import TrainerCallback  # lazy: transformers imports torch

    class _CheckpointFileModes(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                normalize_file_modes(Path(args.output_dir) / f"checkpoint-{state.global_step}")
            return control

    return _CheckpointFileModes()


def save_size_estimate(model) -> int:
    """Bytes one checkpoint takes: the trained weights in fp32 plus Adam's two moments (4 + 8 bytes a
    parameter), plus 10% for the scheduler, RNG and trainer state."""
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return int(trained * 12 * 1.1)


def storage_errors_are_resumable(trainer, output_dir: Path):
    """A storage failure (full disk, quota, read-only, I/O error) during any save in the block as one
    env/disk.py StorageError that says how to resume (every save is staged or atomic: nothing half-written)."""
    return storage_errors_named(output_dir, f"resume with the same command (--resume auto continues from the "
                                            f"newest complete checkpoint in {output_dir}).",
                                lambda: save_size_estimate(trainer.model))


def stage_checkpoint_saves(trainer, key: ResumeKey, dataset: Any = None) -> Callable:
    """The replacement of `trainer._save_checkpoint`: each checkpoint is written whole under a hidden name, then
    renamed. transformers writes `checkpoint-N/` in place, file after file, so a full disk or a kill mid-save left
    part of one. Here it writes into `.checkpoint-N.staging/checkpoint-N/` (`_get_output_dir` redirected for the
    call), grpo_shape.json (`key`, pipeline/run/resume.py; `dataset`: the training rows) is added, the folder is
    published (env/paths.py publish_directory) and the Trainer's rotation (save_total_limit) runs. On any failure
    the staging folder is removed; earlier checkpoints are untouched."""
    from transformers.trainer_utils import rotate_checkpoints  # lazy: transformers imports torch

    save = type(trainer)._save_checkpoint
    # its dataset_name's URL password masked (a file)
    shape = masked(checkpoint_record(key, dataset))

    def staged_save(model, trial):
        run_dir = Path(trainer._get_output_dir(trial=trial))
        name = f"checkpoint-{trainer.state.global_step}"
        staging = run_dir / f".{name}.staging"
        main = trainer.args.should_save  # every DDP rank writes its rng state; rank 0 publishes
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        trainer.accelerator.wait_for_everyone()  # before any rank writes its rng state into the staging folder
        trainer._get_output_dir = lambda trial=None: str(staging)
        try:
            save(trainer, model, trial)
            trainer.accelerator.wait_for_everyone()
            if main:
                atomic_write_json(staging / name / SHAPE_NAME, shape)
                record_adapter_base(staging / name, key.base_model)  # not the loaded model's folder
                publish_directory(staging / name, run_dir / name)
                rotate_checkpoints(str(run_dir), trainer.args.save_total_limit,
                                   trainer.state.best_model_checkpoint)
        finally:
            del trainer._get_output_dir
            if main:
                shutil.rmtree(staging, ignore_errors=True)

    return staged_save


def remove_staging_leftovers(output_dir: str | Path, log=print) -> list[Path]:
    """Delete what killed saves left in a run folder: checkpoint staging folders and atomic_directory's /
    atomic_write_text's hidden temporary copies. Call it holding the run lock (no save can be running)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = sorted({*staging_leftovers(root), *(p for p in root.iterdir() if STAGING_RE.match(p.name))})
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if found:
        log(f"[checkpoints] removed what an interrupted save left: {', '.join(p.name for p in found)}")
    return found


