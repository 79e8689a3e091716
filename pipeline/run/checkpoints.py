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

Our own saves never leave one: `stage_checkpoint_saves` has the Trainer write each checkpoint into a hidden
staging folder that is renamed into place once complete, with `grpo_shape.json` inside: the settings that shape
the weights, and under "settings" those the checkpoint restores over the config or that shape its schedule
(`checkpoint_record`). `resume_mismatch` compares them with the config before anything loads: a resume under
another weight shape or another restored setting is refused, naming each field; `resume_changes` are the
schedule changes a resume applies (max_steps), said and recorded in summary.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from env.paths import absolute_path, atomic_write_json, publish_directory
from pipeline.config import SECTIONS, resolve_optim, trl_training_args
from pipeline.config.fields import field_rules
from pipeline.run.kept import canonical, changed_inputs
from pipeline.run.manifest import record_adapter_base

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# Where a checkpoint is written before it is renamed into place (ours), and the staging folder older
# transformers versions used; both are left only by a killed save and are removed at the next start.
STAGING_RE = re.compile(r"^\.checkpoint-\d+\.staging$|^tmp-checkpoint-\d+$")
SHAPE_NAME = "grpo_shape.json"
# The fields that decide the shape or meaning of a checkpoint's trained weights: resuming under other values
# fails in peft's load_state_dict (size mismatch, after the model has loaded) or silently continues another
# model. Each is compared before anything loads.
WEIGHT_SHAPING_FIELDS = ("model_name_or_path", "lora_r", "lora_alpha", "lora_target_modules",
                         "lora_modules_to_save")
# The same fields as peft's adapter_config.json names them (checkpoints written before grpo_shape.json).
_ADAPTER_CONFIG_NAMES = {"r": "lora_r", "lora_alpha": "lora_alpha", "target_modules": "lora_target_modules",
                         "modules_to_save": "lora_modules_to_save"}
