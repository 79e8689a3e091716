"""`grpo train`: the one training script.

    grpo train                                   # GPU: configs/qwen2.5-1.5b-gsm8k.yaml; no GPU: tiny CPU demo
    grpo train --config configs/qwen2.5-3b-gsm8k.yaml --learning_rate 1e-5
    grpo train --config my.yaml --resume never   # auto (default) | never | PATH
    grpo train --config my.yaml --check          # JSON: config, data, paths, packages, GPU; loads nothing

Top to bottom: config -> check (the run's decisions) -> data -> model -> (format warm-up) -> eval before -> train ->
save -> eval after -> plots + summary. Only model loading differs between the backends (pipeline/backends/).

Exit codes: 0 done, 2 bad config or input, 3 stopped (a health rule, a failing reward), 130 interrupted (resumable).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

# Called through the module, looked up at each call: tests stand in for evaluate_rows, run_lock and manifest writers.
import grpo_pipeline.pipeline.infer.evaluate
import grpo_pipeline.pipeline.run.lock
import grpo_pipeline.pipeline.run.manifest
from grpo_pipeline.env.locations import absolute_path, snapshot
from grpo_pipeline.env.paths import atomic_directory, previous_versions, shell_command
from grpo_pipeline.env.text import say
from grpo_pipeline.pipeline.backends import BackendChoice, choose_backend, on_cpu
from grpo_pipeline.pipeline.bootstrap import backend_choice, defaults_for
from grpo_pipeline.pipeline.config import (
    SECTIONS,
    ConfigError,
    PipelineConfig,
    normalize_argv,
    parse_config,
    resolve_optim,
    trl_training_args,
)
from grpo_pipeline.pipeline.data.report import accounting_line, prompt_line
from grpo_pipeline.pipeline.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, guarded, note_run_folder
from grpo_pipeline.pipeline.infer.evaluate import eval_before_inputs, eval_inputs, headline, load_eval_before, save_eval_before
from grpo_pipeline.pipeline.infer.session import verify_trained_dir
from grpo_pipeline.pipeline.data.run_data import prepare_run_data, warmup_examples, without_a_held_out_set
from grpo_pipeline.pipeline.preflight import Check, run_checks, tensorboard_hint
from grpo_pipeline.pipeline.run.checkpoints import (checkpoint_step, remove_staging_leftovers, resolve_resume, save_checkpoint_now,
                                      set_aside_checkpoints_after, set_aside_previous_run, storage_errors_are_resumable)
from grpo_pipeline.pipeline.run.resume import other_data_note, resume_changes, resume_key
from grpo_pipeline.pipeline.run.stop import GracefulStop, interrupts_raise, resume_command
from grpo_pipeline.pipeline.run.finish import finished_run, print_where_everything_is, write_summary
from grpo_pipeline.env.kept import state_key
from grpo_pipeline.pipeline.run.manifest import build_manifest
from grpo_pipeline.pipeline.run.plots import plot_settings
from grpo_pipeline.pipeline.config.trl_fields import trl_section
from grpo_pipeline.pipeline.trainer.build import build_trainer, record_effective_config
from grpo_pipeline.pipeline.trainer.warmup import run_format_warmup, warmup_inputs
from grpo_pipeline.rewards.contract import RewardFailure, SignalInterrupt
from grpo_pipeline.rewards.worker import stop_workers

EXIT_OK, EXIT_HEALTH_STOP = 0, 3


def tell(msg: str) -> None:
    print(f"[grpo] {msg}", flush=True)


def is_main_process() -> bool:
    """Rank 0 (or a single process): the one that writes the run folder's shared files."""
    return int(os.environ.get("RANK", "0")) == 0


