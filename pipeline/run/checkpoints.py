"""Checkpoints: find the newest complete one, set broken ones aside (never delete), stop safely on a signal.

HF Trainer writes a checkpoint's files one after another and `trainer_state.json` last
(transformers 5.17 `Trainer._save_checkpoint`), so a checkpoint interrupted mid-save lacks it.
Presence is not enough: a disk that filled up or a copy that was cut short leaves files that exist
but are truncated, and `--resume auto` would crash on them every time. So each weights file's
safetensors header must describe bytes the file really has, and each torch-saved file (optimizer.pt,
scheduler.pt, rng_state*.pth, training_args.bin: torch.save writes a zip archive) must have an intact
zip directory whose members fit in the file. Both checks read a few KB, not the gigabytes.
A broken checkpoint is never deleted (it may hold the only copy of some state): we move it to
`output_dir/corrupt/` and say so.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from env.adapters import safetensors_problem
from env.paths import absolute_path

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors", "adapter_model.bin", "pytorch_model.bin",
                "model.safetensors.index.json")


@dataclass(frozen=True)
class CheckpointProblem:
    path: Path
    problem: str


def checkpoint_problem(path: Path) -> Optional[str]:
    """Why a checkpoint folder cannot be resumed from, or None when it is complete."""
    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        return "trainer_state.json is missing (the save was interrupted)"
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"trainer_state.json is unreadable ({type(err).__name__}: {err})"
    if not any((path / name).is_file() and (path / name).stat().st_size > 0 for name in WEIGHT_FILES):
        return f"no model weights ({' / '.join(WEIGHT_FILES[:2])})"
    for weights in sorted(path.glob("*.safetensors")):
        problem = safetensors_problem(weights)
        if problem:
            return problem
    for torch_file in sorted([*path.glob("*.pt"), *path.glob("*.pth"), *path.glob("*.bin")]):
        problem = torch_zip_problem(torch_file)
        if problem:
            return problem
    return None


def torch_zip_problem(path: Path) -> Optional[str]:
    """Why a torch.save file cannot be loaded, or None: checked through its zip directory, without torch.

    torch.save (since torch 1.6) writes a zip archive whose central directory sits at the end, so a
    truncated file has none and a damaged one lists members that run past the end of the file. This
    reads the directory only (a few KB), where `torch.load` would read the whole optimizer state.
    """
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


def set_aside_corrupt(output_dir: str | Path, log=print) -> list[CheckpointProblem]:
    """Move every incomplete checkpoint to output_dir/corrupt/ (kept for inspection) and report it."""
    moved = []
    for path in list_checkpoints(output_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            continue
        corrupt_dir = Path(output_dir) / "corrupt"
        corrupt_dir.mkdir(exist_ok=True)
        target = corrupt_dir / f"{path.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        shutil.move(str(path), str(target))
        log(f"[checkpoints] {path.name} is incomplete: {problem}. Moved to {target} (not deleted).")
        moved.append(CheckpointProblem(target, problem))
    return moved


def resolve_resume(resume: str, output_dir: str | Path, log=print) -> Optional[str]:
    """Turn `--resume auto|never|PATH` into the checkpoint path for `trainer.train(resume_from_checkpoint=...)`."""
    if resume == "never":
        return None
    if resume == "auto":
        set_aside_corrupt(output_dir, log=log)
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
    """A checkpoint's trainer_state.json (global_step, max_steps, log history...)."""
    return json.loads((Path(path) / "trainer_state.json").read_text(encoding="utf-8"))


def checkpoint_step(path: str | Path) -> int:
    """global_step recorded in a checkpoint."""
    return int(checkpoint_state(path)["global_step"])


class GracefulStop:
    """SIGINT/SIGTERM handler: the first signal asks the trainer to finish the step, save and stop.

    A second signal restores the default behaviour (an impatient Ctrl-C still works).
    Use as a context manager around `trainer.train()`, with `callback()` registered on the trainer.
    """

    def __init__(self) -> None:
        self.signal_name: Optional[str] = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 (signal handler signature)
        self.signal_name = signal.Signals(signum).name
        print(f"\n[grpo] {self.signal_name} received: finishing this step, saving a checkpoint, then stopping. "
              "Send it again to abort without saving.", flush=True)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __enter__(self) -> "GracefulStop":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. inside a notebook worker): no handler
                pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def callback(self):
        """A TrainerCallback that turns a received signal into save + stop at the end of the step."""
        from transformers import TrainerCallback

        stopper = self

        class _StopOnSignal(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if stopper.signal_name is not None:
                    control.should_save = True
                    control.should_training_stop = True
                return control

        return _StopOnSignal()


def save_checkpoint_now(trainer, output_dir: Path) -> Optional[Path]:
    """Write checkpoint-<global_step> outside the training loop (after a reward failure ended it mid-step).

    The failing step had not stepped the optimizer (TRL scores a generation batch before any backward), so
    the weights, optimizer and scheduler are those of the last completed step, and `--resume auto` continues
    there. Returns the folder (None at step 0: nothing trained yet). An existing complete one is kept.
    """
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
    """A TrainerCallback that gives each saved checkpoint's files the usual permissions.

    The Trainer writes checkpoints itself (not through env.paths.atomic_directory), and safetensors
    writes its weights 0600; see env.paths.normalize_file_modes.
    """
    from transformers import TrainerCallback

    from env.paths import normalize_file_modes

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


@contextlib.contextmanager
def disk_full_is_resumable(trainer, output_dir: Path):
    """Turn a full disk during a save into DiskFullError, and remove the half-written checkpoint so that
    `--resume auto` picks the newest complete one (atomic_directory already discards a half-written lora/)."""
    from env.disk import DiskFullError, is_disk_full

    try:
        yield
    except (OSError, RuntimeError) as err:
        if not is_disk_full(err):
            raise
        partial = output_dir / f"checkpoint-{trainer.state.global_step}"
        removed = ""
        if partial.is_dir() and checkpoint_problem(partial):
            shutil.rmtree(partial, ignore_errors=True)
            removed = f" The half-written {partial.name} was removed."
        raise DiskFullError(output_dir, save_size_estimate(trainer.model),
                            f"resume with the same command and --resume auto (it continues from the newest complete "
                            f"checkpoint in {output_dir}).{removed}") from None