# The settings a checkpoint restores over the config on resume (under TRL's names), so that a new value would not
# take effect, or would make the resumed run neither the old one nor a new one. transformers 5.17
# `Trainer._load_optimizer_and_scheduler` loads optimizer.pt (`Optimizer.load_state_dict` puts back each param
# group's lr, weight_decay, betas and eps; another optim's state does not fit) and scheduler.pt
# (`LambdaLR.load_state_dict` puts back base_lrs: the old learning_rate, under a lambda rebuilt for the new
# schedule: a mix of both); `Trainer.train` skips the batches of the steps done, counted in the new batch shape,
# of a sampler seeded by the new seed, while rng_state.pth puts back the old random state. A resume under other
# values is refused (resume_mismatch), each field named with its old value (our warmup_ratio reaches TRL as
# warmup_steps, and is named as the user set it: option_name).
RESTORED_SETTINGS = ("learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "optim",
                     "optim_args", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
                     "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                     "generation_batch_size", "steps_per_generation", "num_iterations", "seed", "data_seed")
# The schedule settings a resume applies, and says it does: the scheduler is rebuilt for the new number of steps
# (LambdaLR's state_dict keeps no arguments of transformers' schedule partials, only their position) and its rate
# at the restored step is the one trained with (follow_the_rebuilt_schedule), which is how a finished run is
# trained longer; max_grad_norm is read at every step.
APPLIED_SETTINGS = ("max_steps", "num_train_epochs", "max_grad_norm")
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


def complete_checkpoints(output_dir: str | Path, below_step: Optional[int] = None) -> list[Path]:
    """The complete checkpoint-N folders of output_dir, oldest first; broken ones are skipped, not moved (that is
    set_aside_corrupt's job). With `below_step`, only those of an earlier step. The one reading of "which
    checkpoints could be resumed", for `--resume auto`, the resume check and a rollback."""
    return [path for path in list_checkpoints(output_dir)
            if checkpoint_problem(path) is None and (below_step is None or checkpoint_step(path) < below_step)]


# What a run leaves in its folder that describes one trajectory (its steps, its result). A fresh start in a used
# folder (--resume never, or no checkpoint to resume) moves these aside first: left in place, the earlier run's
# metrics.jsonl lines would show in the new plots, its later checkpoint-N would be what `--resume auto` picks
# after an interruption, and its lora/ and best_lora/ would sit beside a summary of another run. Keyed caches of
# deterministic work stay (warmup/ with warmup.json, eval_before.json, the data report), and so do logs/.
TRAJECTORY_FILES = ("metrics.jsonl", "summary.json", "manifest.json", "lora", "best_lora", "plots", "corrupt")
PREVIOUS_DIR = "previous"


def previous_run_entries(output_dir: str | Path) -> list[Path]:
    """What an earlier run left in output_dir that a fresh start moves aside (see TRAJECTORY_FILES); no side effect."""
    root = Path(output_dir)
    named = [root / name for name in TRAJECTORY_FILES if (root / name).exists() or (root / name).is_symlink()]
    return list_checkpoints(root) + named


def set_aside_previous_run(output_dir: str | Path, log=print) -> Optional[Path]:
    """Move an earlier run's trajectory (previous_run_entries) to output_dir/previous/<time>/, kept whole and
    said; None when there is none. Called under the run lock, before a fresh start writes anything."""
    return _move_aside(previous_run_entries(output_dir), output_dir, "", log,
                       "a fresh start in a used folder: the earlier run's")


def set_aside_checkpoints_after(output_dir: str | Path, step: int, log=print) -> Optional[Path]:
    """A rollback to checkpoint-`step`: the checkpoints after it hold the collapsed trajectory, which a later
    `--resume auto` (after a kill before the retrained steps are saved again) would otherwise resume. Moved to
    output_dir/previous/<time>-rollback/; None when there are none."""
    later = [path for path in list_checkpoints(output_dir) if int(CHECKPOINT_RE.match(path.name).group(1)) > step]
    return _move_aside(later, output_dir, "-rollback", log, f"rolling back to checkpoint-{step}: the collapsed")


def set_aside_stale(path: Path, output_dir: str | Path, why: str, log=print) -> Optional[Path]:
    """Move one kept entry of a run folder that no longer fits the run (`why`) to output_dir/previous/<time>-stale/,
    kept whole and said (a run's own output is never deleted); None when it is not there."""
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
        complete = complete_checkpoints(output_dir)
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
    """SIGINT/SIGTERM during training: the first signal asks the trainer to finish the step, save and stop.

    A second signal restores the handlers of `interrupts_raise` (an impatient Ctrl-C still stops at once,
    as a KeyboardInterrupt). Use as a context manager around `trainer.train()`, with `callback()` registered
    on the trainer; outside training (data, warm-up, eval, saves) `interrupts_raise` applies.
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


def _raise_interrupt(signum, frame) -> None:  # (the signal handler signature)
    # A SignalInterrupt, not a bare KeyboardInterrupt: the reward boundary (rewards/contract.py) lets a real signal
    # through and turns a KeyboardInterrupt that user code raised into a named reward failure.
    from rewards.contract import SignalInterrupt

    raise SignalInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def interrupts_raise():
    """SIGTERM as well as SIGINT raise KeyboardInterrupt inside the block (SIGTERM's default would end the
    process on the spot, skipping every cleanup). Whatever phase it lands in, the exception unwinds through
    the atomic saves (nothing half-written stays) to the command, which exits 130 with the resume command.
    A no-op outside the main thread, where Python allows no handlers."""
    previous = {}
    for sig, handler in ((signal.SIGINT, _raise_interrupt), (signal.SIGTERM, _raise_interrupt)):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def resume_command(argv: list[str]) -> str:
    """The command that continues an interrupted `grpo train` run: the user's own options, shell-quoted, with
    `--resume auto` in place of any --resume (a --resume never or a fixed checkpoint would start over or go back).

    >>> resume_command(["--config", "my recipe.yaml", "--resume", "never"])
    "grpo train --config 'my recipe.yaml' --resume auto"
    """
    import shlex

    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True
        elif not arg.startswith("--resume="):
            kept.append(arg)
    return shlex.join(["grpo", "train", *kept, "--resume", "auto"])


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


def storage_errors_are_resumable(trainer, output_dir: Path):
    """A storage failure (full disk, quota, read-only, I/O error) during any save in the block, whatever its
    class, as one env.disk.StorageError that says how to resume. Nothing half-written is left: checkpoints
    are staged (`stage_checkpoint_saves`), lora/ and warmup/ go through env.paths.atomic_directory."""
    from env.disk import storage_errors_named

    return storage_errors_named(output_dir, f"resume with the same command (--resume auto continues from the "
                                            f"newest complete checkpoint in {output_dir}).",
                                lambda: save_size_estimate(trainer.model))


def stage_checkpoint_saves(trainer, cfg) -> None:
    """Make every checkpoint save of `trainer` atomic: written whole under a hidden name, then renamed.

    transformers' `Trainer._save_checkpoint` writes `checkpoint-N/` in place, file after file (README.md and
    the adapter first, trainer_state.json last), so a full disk or a kill mid-save left a folder holding some
    of them. Here it writes into `.checkpoint-N.staging/checkpoint-N/` (its output folder is redirected
    through `_get_output_dir` for the call), `grpo_shape.json` is added, and the complete folder is published
    with env.paths.publish_directory; then the Trainer's rotation (save_total_limit) runs on the real folder.
    On any failure the staging folder is removed and the previous checkpoints are untouched. Set as an
    instance attribute, like build.py's model card: the class is whatever the backend left in trl.
    """
    from transformers.trainer_utils import rotate_checkpoints

    save = type(trainer)._save_checkpoint
    shape = checkpoint_record(cfg)

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
                record_adapter_base(staging / name, cfg.model.model_name_or_path)  # not the loaded model's folder
                publish_directory(staging / name, run_dir / name)
                rotate_checkpoints(str(run_dir), trainer.args.save_total_limit,
                                   trainer.state.best_model_checkpoint)
        finally:
            del trainer._get_output_dir
            if main:
                shutil.rmtree(staging, ignore_errors=True)

    trainer._save_checkpoint = staged_save


def load_every_adapter(trainer) -> None:
    """Make a checkpoint load restore the trained adapter also when the checkpoint holds more than one.

    peft's save_pretrained writes the "default" adapter at the checkpoint's top level and any other in a
    sub-folder. TRL's GRPOTrainer adds a frozen "ref" adapter when handed a PeftModel with beta != 0 (after the
    format warm-up); the pipeline removes it (pipeline/health/rollback.py base_model_reference: kl is measured
    against the base model on both backends, and Unsloth's patched trainer never adds it), so only checkpoints of
    runs from before that, or of a caller's own extra adapter, have a sub-folder such as `ref/`. transformers 5.17
    `Trainer._load_from_checkpoint` then loads only the sub-folders' adapters: the trained "default" weights are
    never restored, and a resumed run, a rollback or the final save of a finished run silently carries on from
    the weights in memory (the warm-up's, in a new process). Here the top-level adapter is loaded into the active
    one after that. Set as an instance attribute, as stage_checkpoint_saves does.
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

    trainer._load_from_checkpoint = load_with_top_level


def follow_the_rebuilt_schedule(trainer) -> None:
    """Make a resume train its first step at the rate of the schedule the Trainer built for this run.

    transformers 5.17 `Trainer._load_optimizer_and_scheduler` loads scheduler.pt into a LambdaLR rebuilt for the
    run's max_steps (its lambdas keep the new length: LambdaLR.state_dict saves no partial's arguments) but also
    puts back `_last_lr` and optimizer.pt's param-group `lr`: the rate the old schedule had for the next step.
    A run resumed with a larger max_steps (APPLIED_SETTINGS) then trained its first step at the old schedule's
    rate (0 at the end of a cosine) and only later followed the new one. Here, after the load, each group's rate
    is set to the rebuilt schedule's at the restored position (the same rate when nothing changed). Set as an
    instance attribute, as load_every_adapter does.
    """
    load = type(trainer)._load_optimizer_and_scheduler

    def load_then_follow(checkpoint):
        load(trainer, checkpoint)
        scheduler = getattr(trainer, "lr_scheduler", None)
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if checkpoint is None or not lambdas or trainer.optimizer is None:
            return
        rates = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, lambdas)]
        for group, rate in zip(trainer.optimizer.param_groups, rates):
            group["lr"] = rate
        scheduler._last_lr = rates

    trainer._load_optimizer_and_scheduler = load_then_follow