@dataclass
class RunResult:
    output_dir: Path
    status: str  # completed | stopped | interrupted
    exit_code: int
    steps: int
    adapter_dir: Optional[Path] = None
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class Run:
    """What the phases of one run share, filled in top to bottom; `decisions`: the check's RunDecisions
    (pipeline/run/decisions.py)."""
    cfg: PipelineConfig
    output_dir: Path
    callbacks: Optional[list]
    start: float
    resume_hint: str
    decisions: Any
    resume_from: Optional[str] = None
    resume_step: Optional[int] = None
    finish_only: bool = False  # trained to max_steps already, a final file missing: write them, train no step
    resume_changes: dict[str, Any] = field(default_factory=dict)
    adapter_seen: Any = None  # what lora/ and eval_before.json were at the start (env/locations.py snapshot)
    eval_before_seen: Any = None
    tokenizer: Any = None
    prepared: Any = None
    eval_rows: Any = None
    model: Any = None
    peft_config: Any = None
    manifest: dict[str, Any] = field(default_factory=dict)
    eval_before: Optional[dict[str, Any]] = None
    periodic_eval: Any = None
    trainer: Any = None
    health: Any = None
    rollbacks: list[dict[str, Any]] = field(default_factory=list)  # on_collapse: rollback (health/rollback.py)
    earlier_warnings: list[str] = field(default_factory=list)
    reward_failure: Optional[RewardFailure] = None
    kept: Optional[Path] = None
    signal_name: Optional[str] = None
    steps: int = 0
    status: str = "completed"  # completed | stopped | interrupted
    exit_code: int = EXIT_OK
    reason: Optional[str] = None
    adapter_dir: Optional[Path] = None
    eval_after: Optional[dict[str, Any]] = None


