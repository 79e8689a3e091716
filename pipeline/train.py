"""`grpo train`: the one training script.

    grpo train                                   # GPU: configs/qwen2.5-1.5b-gsm8k.yaml; no GPU: tiny CPU demo
    grpo train --config configs/qwen2.5-3b-gsm8k.yaml --learning_rate 1e-5
    grpo train --config my.yaml --resume never   # auto (default) | never | PATH
    grpo train --config my.yaml --check          # JSON: config, data, paths, packages, GPU; loads nothing

It reads top to bottom: config -> env check -> data -> model -> (format warm-up) -> eval before
-> trainer -> train -> save -> eval after -> plots + summary. Only model loading differs
between the Unsloth and plain backends (pipeline/backends/); everything else is one code path.

Exit codes: 0 done, 2 bad config or input, 3 stopped by a health rule, 130 interrupted (resumable).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pipeline.backends import BackendChoice, choose_backend, load_backend
from pipeline.bootstrap import backend_choice, defaults_for
from pipeline.config import ConfigError, PipelineConfig, normalize_argv, parse_config, resolve_optim

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
                 callbacks: Optional[list] = None) -> RunResult:
    """Train with `cfg` and return where everything went. Raises ConfigError for bad config/input.

    `callbacks` are extra transformers TrainerCallbacks (e.g. a notebook's live plot).
    """
    start = time.time()

    # ---------------------------------------------------------------- config + env check
    choice = choice or choose_backend(cfg.model.backend, cfg.model.fast_inference)
    if choice.name == "unsloth" and cfg.model.fast_inference and not choice.fast_inference:
        cfg = cfg.replace(fast_inference=False)  # auto found no vLLM: Unsloth without it (the reason says so)
    cfg, optim_note = resolve_optim(cfg)  # an 8-bit optimizer without bitsandbytes: adamw_torch, said below
    from pipeline.preflight import run_checks

    # config (for the resolved backend), output_dir, packages, GPU (a GPU recipe is never trained on CPU by
    # accident), model, data, resume: all before anything loads
    run_checks(cfg, choice=choice)
    if "tensorboard" in cfg.grpo.reporters():
        from pipeline.preflight import tensorboard_hint

        _print(tensorboard_hint(cfg.grpo.output_dir))
    backend = load_backend(choice.name)
    # `grpo train` did this at start-up (pipeline/bootstrap.py); a Python caller gets it here (idempotent).
    backend.prepare_environment(cfg)
    _print(f"backend: {choice.name} ({choice.reason})")
    if optim_note:
        _print(optim_note)

    from env.paths import absolute_path
    from pipeline.run.lock import run_lock

    output_dir = absolute_path(cfg.grpo.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if not _is_main_process():  # DDP ranks share rank 0's run folder; rank 0 holds the lock for all
        return _run_locked(cfg, choice, backend, output_dir, callbacks, start)
    with run_lock(output_dir):  # a second run into this folder is refused, naming this one
        return _run_locked(cfg, choice, backend, output_dir, callbacks, start)


def _run_locked(cfg: PipelineConfig, choice: BackendChoice, backend, output_dir: Path, callbacks, start: float):
    from env.paths import atomic_directory
    from pipeline.infer.session import verify_trained_dir
    from pipeline.run.checkpoints import GracefulStop, checkpoint_step, disk_full_is_resumable, resolve_resume
    from pipeline.trainer.build import build_trainer

    # ---------------------------------------------------------------- resume target (before anything loads)
    resume_from = resolve_resume(cfg.grpo.resume, output_dir, log=_print)
    resume_step = checkpoint_step(resume_from) if resume_from else None
    if resume_from:
        finished = _finished_run(cfg, output_dir, resume_from)
        if finished is not None:
            return finished

    # ---------------------------------------------------------------- data (tokenizer only)
    from pipeline.data.prepare import prepare_dataset
    from pipeline.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(cfg.model.model_name_or_path, cfg.model.trust_remote_code)
    prepared = prepare_dataset(cfg, tokenizer, report_dir=output_dir)
    _print(f"data: {len(prepared.dataset)} prompts, max_prompt_length={prepared.max_prompt_length}, "
           f"max_completion_length={prepared.max_completion_length} (report: {prepared.report_path})")
    from pipeline.infer.evaluate import evaluate_rows, load_eval_rows

    # Held-out rows are prepared now, so a bad eval source fails before the model loads.
    eval_rows = load_eval_rows(cfg, tokenizer) if (cfg.eval.eval_before or cfg.eval.eval_after) else []

    # ---------------------------------------------------------------- model
    model, tokenizer = backend.load_for_training(cfg)
    peft_config = backend.peft_config(cfg)

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
        # Kept in the run folder: a resumed run reuses it rather than re-measure a model that has moved on.
        from pipeline.infer.evaluate import eval_before_key, load_eval_before, save_eval_before

        key = eval_before_key(cfg, eval_rows, prepared.max_completion_length)
        eval_before = load_eval_before(output_dir, key) if cfg.grpo.resume != "never" else None
        if eval_before is not None:
            _print(f"eval before GRPO: reusing {output_dir / 'eval_before.json'} (same model, rows and limits)")
        else:
            eval_before = evaluate_rows(backend.training_generator(model, tokenizer, cfg), tokenizer, eval_rows,
                                        cfg.data.system_prompt, prepared.max_completion_length)
            save_eval_before(output_dir, key, eval_before)
        _print(f"eval before GRPO: accuracy {eval_before['accuracy']:.1%}, format {eval_before['format_rate']:.1%}")

    # ---------------------------------------------------------------- trainer
    trainer, health = build_trainer(cfg, backend, model, tokenizer, prepared, peft_config, output_dir, resume_step)
    for callback in callbacks or []:
        trainer.add_callback(callback)

    # ---------------------------------------------------------------- train (resumable)
    if resume_from:
        _print(f"resuming from {resume_from} (step {resume_step})")
    with GracefulStop() as stopper, disk_full_is_resumable(trainer, output_dir):
        trainer.add_callback(stopper.callback())
        trainer.train(resume_from_checkpoint=resume_from)
    steps = trainer.state.global_step

    status, exit_code, reason = "completed", EXIT_OK, None
    if stopper.signal_name:
        status, exit_code, reason = "interrupted", EXIT_INTERRUPTED, f"{stopper.signal_name} received"
    elif health.stop_reason:
        status, exit_code, reason = "stopped", EXIT_HEALTH_STOP, health.stop_reason

    # ---------------------------------------------------------------- save (only a completed run gets lora/)
    adapter_dir = None
    eval_after = None
    if status == "completed" and _is_main_process():
        adapter_dir = output_dir / "lora"
        from pipeline.run.manifest import build_manifest, write_adapter_metadata, write_manifest

        manifest = build_manifest(
            cfg_dict=cfg.to_dict(), backend=choice.name, base_model=cfg.model.model_name_or_path,
            system_prompt=cfg.data.system_prompt, chat_template=getattr(tokenizer, "chat_template", None),
            max_prompt_length=prepared.max_prompt_length, max_completion_length=prepared.max_completion_length,
            data_fingerprint=prepared.fingerprint, adapter_dir=adapter_dir,
        )
        with disk_full_is_resumable(trainer, output_dir), atomic_directory(adapter_dir) as staging:
            backend.save_adapter(trainer.model, tokenizer, staging)
            write_adapter_metadata(staging, manifest)  # the folder stays usable when copied away from the run
        verify_trained_dir(adapter_dir)  # re-read what we wrote: a bad save fails here, not at inference
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
                                warnings=list(health.warnings), health=health.summary(),
                                plot_settings=plot_settings(cfg))
        _print_where_everything_is(output_dir, status, reason, adapter_dir, cfg)
    return RunResult(output_dir, status, exit_code, steps, adapter_dir, summary)


def _finished_run(cfg: PipelineConfig, output_dir: Path, checkpoint: str) -> Optional[RunResult]:
    """A run whose newest checkpoint already reached max_steps: say so (exit 0) instead of training past it."""
    import json

    from pipeline.run.checkpoints import checkpoint_state

    state = checkpoint_state(checkpoint)
    step = int(state["global_step"])
    target = cfg.grpo.max_steps if cfg.grpo.max_steps > 0 else int(state.get("max_steps") or 0)
    if target <= 0 or step < target:
        return None
    saved = output_dir / "lora" if (output_dir / "lora").is_dir() else None
    _print(f"run already complete: {output_dir} has trained {step} of max_steps={target} steps; nothing to do.")
    _print(f"  to train longer: raise --max_steps (e.g. --max_steps {step * 2}); it resumes from step {step}")
    _print("  to start over:   --resume never (same folder) or a new --output_dir")
    _print(f"  result:          {saved}" if saved else f"  final checkpoint: {checkpoint}")
    summary_path = output_dir / "summary.json"
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
    except (OSError, ValueError):
        summary = {}
    return RunResult(output_dir, "completed", EXIT_OK, step, saved, summary)


def _print_where_everything_is(output_dir: Path, status: str, reason: Optional[str], adapter_dir: Optional[Path],
                               cfg: PipelineConfig) -> None:
    _print(f"run {status}" + (f": {reason}" if reason else ""))
    if status == "interrupted":
        _print(f"resume with: grpo train <same options> --output_dir {output_dir} --resume auto")
    if status == "stopped":
        _print(f"a checkpoint was kept in {output_dir}; see summary.json for the reason")
    for label, path in (("adapter", adapter_dir), ("manifest", output_dir / "manifest.json"),
                        ("metrics", output_dir / "metrics.jsonl"), ("plots", output_dir / "plots"),
                        ("summary", output_dir / "summary.json"), ("data report", output_dir / "data_report.json")):
        if path is not None and path.exists():
            _print(f"  {label:<12} {path}")
    if adapter_dir is not None:
        _print(f"next: grpo generate --lora {adapter_dir} --prompt '{_example_question(cfg)}'")


def _example_question(cfg: PipelineConfig) -> str:
    from pipeline.demo.registry import example_question

    return example_question(cfg.data.dataset_name)


def main(argv: Optional[list[str]] = None) -> int:
    from env.adapters import AdapterError
    from env.disk import DiskFullError
    from pipeline.data.prepare import DataError
    from pipeline.data.sources import DataFileError

    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    if "--check" in argv:
        return check_main([a for a in argv if a != "--check"])
    if any(a in ("-h", "--help") for a in argv):
        return _print_help(argv)
    try:
        # `grpo` already prepared this backend before importing this module (pipeline/bootstrap.py).
        choice = backend_choice(argv)
        argv, base, note = defaults_for(argv, choice)
        if note:
            _print(note)
        cfg = parse_config(argv, base=base)
        result = run_training(cfg, choice)
    except (ConfigError, FileNotFoundError, DataError, DataFileError, AdapterError, DiskFullError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return result.exit_code


def _print_help(argv: list[str]) -> int:
    """`grpo train --help`, with --config listed and the defaults that apply on this machine shown."""
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
        try:
            base = yaml.safe_load(recipe.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            base, source = None, "the built-in field defaults (the recipe could not be read)"
    else:
        source = "the built-in tiny CPU demo (no GPU here and no --config)"
    parser = TrlParser(SECTIONS, prog="grpo train", description=__doc__.split("\n\n")[0],
                       epilog=f"Defaults shown: {source}. Each option overrides the recipe's value.")
    parser.add_argument("--config", metavar="YAML",
                        help="a YAML recipe whose keys are the options below (e.g. configs/qwen2.5-3b-gsm8k.yaml); "
                             "without it: configs/qwen2.5-1.5b-gsm8k.yaml on a GPU, the tiny CPU demo elsewhere")
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

    from pipeline.preflight import Check, as_json, run_checks

    try:
        argv, base, note = defaults_for(argv, backend_choice(argv))
        if note:
            print(f"[grpo] {note}", file=sys.stderr)
        results = run_checks(parse_config(argv, base=base), stop_at_first=False)
    except ConfigError as err:
        results = [Check("config", False, str(err))]
    report = as_json(results)
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return EXIT_OK if report["ok"] else EXIT_BAD_INPUT