def remove_staging_leftovers(output_dir: str | Path, log=print) -> list[Path]:
    """Delete what killed saves left in a run folder: checkpoint staging folders and atomic_directory's /
    atomic_write_text's hidden temporary copies. Call it holding the run lock (no save can be running)."""
    from env.paths import staging_leftovers

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


def weight_shape(cfg) -> dict[str, Any]:
    """The WEIGHT_SHAPING_FIELDS of a config, normalised for comparison (module lists sorted, a local model
    folder made absolute)."""
    import os

    flat = cfg.to_dict()
    shape = {name: flat[name] for name in WEIGHT_SHAPING_FIELDS}
    for name in ("lora_target_modules", "lora_modules_to_save"):
        shape[name] = sorted(shape[name] or [])
    if os.path.exists(shape["model_name_or_path"]):
        shape["model_name_or_path"] = str(absolute_path(shape["model_name_or_path"]))
    return shape


def resume_settings(cfg) -> dict[str, Any]:
    """The RESTORED_SETTINGS and APPLIED_SETTINGS a run trains with, under TRL's names, as trl.GRPOConfig is
    given them (pipeline/config trl_training_args, after resolve_optim), TRL's default for those not given."""
    from pipeline.config.trl_fields import trl_fields  # imports trl (and torch): the run and --check load it anyway

    given = trl_training_args(resolve_optim(cfg)[0])
    defaults = trl_fields()
    settings: dict[str, Any] = {}
    for name in (*RESTORED_SETTINGS, *APPLIED_SETTINGS):
        if name in given:
            settings[name] = given[name]
        elif name in defaults:
            field = defaults[name]
            settings[name] = field.default_factory() if callable(field.default_factory) else field.default
    return canonical(settings)