def run_training(cfg: PipelineConfig, choice: Optional[BackendChoice] = None,
                 callbacks: Optional[list] = None, resume_hint: str = "run it again (--resume auto)") -> RunResult:
    """Train with `cfg`; a ConfigError for bad config/input. `callbacks`: extra TrainerCallbacks; `resume_hint`: what
    an interrupted run prints. A signal while training stops after the step with a checkpoint ("interrupted");
    elsewhere it raises KeyboardInterrupt, nothing half-written, and the same call completes the run."""
    start = time.time()
    choice = choice or choose_backend(cfg.model.backend, cfg.model.fast_inference)
    if cfg.model.fast_inference and not choice.fast_inference:
        cfg = cfg.replace(fast_inference=False)  # auto found no vLLM: Unsloth without it (the reason says so)
    eval_off, eval_note = without_a_held_out_set(cfg)  # one training file: no eval; how to add one
    cfg, optim_note = resolve_optim(cfg.replace(**eval_off) if eval_off else cfg)  # adamw_8bit, no bitsandbytes...
    if eval_note:
        tell(eval_note)

    checks = run_checks(cfg, choice=choice)  # and the run's decisions, made there once (pipeline/run/decisions.py)
    for check in checks:
        if check.message.startswith("eval set") or check.name == "memory" and check.message[:13] != "not estimated":
            tell(check.message if check.name == "eval" else f"memory: {check.message}")  # rows dropped; the estimate
    if "tensorboard" in cfg.grpo.reporters():
        tell(tensorboard_hint(cfg.grpo.output_dir))
    # `grpo train` did this at start-up (pipeline/bootstrap.py); a Python caller gets it here (idempotent).
    checks.decisions.backend.prepare_environment(checks.decisions.config)
    tell(f"backend: {choice.name} ({choice.reason})")
    if optim_note:
        tell(optim_note)
    if cfg.lora.gradient_checkpointing and on_cpu():  # as build.py run_decided_args does: said, not dropped
        tell("gradient_checkpointing: off on the CPU (it trades compute for GPU memory; there is none to save here)")

    output_dir = absolute_path(cfg.grpo.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    note_run_folder(output_dir)  # a crash from here on logs its traceback into output_dir/logs/
    run = Run(cfg, output_dir, callbacks, start, resume_hint, checks.decisions)
    if not is_main_process():  # DDP ranks share rank 0's run folder; rank 0 holds the lock for all
        return _run_locked(run)
    with grpo_pipeline.pipeline.run.lock.run_lock(output_dir):  # a second run into this folder is refused, naming this one
        return _run_locked(run)


def _run_locked(run: Run) -> RunResult:
    """The phases of a run, in order. Only a completed run gets lora/ and an eval after."""
    done = _resume(run)
    if done is not None:
        return done
    _data(run)
    _model(run)
    _warm_up(run)
    _eval_before(run)
    _train(run)
    _outcome(run)
    if run.status == "completed" and is_main_process():
        _save(run)
        _eval_after(run)
    return _summary(run)


def _resume(run: Run) -> Optional[RunResult]:
    """Resume target, before anything loads; a run already complete returns its result here."""
    cfg, output_dir = run.cfg, run.output_dir
    if is_main_process():
        remove_staging_leftovers(output_dir, log=tell)  # a killed save's temporary folders; we hold the lock
    run.resume_from = resolve_resume(cfg.grpo.resume, output_dir, log=tell)
    run.resume_step = checkpoint_step(run.resume_from) if run.resume_from else None
    if run.resume_from is None and is_main_process():
        set_aside_previous_run(output_dir, log=tell)  # a fresh start: an earlier run's steps are not this one's
    # What their writes at the end may replace (env/paths.py publish): one put there meanwhile is kept (exit 2).
    keep_fix = "Move it away (or copy it elsewhere), then run the same command again."
    run.adapter_seen = snapshot(output_dir / "lora", fix=keep_fix)
    run.eval_before_seen = snapshot(output_dir / "eval_before.json", fix=keep_fix)
    if run.resume_from:
        finished = finished_run(cfg.grpo.max_steps, output_dir, run.resume_from)
        if finished is not None and finished.complete:
            return RunResult(output_dir, "completed", EXIT_OK, finished.step, finished.adapter_dir, finished.summary)
        run.finish_only = finished is not None
        if not run.finish_only:  # (a setting the checkpoint restores was refused by the check; these it applies)
            run.resume_changes = resume_changes(run.resume_from, resume_key(run.decisions.config))
    for name, (old, new) in run.resume_changes.items():
        rebuilt = "" if name == "max_grad_norm" else " (the learning-rate schedule is rebuilt for the new length)"
        tell(f"resuming with {name} {old!r} -> {new!r}: applied from step {run.resume_step} on{rebuilt}; "
               "summary.json records it")
    return None


def _data(run: Run) -> None:
    """Data, with the tokenizer only (the check's: loaded once a run)."""
    run.tokenizer = run.decisions.tokenizer
    # as the data check prepared it (a cache load); rank 0 writes the run folder's reports
    run_data = prepare_run_data(run.decisions.config, run.tokenizer, run.output_dir, is_main_process())
    prepared = run_data.train
    if run.resume_from and run.cfg.grpo.resume_other_data:  # (without it, the data check refused other data)
        note = other_data_note(run.resume_from, run.cfg.data.dataset_name, prepared.dataset)
        tell(note or "resume_other_data: the data is the same")
    run.prepared, run.eval_rows = prepared, run_data.eval_rows
    tell(f"data: {len(prepared.dataset)} prompts, max_prompt_length={prepared.max_prompt_length}, "
           f"max_completion_length={prepared.max_completion_length}"
           + (f" (report: {shell_command(prepared.report_path)})" if prepared.report_path else ""))
    tell(f"data: {accounting_line(prepared.report)}")
    tell(f"prompts: {prompt_line(prepared.report)}")


def _model(run: Run) -> None:
    """The model (the one step that differs between backends) and the manifest lora/ will carry."""
    cfg, decided = run.cfg, run.decisions
    run.model, run.tokenizer = decided.backend.load_for_training(decided.config, run.tokenizer)
    run.peft_config = decided.backend.peft_config(decided.config)
    run.manifest = build_manifest(
        cfg_dict=cfg.to_dict(), backend=decided.backend_name, base_model=cfg.model.model_name_or_path,
        system_prompt=cfg.data.system_prompt, chat_template=getattr(run.tokenizer, "chat_template", None),
        max_prompt_length=decided.limits.max_prompt_length, max_completion_length=decided.limits.max_completion_length,
        data_fingerprint=decided.data_key, adapter_dir=run.output_dir / "lora",
        formats=dict(decided.prompt_format),  # the system message the rows carried is the one recorded
    )


def _warm_up(run: Run) -> None:
    """The format warm-up (optional SFT, pipeline/trainer/warmup.py)."""
    cfg = run.decisions.config
    if cfg.health.sft_warmup_steps > 0:
        examples = warmup_examples(cfg, run.prepared)
        run.model = run_format_warmup(run.model, run.tokenizer, cfg, run.prepared, examples, run.decisions.agents.tools,
                                      run.peft_config, run.output_dir, reuse=run.cfg.grpo.resume != "never")
        run.peft_config = None  # the warm-up already wrapped the model with this LoRA


def _evaluate(run: Run, model) -> dict[str, Any]:
    evaluate, decided = grpo_pipeline.pipeline.infer.evaluate, run.decisions  # looked up at the call: tests stop runs there
    loop = evaluate.loop_settings(trl_training_args(decided.config), decided.limits.max_seq_length)  # as trained
    generator = decided.backend.training_generator(model, run.tokenizer, decided.config)
    scorer = evaluate.eval_scorer(decided.config, run.tokenizer)  # the run's rewards, called as TRL calls them
    return evaluate.evaluate_rows(generator, run.tokenizer, run.eval_rows, scorer,
                                  decided.limits.max_completion_length, agents=decided.agents, loop=loop)


def _eval_before(run: Run) -> None:
    cfg, output_dir = run.cfg, run.output_dir
    if not (cfg.eval.eval_before and run.eval_rows) or not is_main_process():  # one measure, one writer
        return
    # a resumed run reuses it, when every input it was measured from is the same (env/kept.py)
    warmup = state_key(warmup_inputs(cfg, run.prepared)) if cfg.health.sft_warmup_steps > 0 else None
    inputs = eval_before_inputs(run.decisions.eval_key, run.decisions.backend_name, run.tokenizer, run.eval_rows,
                                run.decisions.limits.max_completion_length, warmup)
    run.eval_before = load_eval_before(output_dir, inputs, log=tell) if cfg.grpo.resume != "never" else None
    if run.eval_before is not None:
        tell(f"eval before GRPO: reusing {output_dir / 'eval_before.json'} (all its inputs are the same)")
    else:
        run.eval_before = _evaluate(run, run.model)
        save_eval_before(output_dir, inputs, run.eval_before, seen=run.eval_before_seen)
    tell(f"eval before GRPO: {headline(run.eval_before)}")


def _train(run: Run) -> None:
    """The trainer, then training (resumable), with the rollback loop (on_collapse: rollback, `_roll_back`)."""
    cfg, decided, limits = run.cfg, run.decisions, run.decisions.limits
    if cfg.eval.eval_steps and run.eval_rows and is_main_process():
        from grpo_pipeline.pipeline.infer.periodic_eval import build_periodic_eval  # lazy: imports transformers (torch)

        inputs = eval_inputs(decided.eval_key, decided.backend_name, run.tokenizer, run.eval_rows,
                             limits.max_completion_length)
        run.periodic_eval = build_periodic_eval(cfg.eval.eval_steps, lambda model: _evaluate(run, model), decided.backend,
                                                run.tokenizer, inputs, run.output_dir, run.manifest,
                                                resume=run.resume_from is not None, log=tell)
    _build_trainer(run, run.peft_config)
    if is_main_process():  # effective_config.json: every GRPOConfig field as the trainer runs it
        for line in record_effective_config(run.trainer, decided.backend, decided.config,
                                            run.model, limits.max_completion_length, run.output_dir):
            tell(f"effective config: {line}")
    try:
        while True:
            _train_once(run)
            if run.finish_only or run.reward_failure or run.signal_name or run.health.rollback_to is None:
                break
            stop_workers()  # the collapsed trainer's reward workers; the rebuilt one forks its own
            _roll_back(run)
    finally:
        stop_workers()  # training is over: no reward worker outlives it (rewards/worker.py)


def _build_trainer(run: Run, peft_config, rollbacks_done: int = 0, previous: Any = None) -> None:
    decided = run.decisions
    run.trainer, run.health = build_trainer(decided.agents, decided.backend, decided.config,
                                            run.model, run.tokenizer, run.prepared, peft_config, run.output_dir,
                                            run.resume_step, run.periodic_eval, rollbacks_done=rollbacks_done,
                                            previous=previous)
    for callback in run.callbacks or []:
        run.trainer.add_callback(callback)


def _train_once(run: Run) -> None:
    """Train from run.resume_from (or only load it, for a run that has trained every step already)."""
    trainer = run.trainer
    if run.resume_from and not run.finish_only:
        tell(f"resuming from {run.resume_from} (step {run.resume_step})")
    with GracefulStop() as stopper, storage_errors_are_resumable(trainer, run.output_dir):
        if run.finish_only:
            # Only the weights: Trainer.train(resume_from_checkpoint=) at max_steps would train one step more.
            from transformers.trainer_callback import TrainerState  # lazy: transformers imports torch

            trainer._load_from_checkpoint(run.resume_from)  # as Trainer.train loads them (peft: load_adapter)
            trainer.state = TrainerState.load_from_json(str(Path(run.resume_from) / "trainer_state.json"))
        else:
            trainer.add_callback(stopper.callback())
            try:
                trainer.train(resume_from_checkpoint=run.resume_from)
            except RewardFailure as err:  # a reward raised or broke its contract: stop, keep a checkpoint
                trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)  # the bar
                run.reward_failure, run.kept = err, save_checkpoint_now(trainer, run.output_dir)
            except SignalInterrupt as again:  # a second signal (a hung reward): stop now, summary still written
                trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
                stopper.signal_name = f"{again} again (the step in progress was dropped; the newest checkpoint stays)"
    run.signal_name = stopper.signal_name


