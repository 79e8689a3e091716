"""`grpo train`: the one training script.

    grpo train                                   # GPU: configs/qwen2.5-1.5b-gsm8k.yaml; no GPU: tiny CPU demo
    grpo train --config configs/qwen2.5-3b-gsm8k.yaml --learning_rate 1e-5
    grpo train --config my.yaml --resume never   # auto (default) | never | PATH
    grpo train --config my.yaml --check          # JSON: config, data, paths, packages, GPU; loads nothing

It reads top to bottom: config -> env check -> data -> model -> (format warm-up) -> eval before
-> trainer -> train -> save -> eval after -> plots + summary. Only model loading differs
between the Unsloth and plain backends (pipeline/backends/); everything else is one code path.

Exit codes: 0 done, 2 bad config or input, 3 stopped (a health rule, a failing reward), 130 interrupted
(resumable).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pipeline.backends import BackendChoice, choose_backend, load_backend
from pipeline.bootstrap import backend_choice, defaults_for
from pipeline.config import ConfigError, PipelineConfig, normalize_argv, parse_config, resolve_optim
from pipeline.errors import guarded

EXIT_OK, EXIT_BAD_INPUT, EXIT_HEALTH_STOP, EXIT_INTERRUPTED = 0, 2, 3, 130


@dataclass
class RunResult:
    output_dir: Path
    status: str  # completed | stopped | interrupted
    exit_code: int
    steps: int
    adapter_dir: Optional[Path] = None
    summary: dict[str, Any] = field(default_factory=dict)


def _print(msg: str) -> None:
    print(f"[grpo] {msg}", flush=True)


def _is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def run_training(cfg: PipelineConfig, choice: Optional[BackendChoice] = None,
                 callbacks: Optional[list] = None, resume_hint: str = "run it again (--resume auto)") -> RunResult:
    """Train with `cfg` and return where everything went. Raises ConfigError for bad config/input.

    `callbacks` are extra transformers TrainerCallbacks (e.g. a notebook's live plot); `resume_hint` is what
    an interrupted run prints to continue (`grpo train` passes the user's own command). A signal during
    training stops at the end of the step with a checkpoint (status "interrupted"); anywhere else it raises
    KeyboardInterrupt, which leaves nothing half-written, and the same call completes the run.
    """
    start = time.time()

    # ---------------------------------------------------------------- config + env check
    choice = choice or choose_backend(cfg.model.backend, cfg.model.fast_inference)
    if choice.name == "unsloth" and cfg.model.fast_inference and not choice.fast_inference:
        cfg = cfg.replace(fast_inference=False)  # auto found no vLLM: Unsloth without it (the reason says so)
    cfg, optim_note = resolve_optim(cfg)  # an 8-bit optimizer without bitsandbytes: adamw_torch, said below
    from pipeline.data.run_data import without_a_held_out_set
    from pipeline.preflight import run_checks

    cfg, eval_note = without_a_held_out_set(cfg)  # one training file: no eval, and a line saying how to add one
    if eval_note:
        _print(eval_note)

    # config (for the resolved backend), output_dir, packages, GPU (a GPU recipe is never trained on CPU by
    # accident), model, memory, data, resume: all before anything loads
    for check in run_checks(cfg, choice=choice):
        if check.name == "memory" and not check.message.startswith("not estimated"):
            _print(f"memory: {check.message}")  # the estimate, or the warning that it may not fit
    if "tensorboard" in cfg.grpo.reporters():
        from pipeline.preflight import tensorboard_hint

        _print(tensorboard_hint(cfg.grpo.output_dir))
    backend = load_backend(choice.name)
    # `grpo train` did this at start-up (pipeline/bootstrap.py); a Python caller gets it here (idempotent).
    backend.prepare_environment(cfg)
    _print(f"backend: {choice.name} ({choice.reason})")
    if optim_note:
        _print(optim_note)
    from pipeline.backends import on_cpu

    if cfg.lora.gradient_checkpointing and on_cpu():  # as build.py run_decided_args does: said, not dropped
        _print("gradient_checkpointing: off on the CPU (it trades compute for GPU memory; there is none to save here)")

    from env.paths import absolute_path
    from pipeline.run.lock import run_lock

    output_dir = absolute_path(cfg.grpo.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    from pipeline.errors import note_run_folder

    note_run_folder(output_dir)  # a crash from here on logs its traceback into output_dir/logs/
    if not _is_main_process():  # DDP ranks share rank 0's run folder; rank 0 holds the lock for all
        return _run_locked(cfg, choice, backend, output_dir, callbacks, start, resume_hint)
    with run_lock(output_dir):  # a second run into this folder is refused, naming this one
        return _run_locked(cfg, choice, backend, output_dir, callbacks, start, resume_hint)


def _run_locked(cfg: PipelineConfig, choice: BackendChoice, backend, output_dir: Path, callbacks, start: float,
                resume_hint: str):
    from env.paths import atomic_directory, previous_versions, snapshot
    from pipeline.infer.session import verify_trained_dir
    from pipeline.run import checkpoints
    from pipeline.run.checkpoints import (
        GracefulStop,
        checkpoint_step,
        remove_staging_leftovers,
        resolve_resume,
        save_checkpoint_now,
        set_aside_checkpoints_after,
        set_aside_previous_run,
        storage_errors_are_resumable,
    )
    from pipeline.trainer.build import build_trainer

    # ---------------------------------------------------------------- resume target (before anything loads)
    # (run_checks' resume check already refused a checkpoint of another weight shape: pipeline/preflight.py)
    if _is_main_process():
        remove_staging_leftovers(output_dir, log=_print)  # a killed save's temporary folders; we hold the lock
    resume_from = resolve_resume(cfg.grpo.resume, output_dir, log=_print)
    resume_step = checkpoint_step(resume_from) if resume_from else None
    if resume_from is None and _is_main_process():
        set_aside_previous_run(output_dir, log=_print)  # a fresh start: an earlier run's steps are not this one's
    # What lora/ and eval_before.json are now is all their writes at the end may replace (env.paths.publish): a
    # folder or file put there while the run trains is kept, and the run says so (exit 2) instead of deleting it.
    keep_fix = "Move it away (or copy it elsewhere), then run the same command again."
    adapter_seen = snapshot(output_dir / "lora", fix=keep_fix)
    eval_before_seen = snapshot(output_dir / "eval_before.json", fix=keep_fix)
    finish_only = False  # trained to max_steps already, a final file missing: write them, train no step
    if resume_from:
        finished = _finished_run(cfg, output_dir, resume_from)
        if isinstance(finished, RunResult):
            return finished
        finish_only = finished == "finish"
    # (a changed setting the checkpoint restores was refused by the resume check; these it applies, said here)
    resume_changes = checkpoints.resume_changes(resume_from, cfg) if resume_from and not finish_only else {}
    for name, (old, new) in resume_changes.items():
        rebuilt = "" if name == "max_grad_norm" else " (the learning-rate schedule is rebuilt for the new length)"
        _print(f"resuming with {name} {old!r} -> {new!r}: applied from step {resume_step} on{rebuilt}; summary.json "
               "records it")

    # ---------------------------------------------------------------- data (tokenizer only)
    from pipeline.data.report import accounting_line, prompt_line
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.data.run_data import prepare_run_data

    tokenizer = load_tokenizer(cfg.model.model_name_or_path, cfg.model.trust_remote_code, cfg.model.model_source)
    # The same preparing as the data check's (train, eval set, warm-up needs); its cache makes this a load.
    run_data = prepare_run_data(cfg, tokenizer, report_dir=output_dir)
    prepared, eval_rows = run_data.train, run_data.eval_rows
    _print(f"data: {len(prepared.dataset)} prompts, max_prompt_length={prepared.max_prompt_length}, "
           f"max_completion_length={prepared.max_completion_length} (report: {prepared.report_path})")
    _print(f"data: {accounting_line(prepared.report)}")
    _print(f"prompts: {prompt_line(prepared.report)}")
    from pipeline.infer.evaluate import evaluate_rows

    # ---------------------------------------------------------------- model
    model, tokenizer = backend.load_for_training(cfg)
    peft_config = backend.peft_config(cfg)
    from pipeline.run.manifest import build_manifest, write_adapter_metadata, write_manifest

    # What lora/ (and best_lora/) describe themselves with, so generate/eval/export use them as trained.
    manifest = build_manifest(
        cfg_dict=cfg.to_dict(), backend=choice.name, base_model=cfg.model.model_name_or_path,
        system_prompt=cfg.data.system_prompt, chat_template=getattr(tokenizer, "chat_template", None),
        max_prompt_length=prepared.max_prompt_length, max_completion_length=prepared.max_completion_length,
        data_fingerprint=prepared.fingerprint, adapter_dir=output_dir / "lora",
        prompt_format="standard" if prepared.report["prompt_format"]["standard"] else "conversational",
    )

    # ---------------------------------------------------------------- format warm-up (optional SFT)
    if cfg.health.sft_warmup_steps > 0:
        from pipeline.trainer.warmup import run_format_warmup

        model = run_format_warmup(model, tokenizer, cfg, prepared, peft_config, output_dir,
                                  reuse=cfg.grpo.resume != "never")
        if peft_config is not None:
            peft_config = None  # the warm-up already wrapped the model with this LoRA

    # ---------------------------------------------------------------- eval before
    eval_before = None
    if cfg.eval.eval_before and eval_rows:
        # Kept in the run folder: a resumed run reuses it rather than re-measure a model that has moved on, when
        # every input it was measured from is the same (pipeline/run/kept.py; the eval rows' content included).
        from pipeline.infer.evaluate import eval_before_inputs, load_eval_before, save_eval_before
        from pipeline.run.kept import state_key
        from pipeline.trainer.warmup import warmup_inputs

        warmup = state_key(warmup_inputs(cfg, prepared)) if cfg.health.sft_warmup_steps > 0 else None
        inputs = eval_before_inputs(cfg, choice.name, tokenizer, eval_rows, prepared.max_completion_length, warmup)
        eval_before = load_eval_before(output_dir, inputs, log=_print) if cfg.grpo.resume != "never" else None
        if eval_before is not None:
            _print(f"eval before GRPO: reusing {output_dir / 'eval_before.json'} (every input it was measured from "
                   "is the same: model, eval rows, limits, generation, scoring)")
        else:
            eval_before = evaluate_rows(backend.training_generator(model, tokenizer, cfg), tokenizer, eval_rows,
                                        cfg.data.system_prompt, prepared.max_completion_length)
            save_eval_before(output_dir, inputs, eval_before, seen=eval_before_seen)
        _print(f"eval before GRPO: accuracy {eval_before['accuracy']:.1%}, format {eval_before['format_rate']:.1%}")

    # ---------------------------------------------------------------- trainer
    periodic_eval = None
    if cfg.eval.eval_steps and eval_rows and _is_main_process():
        from pipeline.trainer.periodic_eval import build_periodic_eval

        periodic_eval = build_periodic_eval(cfg, backend, tokenizer, eval_rows, prepared.max_completion_length,
                                            output_dir, manifest, resume=resume_from is not None,
                                            backend_name=choice.name, log=_print)
    trainer, health = build_trainer(cfg, backend, model, tokenizer, prepared, peft_config, output_dir, resume_step,
                                    periodic_eval)
    for callback in callbacks or []:
        trainer.add_callback(callback)
    if _is_main_process():  # effective_config.json: every GRPOConfig field as the trainer runs it
        from pipeline.trainer.build import record_effective_config

        for line in record_effective_config(trainer, cfg, backend, model, prepared, output_dir):
            _print(f"effective config: {line}")

    # ---------------------------------------------------------------- train (resumable)
    from rewards.contract import RewardFailure

    rollbacks: list[dict[str, Any]] = []  # on_collapse: rollback (pipeline/health/rollback.py)
    earlier_warnings: list[str] = []
    reward_failure, kept = None, None
    while True:
        if resume_from and not finish_only:
            _print(f"resuming from {resume_from} (step {resume_step})")
        with GracefulStop() as stopper, storage_errors_are_resumable(trainer, output_dir):
            if finish_only:
                # Only the weights: Trainer.train(resume_from_checkpoint=) at max_steps would train one step more.
                from transformers.trainer_callback import TrainerState

                trainer._load_from_checkpoint(resume_from)  # as Trainer.train loads them (peft: load_adapter)
                trainer.state = TrainerState.load_from_json(str(Path(resume_from) / "trainer_state.json"))
            else:
                trainer.add_callback(stopper.callback())
                try:
                    trainer.train(resume_from_checkpoint=resume_from)
                except RewardFailure as err:  # a reward raised or broke its contract: stop, keep a checkpoint
                    trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)  # the bar
                    reward_failure, kept = err, save_checkpoint_now(trainer, output_dir)
        if finish_only or reward_failure or stopper.signal_name or health.rollback_to is None:
            break
        # A collapse with a healthy checkpoint before it: resume from there with a lower learning rate.
        from pipeline.health.rollback import ROLLBACK_EVENT, rollback_record
        from pipeline.run.log import log_event

        factor = cfg.health.rollback_lr_factor ** (len(rollbacks) + 1)
        resume_from, resume_step = str(health.rollback_to), checkpoint_step(health.rollback_to)
        rollbacks.append(rollback_record(len(rollbacks) + 1, health.stop_rule, health.stop_step, health.rollback_to,
                                         resume_step, cfg.grpo.learning_rate * factor, health.stop_reason))
        _print(f"{health.stop_reason} Learning rate x{factor:g}: {cfg.grpo.learning_rate * factor:.3g} (rollback "
               f"{len(rollbacks)} of max_rollbacks={cfg.health.max_rollbacks})")
        earlier_warnings += health.warnings
        if _is_main_process():
            set_aside_checkpoints_after(output_dir, resume_step, log=_print)  # the collapsed steps' checkpoints
        model, trainer = trainer.model, None  # the LoRA model carries on; the checkpoint restores its weights
        trainer, health = build_trainer(cfg, backend, model, tokenizer, prepared, None, output_dir, resume_step,
                                        periodic_eval, rollbacks_done=len(rollbacks))
        if _is_main_process():
            log_event(output_dir / "metrics.jsonl", resume_step, ROLLBACK_EVENT, rollbacks[-1])
        for callback in callbacks or []:
            trainer.add_callback(callback)
    steps = trainer.state.global_step

    status, exit_code, reason = "completed", EXIT_OK, None
    if reward_failure is not None:
        status, exit_code = "stopped", EXIT_HEALTH_STOP
        reason = f"Stopped at step {steps + 1}: {reward_failure}" + ("" if kept else " (no step had completed yet)")
    elif stopper.signal_name:
        status, exit_code, reason = "interrupted", EXIT_INTERRUPTED, f"{stopper.signal_name} received"
    elif health.stop_reason:
        status, exit_code, reason = "stopped", EXIT_HEALTH_STOP, health.stop_reason

    # ---------------------------------------------------------------- save (only a completed run gets lora/)
    adapter_dir = None
    eval_after = None
    if status == "completed" and _is_main_process():
        adapter_dir = output_dir / "lora"
        # A run is complete only once lora/, manifest.json and summary.json (written last) all exist: a kill
        # anywhere in between leaves a run that the same command finishes from its final checkpoint.
        with storage_errors_are_resumable(trainer, output_dir):
            with atomic_directory(adapter_dir, seen=adapter_seen) as staging:
                backend.save_adapter(trainer.model, tokenizer, staging)
                write_adapter_metadata(staging, manifest)  # usable when copied away from the run
            verify_trained_dir(adapter_dir)  # re-read what we wrote: a bad save fails here, not at inference
            for stale in previous_versions(adapter_dir):  # a copy an interrupted replace left
                shutil.rmtree(stale, ignore_errors=True)
            write_manifest(output_dir, manifest)
        # ------------------------------------------------------------ eval after
        if cfg.eval.eval_after and eval_rows:
            eval_after = evaluate_rows(backend.training_generator(trainer.model, tokenizer, cfg), tokenizer,
                                       eval_rows, cfg.data.system_prompt, prepared.max_completion_length)
            _print(f"eval after GRPO: accuracy {eval_after['accuracy']:.1%}, format {eval_after['format_rate']:.1%}")

    # ---------------------------------------------------------------- plots + summary
    summary: dict[str, Any] = {}
    if _is_main_process():
        from pipeline.run.plots import plot_settings
        from pipeline.run.summary import write_summary

        summary = write_summary(output_dir, status=status, reason=reason, steps=steps,
                                wall_time_s=time.time() - start, eval_before=eval_before, eval_after=eval_after,
                                warnings=[*earlier_warnings, *health.warnings], health=health.summary(),
                                plot_settings=plot_settings(cfg), resumed_from_step=resume_step,
                                best=periodic_eval.best.best if periodic_eval else None, rollbacks=rollbacks,
                                resume_changes=resume_changes)
        _print_where_everything_is(output_dir, status, reason, adapter_dir, cfg, resume_hint)
    return RunResult(output_dir, status, exit_code, steps, adapter_dir, summary)


def _finished_run(cfg: PipelineConfig, output_dir: Path, checkpoint: str) -> RunResult | str | None:
    """A run whose newest checkpoint reached max_steps and whose final files all exist: say so (exit 0)
    instead of training past it. None when there is training left; "finish" when a final file is missing
    (a kill during the final save): the run then loads that checkpoint, trains no step and writes them."""
    from pipeline.run.checkpoints import checkpoint_state

    state = checkpoint_state(checkpoint)
    step = int(state["global_step"])
    target = cfg.grpo.max_steps if cfg.grpo.max_steps > 0 else int(state.get("max_steps") or 0)
    if target <= 0 or step < target:
        return None
    missing, summary = _final_files_problem(output_dir, step)
    if missing:
        _print(f"{output_dir} has trained all {step} steps, but {missing}: finishing the run from {checkpoint} "
               "(no further training)")
        return "finish"
    saved = output_dir / "lora"
    _print(f"run already complete: {output_dir} has trained {step} of max_steps={target} steps; nothing to do.")
    _print(f"  to train longer: raise --max_steps (e.g. --max_steps {step * 2}); it resumes from step {step}")
    _print("  to start over:   --resume never (same folder) or a new --output_dir")
    _print(f"  result:          {saved}")
    return RunResult(output_dir, "completed", EXIT_OK, step, saved, summary)


def _final_files_problem(output_dir: Path, step: int) -> tuple[Optional[str], dict[str, Any]]:
    """(what is missing of a completed run's final files, or None; its summary). Complete means: lora/
    verifies, manifest.json reads, and summary.json (written last) says completed at this step."""
    import json

    from env.adapters import AdapterError
    from pipeline.infer.session import verify_trained_dir
    from pipeline.run.manifest import MANIFEST_NAME

    try:
        verify_trained_dir(output_dir / "lora")
    except AdapterError:
        return "lora/ is missing or incomplete", {}
    read: dict[str, Any] = {}
    for name in (MANIFEST_NAME, "summary.json"):
        try:
            read[name] = json.loads((output_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return f"{name} is missing or unreadable", {}
        if not isinstance(read[name], dict):
            return f"{name} is not a JSON object", {}
    summary = read["summary.json"]
    if summary.get("status") != "completed" or summary.get("steps") != step:
        return f"summary.json records status {summary.get('status')!r} at step {summary.get('steps')}", {}
    return None, summary


def _print_where_everything_is(output_dir: Path, status: str, reason: Optional[str], adapter_dir: Optional[Path],
                               cfg: PipelineConfig, resume_hint: str) -> None:
    _print(f"run {status}" + (f": {reason}" if reason else ""))
    from env.paths import shell_command

    if status == "interrupted":
        _print(f"resume with: {resume_hint}")
    if status == "stopped":
        _print(f"a checkpoint was kept in {shell_command(output_dir)}; see summary.json for the reason")
    best_dir = output_dir / "best_lora" if cfg.eval.eval_steps else None  # pipeline/trainer/periodic_eval.py
    for label, path in (("adapter", adapter_dir), ("best adapter", best_dir),
                        ("manifest", output_dir / "manifest.json"),
                        ("metrics", output_dir / "metrics.jsonl"), ("plots", output_dir / "plots"),
                        ("summary", output_dir / "summary.json"), ("data report", output_dir / "data_report.json")):
        if path is not None and path.exists():
            _print(f"  {label:<12} {shell_command(path)}")  # quoted as a shell word: it pastes back as printed
    if adapter_dir is not None:
        _print("next: " + shell_command("grpo", "generate", "--lora", adapter_dir, "--prompt", _example_question(cfg)))


def _example_question(cfg: PipelineConfig) -> str:
    from pipeline.demo.registry import example_question

    return example_question(cfg.data.dataset_name)


@guarded("train")
def main(argv: Optional[list[str]] = None) -> int:
    from pipeline.run.checkpoints import interrupts_raise, resume_command

    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    if "--check" in argv:
        return check_main([a for a in argv if a != "--check"])
    if any(a in ("-h", "--help") for a in argv):
        return _print_help(argv)
    resume_hint = resume_command(argv)  # the user's own options, before any defaults are added
    # `grpo` already prepared this backend before importing this module (pipeline/bootstrap.py). Bad input
    # raises (ConfigError, DataFileError, ...): pipeline.errors prints its one message, exit 2.
    try:
        with interrupts_raise():  # Ctrl-C or SIGTERM in any phase: exit 130 with the command that continues
            choice = backend_choice(argv)
            argv, base, note = defaults_for(argv, choice)
            if note:
                _print(note)
            return run_training(parse_config(argv, base=base), choice, resume_hint=resume_hint).exit_code
    except KeyboardInterrupt as stop:
        print(f"\n[grpo] interrupted ({stop or 'SIGINT'}); what was saved is kept and nothing is half-written.\n"
              f"[grpo] resume with: {resume_hint}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def _print_help(argv: list[str]) -> int:
    """`grpo train --help`, with --config listed and the defaults that apply on this machine shown."""
    import argparse

    import yaml
    from trl import TrlParser

    from pipeline.config import SECTIONS

    try:
        choice = backend_choice(argv)
        argv, base, _ = defaults_for([a for a in argv if a not in ("-h", "--help")], choice)
    except ConfigError:
        base, argv = None, []
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        recipe = Path(argv[argv.index("--config") + 1])
        source = f"the recipe {recipe}"
        try:  # the recipe over the defaults the run puts below it (a built-in model's own)
            base = {**(base or {}), **(yaml.safe_load(recipe.read_text(encoding="utf-8")) or {})}
        except (OSError, yaml.YAMLError):
            base, source = None, "the built-in field defaults (the recipe could not be read)"
    else:
        source = "the built-in tiny CPU demo (no GPU here and no --config)"
    from pipeline.config.trl_fields import trl_section

    # Ours by section, then every field of TRL's GRPOConfig/TrainingArguments no section of ours owns (derived
    # from the installed trl, pipeline/config/trl_fields.py), under TRL's names, types and defaults.
    parser = TrlParser((*SECTIONS, trl_section()), prog="grpo train", description=__doc__.split("\n\n")[0],
                       epilog=f"Defaults shown: {source}. Each option overrides the recipe's value.")
    parser.add_argument("--config", metavar="YAML",
                        help="a YAML recipe whose keys are the options below (e.g. configs/qwen2.5-3b-gsm8k.yaml); "
                             "without it: configs/qwen2.5-1.5b-gsm8k.yaml on a GPU, the tiny CPU demo elsewhere")
    parser.add_argument("--check", action="store_true",
                        help="run every check a run makes before loading the model (config, trl, output_dir, "
                             "packages, gpu, model, data, resume, rewards, lora), print them as JSON and stop: exit 0 "
                             "when all pass, 2 otherwise")
    for action in parser._actions:  # HfArgumentParser's --no_X flags would show their own store_false default
        if any(option.startswith("--no_") for option in action.option_strings):
            action.help, action.default = f"set {action.dest} to false", argparse.SUPPRESS
    if isinstance(base, dict):
        parser.set_defaults_with_config(**base)
    print(f"defaults shown below: {source}\n")
    parser.print_help()
    return EXIT_OK


def check_main(argv: list[str]) -> int:
    """`grpo train --check [options]`: run every pre-load check, print them as JSON, load nothing.

    stdout is one JSON object: {"ok": bool, "checks": [{"name", "ok", "message"}, ...]}. Exit 0 when all
    pass, 2 otherwise. Without --config the same defaults as a real run apply (GPU recipe or CPU demo).
    """
    import json

    from pipeline.data.run_data import without_a_held_out_set
    from pipeline.preflight import Check, as_json, run_checks

    try:
        argv, base, note = defaults_for(argv, backend_choice(argv))
        cfg, eval_note = without_a_held_out_set(parse_config(argv, base=base))
        for line in filter(None, (note, eval_note)):
            print(f"[grpo] {line}", file=sys.stderr)
        results = run_checks(cfg, stop_at_first=False)
    except ConfigError as err:
        results = [Check("config", False, str(err))]
    report = as_json(results)
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return EXIT_OK if report["ok"] else EXIT_BAD_INPUT