def checkpoint_record(cfg) -> dict[str, Any]:
    """What grpo_shape.json holds: the weight shape, and under "settings" the resume_settings."""
    return {**weight_shape(cfg), "settings": resume_settings(cfg)}


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


def recorded_settings(checkpoint: str | Path) -> dict[str, Any]:
    """The resume_settings a checkpoint was trained with (its grpo_shape.json); {} for one saved before they were
    recorded, whose settings are then not compared."""
    try:
        saved = json.loads((Path(checkpoint) / SHAPE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    settings = saved.get("settings") if isinstance(saved, dict) else None
    return settings if isinstance(settings, dict) else {}


def _changed_settings(checkpoint: str | Path, cfg, names: tuple[str, ...]) -> dict[str, tuple[Any, Any]]:
    """{name: (recorded, wanted)} for the `names` the checkpoint records and the config sets otherwise."""
    saved, wanted = recorded_settings(checkpoint), resume_settings(cfg)
    known = {name: saved[name] for name in names if name in saved and name in wanted}
    return {name: (saved[name], wanted[name]) for name in changed_inputs(known, {n: wanted[n] for n in known})}


def option_name(trl_name: str, cfg) -> str:
    """The option a user sets for a TRL field: ours when one of our fields forwards under that name (warmup_ratio
    for warmup_steps) and the TRL option itself is not set, else the TRL name."""
    if trl_name in cfg.trl:
        return trl_name
    for section in SECTIONS:
        for f in dataclasses.fields(section):
            if field_rules(f).get("trl") == trl_name:
                return f.name
    return trl_name


def resume_changes(checkpoint: str | Path, cfg) -> dict[str, list[Any]]:
    """The APPLIED_SETTINGS a resume of `checkpoint` under `cfg` changes, {name: [old, new]}: the run applies
    them, says so, and summary.json records them."""
    return {name: [old, new] for name, (old, new) in _changed_settings(checkpoint, cfg, APPLIED_SETTINGS).items()}


def resume_mismatch(checkpoint: str | Path, cfg) -> Optional[str]:
    """Why resuming `checkpoint` under `cfg` would load weights of another shape or run on settings the checkpoint
    restores over the new values (RESTORED_SETTINGS), or None: the differing fields (old -> new) and the ways on.
    A ConfigError message for `resume` (exit 2)."""
    saved = recorded_shape(checkpoint)
    wanted = weight_shape(cfg)
    folder = Path(checkpoint)
    changed = [f"{name} {saved[name]!r} -> {wanted[name]!r}" for name in WEIGHT_SHAPING_FIELDS
               if name in saved and saved[name] != wanted[name]]
    if changed:
        return (f"{folder.name} in {folder.parent} was trained with other weights: {'; '.join(changed)}. It cannot "
                f"be resumed under the new values. Train into a new folder (--output_dir NEW_FOLDER), or start this "
                f"one over with --resume never (its checkpoints are then replaced), or put the old values back.")
    restored = _changed_settings(checkpoint, cfg, RESTORED_SETTINGS)
    if not restored:
        return None
    named = {option_name(name, cfg): values for name, values in restored.items()}
    listed = "; ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in named.items())
    back = ", ".join(f"{name}: {json.dumps(old)}" for name, (old, new) in named.items())
    return (f"{folder.name} in {folder.parent} was trained with other optimiser, schedule or batch settings: "
            f"{listed}. A resume restores the checkpoint's optimizer.pt, scheduler.pt, random state and data "
            f"position, so the new values would not take effect (the learning rate, the optimiser's settings and "
            f"the step count stay the checkpoint's). Set them back ({back}), or start a fresh run: --resume never "
            f"(the earlier run is moved to previous/) or a new --output_dir. To train longer, change only max_steps.")