def _roll_back(run: Run) -> None:
    """A collapse with a healthy checkpoint before it: resume from there with a lower learning rate."""
    from grpo_pipeline.pipeline.health.rollback import ROLLBACK_EVENT, rollback_record  # lazy: imports transformers (torch)
    from grpo_pipeline.pipeline.run.log import log_event  # lazy: imports transformers (torch)

    cfg, health = run.cfg, run.health
    factor = cfg.health.rollback_lr_factor ** (len(run.rollbacks) + 1)
    run.resume_from, run.resume_step = str(health.rollback_to), checkpoint_step(health.rollback_to)
    run.rollbacks.append(rollback_record(len(run.rollbacks) + 1, health.stop_rule, health.stop_step,
                                         health.rollback_to, run.resume_step, cfg.grpo.learning_rate * factor,
                                         health.stop_reason))
    tell(f"{health.stop_reason} Learning rate x{factor:g}: {cfg.grpo.learning_rate * factor:.3g} (rollback "
           f"{len(run.rollbacks)} of max_rollbacks={cfg.health.max_rollbacks})")
    run.earlier_warnings += health.warnings
    if is_main_process():
        set_aside_checkpoints_after(run.output_dir, run.resume_step, log=tell)  # the collapsed steps' checkpoints
    # The LoRA model carries on (the checkpoint restores its weights), and so does a colocated vLLM engine.
    previous, run.model, run.trainer = run.trainer, run.trainer.model, None
    _build_trainer(run, None, rollbacks_done=len(run.rollbacks), previous=previous)
    if is_main_process():
        log_event(run.output_dir / "metrics.jsonl", run.resume_step, ROLLBACK_EVENT, run.rollbacks[-1])


def _outcome(run: Run) -> None:
    """How training ended: completed, stopped (a failing reward, a health rule) or interrupted (a signal)."""
    run.steps = run.trainer.state.global_step
    if run.reward_failure is not None:
        run.status, run.exit_code = "stopped", EXIT_HEALTH_STOP
        run.reason = (f"Stopped at step {run.steps + 1}: {run.reward_failure}"
                      + ("" if run.kept else " (no step had completed yet)"))
    elif run.signal_name:
        run.status, run.exit_code, run.reason = "interrupted", EXIT_INTERRUPTED, f"{run.signal_name} received"
    elif run.health.stop_reason:
        run.status, run.exit_code, run.reason = "stopped", EXIT_HEALTH_STOP, run.health.stop_reason


def _save(run: Run) -> None:
    """lora/ and manifest.json (only a completed run gets them)."""
    run.adapter_dir = adapter_dir = run.output_dir / "lora"
    # Complete only once summary.json (written last) exists too: after a kill, the same command finishes the run.
    with storage_errors_are_resumable(run.trainer, run.output_dir):
        with atomic_directory(adapter_dir, seen=run.adapter_seen) as staging:
            run.decisions.backend.save_adapter(run.trainer.model, run.tokenizer, staging)
            grpo_pipeline.pipeline.run.manifest.write_adapter_metadata(staging, run.manifest)  # usable when copied away
        verify_trained_dir(adapter_dir)  # re-read what we wrote: a bad save fails here, not at inference
        for stale in previous_versions(adapter_dir):  # a copy an interrupted replace left
            shutil.rmtree(stale, ignore_errors=True)
        grpo_pipeline.pipeline.run.manifest.write_manifest(run.output_dir, run.manifest)


def _eval_after(run: Run) -> None:
    if run.cfg.eval.eval_after and run.eval_rows:
        last = run.periodic_eval.last if run.periodic_eval else None
        if last is not None and last[0] == run.steps:  # eval_steps scored these final weights already, the same way
            run.eval_after = last[1]
            tell(f"eval after GRPO: {headline(run.eval_after)} (the eval at step {run.steps}: the same weights)")
            return
        run.eval_after = _evaluate(run, run.trainer.model)
        tell(f"eval after GRPO: {headline(run.eval_after)}")


def _summary(run: Run) -> RunResult:
    """Plots + summary.json (written last: a run is complete once it exists), and where everything is."""
    summary: dict[str, Any] = {}
    if is_main_process():
        health, periodic_eval, decided, cfg, g = run.health, run.periodic_eval, run.decisions, run.cfg, run.cfg.grpo
        summary = write_summary(run.output_dir, status=run.status, reason=run.reason, steps=run.steps,
                                wall_time_s=time.time() - run.start, eval_before=run.eval_before,
                                eval_after=run.eval_after, warnings=[*run.earlier_warnings, *health.warnings],
                                health=health.summary(), resumed_from_step=run.resume_step,
                                plot_settings=plot_settings(decided.rewards, decided.config.health),
                                draw_plots=g.plots,
                                best=periodic_eval.best.best if periodic_eval else None, rollbacks=run.rollbacks,
                                resume_changes=run.resume_changes)
        print_where_everything_is(run.output_dir, run.status, run.reason, run.adapter_dir, run.resume_hint,
                                  cfg.eval.eval_steps, cfg.data.dataset_name, g.tools, g.environment_factory)
    return RunResult(run.output_dir, run.status, run.exit_code, run.steps, run.adapter_dir, summary)


@guarded("train")
def main(argv: Optional[list[str]] = None) -> int:
    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    if "--check" in argv:
        return check_main([a for a in argv if a != "--check"])
    if any(a in ("-h", "--help") for a in argv):
        return print_help(argv)
    resume_hint = resume_command(argv)  # the user's own options, before any defaults are added
    try:
        with interrupts_raise():  # Ctrl-C or SIGTERM in any phase: exit 130 with the command that continues
            choice = backend_choice(argv)
            argv, base, note = defaults_for(argv, choice)
            if note:
                tell(note)
            return run_training(parse_config(argv, base=base), choice, resume_hint=resume_hint).exit_code
    except KeyboardInterrupt as stop:
        print(f"\n[grpo] interrupted ({stop or 'SIGINT'}); what was saved is kept and nothing is half-written.\n"
              f"[grpo] resume with: {resume_hint}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def print_help(argv: list[str]) -> int:
    """`grpo train --help`, with --config listed and the defaults that apply on this machine shown."""
    from trl import TrlParser  # lazy: trl imports torch; the help lists the installed trl's own fields

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
    # Ours by section, then the installed trl's fields no section of ours owns (pipeline/config/trl_fields.py).
    parser = TrlParser((*SECTIONS, trl_section()), prog="grpo train",
                       description="`grpo train`: the one training script.",
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
    return 0


def check_main(argv: list[str]) -> int:
    """`grpo train --check [options]`: every pre-load check as one JSON object on stdout, {"ok": bool, "checks":
    [{"name", "ok", "message"}, ...]}; exit 0 when all pass, 2 otherwise. Loads nothing."""
    try:
        argv, base, note = defaults_for(argv, backend_choice(argv))
        cfg = parse_config(argv, base=base)  # (run_checks turns evaluation off itself where nothing is held out)
        for line in filter(None, (note, without_a_held_out_set(cfg)[1])):
            print(f"[grpo] {line}", file=sys.stderr)
        results = run_checks(cfg, stop_at_first=False)
    except ConfigError as err:
        results = [Check("config", False, str(err))]
    report = {"ok": all(c.ok for c in results), "checks": [asdict(c) for c in results]}
    say(json.dumps(report, indent=2, ensure_ascii=False), sys.stdout)  # secrets masked (env/text.py printable)
    return EXIT_OK if report["ok"] else EXIT_BAD_INPUT
