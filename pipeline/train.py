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

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pipeline.backends import BackendChoice, choose_backend, load_backend
from pipeline.config import ConfigError, PipelineConfig, from_mapping, normalize_argv, parse_config, peek_option

# Repo-relative recipes; `grpo train` with no --config on a GPU uses this one.
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GPU_RECIPE = REPO_ROOT / "configs" / "qwen2.5-1.5b-gsm8k.yaml"

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
    from pipeline.preflight import run_checks

    # config (for the resolved backend), output_dir, packages, GPU (a GPU recipe is never trained on CPU by
    # accident), model, data, resume: all before anything loads
    run_checks(cfg, choice=choice)
    if "tensorboard" in cfg.grpo.report_to:
        from pipeline.preflight import tensorboard_hint

        _print(tensorboard_hint(cfg.grpo.output_dir))
    backend = load_backend(choice.name)
    if choice.name == "unsloth":
        backend.prepare_environment(cfg)  # UNSLOTH_VLLM_STANDBY + `import unsloth` before trl/transformers/peft
    _print(f"backend: {choice.name} ({choice.reason})")

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
    from pipeline.run.checkpoints import GracefulStop, checkpoint_step, resolve_resume
    from pipeline.infer.session import verify_trained_dir

    # ---------------------------------------------------------------- resume target (before anything loads)
    resume_from = resolve_resume(cfg.grpo.resume, output_dir, log=_print)
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
    trainer, health = build_trainer(cfg, backend, model, tokenizer, prepared, peft_config, output_dir)
    for callback in callbacks or []:
        trainer.add_callback(callback)

    # ---------------------------------------------------------------- train (resumable)
    if resume_from:
        _print(f"resuming from {resume_from} (step {checkpoint_step(resume_from)})")
        trainer.metrics_callback_for_resume(checkpoint_step(resume_from))
    with GracefulStop() as stopper, _disk_full_is_resumable(trainer, output_dir):
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
        # A LoRA goes to lora/; a full fine-tune (the tiny demo) is a whole model, so model/.
        adapter_dir = output_dir / ("model" if cfg.lora.full_finetune else "lora")
        from pipeline.run.manifest import build_manifest, write_adapter_metadata, write_manifest

        manifest = build_manifest(
            cfg_dict=cfg.to_dict(), backend=choice.name, base_model=cfg.model.model_name_or_path,
            system_prompt=cfg.data.system_prompt, chat_template=getattr(tokenizer, "chat_template", None),
            max_prompt_length=prepared.max_prompt_length, max_completion_length=prepared.max_completion_length,
            data_fingerprint=prepared.fingerprint, adapter_dir=adapter_dir,
            adapter_kind="full" if cfg.lora.full_finetune else "lora",
        )
        with _disk_full_is_resumable(trainer, output_dir), atomic_directory(adapter_dir) as staging:
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
    saved = next((d for d in (output_dir / "lora", output_dir / "model") if d.is_dir()), None)
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


def build_trainer(cfg: PipelineConfig, backend, model, tokenizer, prepared, peft_config, output_dir: Path):
    """The wrapped TRL GRPOTrainer: our dataset, rewards (+ the zero-weight health observer) and callbacks."""
    import trl  # after the backend: with Unsloth, trl.GRPOTrainer/GRPOConfig are already its patched classes
    from transformers import PrinterCallback, ProgressCallback

    from pipeline.run.checkpoints import file_mode_callback
    from pipeline.health.rules import build_health
    from pipeline.run.log import MetricsJsonlCallback, RewardProgressCallback
    from rewards import check_reward_weights, get_reward_funcs

    g = cfg.grpo
    reward_funcs = get_reward_funcs(list(g.reward_funcs))
    weights = check_reward_weights(list(g.reward_funcs), g.reward_weights)
    observer, health = build_health(cfg, tokenizer)
    reward_funcs.append(observer)
    weights.append(0.0)  # the observer only watches; it never changes the reward

    args = grpo_training_args(cfg, backend, model, prepared, output_dir, weights)
    metrics = MetricsJsonlCallback(output_dir / "metrics.jsonl")
    trainer = GRPOTrainer_with_hooks(trl.GRPOTrainer)(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=prepared.dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        # health first: it fills in health/* from its shared state before metrics.jsonl is written
        callbacks=[health, metrics, RewardProgressCallback(), file_mode_callback()],
    )
    for default_printer in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(default_printer)
    health.attach(trainer)
    trainer._metrics_callback = metrics
    trainer._card_names = (cfg.model.model_name_or_path, cfg.data.dataset_name)
    return trainer, health


def grpo_training_args(cfg: PipelineConfig, backend, model, prepared, output_dir: Path, reward_weights: list[float]):
    """The trl.GRPOConfig a run trains with (bench/overhead.py gives bare TRL this same one, to compare equal work)."""
    import trl  # imported after the backend, as in build_trainer (Unsloth patches GRPOConfig)

    from pipeline.health.rules import HEALTH_TRAINING_ARGS

    g = cfg.grpo
    return trl.GRPOConfig(
        output_dir=str(output_dir),
        learning_rate=g.learning_rate,
        num_generations=g.num_generations,
        per_device_train_batch_size=g.per_device_train_batch_size,
        gradient_accumulation_steps=g.gradient_accumulation_steps,
        max_steps=g.max_steps,
        num_train_epochs=g.num_train_epochs,
        max_completion_length=prepared.max_completion_length,
        beta=g.beta,
        loss_type=g.loss_type,
        mask_truncated_completions=g.mask_truncated_completions,
        epsilon_high=g.epsilon_high,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        min_p=g.min_p,
        warmup_steps=g.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio of total steps
        lr_scheduler_type=g.lr_scheduler_type,
        optim=g.optim,
        weight_decay=g.weight_decay,
        adam_beta1=g.adam_beta1,
        adam_beta2=g.adam_beta2,
        max_grad_norm=g.max_grad_norm,
        logging_steps=g.logging_steps,
        save_steps=g.save_steps,
        save_total_limit=g.save_total_limit,
        seed=g.seed,
        report_to=[r.strip() for r in g.report_to.split(",") if r.strip() and r.strip() != "none"] or "none",
        reward_weights=reward_weights,
        log_completions=g.log_completions,
        gradient_checkpointing=cfg.lora.gradient_checkpointing and not _on_cpu(),
        disable_tqdm=True,  # our RewardProgressCallback shows reward / KL / length instead
        **HEALTH_TRAINING_ARGS,  # keep NaN losses visible to the health rules
        **backend.grpo_config_kwargs(cfg, model),
    )


def save_size_estimate(model) -> int:
    """Bytes one checkpoint takes: the trained weights in fp32 plus Adam's two moments (4 + 8 bytes a
    parameter), plus 10% for the scheduler, RNG and trainer state."""
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return int(trained * 12 * 1.1)


@contextlib.contextmanager
def _disk_full_is_resumable(trainer, output_dir: Path):
    """Turn a full disk during a save into DiskFullError, and remove the half-written checkpoint so that
    `--resume auto` picks the newest complete one (atomic_directory already discards a half-written lora/)."""
    from env.paths import DiskFullError, is_disk_full

    try:
        yield
    except (OSError, RuntimeError) as err:
        if not is_disk_full(err):
            raise
        import shutil

        from pipeline.run.checkpoints import checkpoint_problem

        partial = output_dir / f"checkpoint-{trainer.state.global_step}"
        removed = ""
        if partial.is_dir() and checkpoint_problem(partial):
            shutil.rmtree(partial, ignore_errors=True)
            removed = f" The half-written {partial.name} was removed."
        raise DiskFullError(output_dir, save_size_estimate(trainer.model),
                            f"resume with the same command and --resume auto (it continues from the newest complete "
                            f"checkpoint in {output_dir}).{removed}") from None


def _on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def GRPOTrainer_with_hooks(base):  # noqa: N802 (returns a class)
    """Subclass the (possibly Unsloth-patched) GRPOTrainer with the one hook resume needs."""

    class PipelineGRPOTrainer(base):
        def create_model_card(self, model_name=None, dataset_name=None, tags=None):
            """TRL's card (output_dir/README.md), naming the base model and dataset we trained on.

            TRL reads the base model from config._name_or_path and leaves it out when that is a local folder
            (our built-in models, a downloaded copy), giving "fine-tuned version of [None]". A hub id is
            named; for anything else no card is written, since its hub links would point nowhere.
            """
            base_model, dataset = getattr(self, "_card_names", (None, None))
            if not base_model or not _is_hub_id(base_model):
                return
            config = self.model.config
            local_name = getattr(config, "_name_or_path", "")
            config._name_or_path = base_model
            try:
                super().create_model_card(model_name=model_name, tags=tags,
                                          dataset_name=dataset_name or (dataset if _is_hub_id(dataset) else None))
            finally:
                config._name_or_path = local_name

        def metrics_callback_for_resume(self, step: int) -> None:
            from pipeline.run.log import MetricsJsonlCallback

            fresh = MetricsJsonlCallback(self._metrics_callback.path, resume_step=step)
            self.remove_callback(self._metrics_callback)
            self.add_callback(fresh)
            self._metrics_callback = fresh

    return PipelineGRPOTrainer


def _is_hub_id(name: Optional[str]) -> bool:
    """`org/name` that is neither a built-in name nor a local path."""
    from pipeline.data.tokenizer import resolve_model_path

    return bool(name) and name.count("/") == 1 and not os.path.exists(name) and resolve_model_path(name) == name


def _print_where_everything_is(output_dir: Path, status: str, reason: Optional[str], adapter_dir: Optional[Path],
                               cfg: PipelineConfig) -> None:
    _print(f"run {status}" + (f": {reason}" if reason else ""))
    if status == "interrupted":
        _print(f"resume with: grpo train <same options> --output_dir {output_dir} --resume auto")
    if status == "stopped":
        _print(f"a checkpoint was kept in {output_dir}; see summary.json for the reason")
    saved_label = "model" if cfg.lora.full_finetune else "adapter"  # a full fine-tune saves a whole model
    for label, path in ((saved_label, adapter_dir), ("manifest", output_dir / "manifest.json"),
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
    from env.paths import AdapterError, DiskFullError
    from pipeline.data.prepare import DataError
    from pipeline.data.sources import DataFileError

    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    if "--check" in argv:
        return check_main([a for a in argv if a != "--check"])
    if any(a in ("-h", "--help") for a in argv):
        return _print_help(argv)
    try:
        # Decide the backend before anything imports trl: Unsloth must be imported first.
        choice = choose_backend(str(peek_option(argv, "backend", "auto")), _peek_fast_inference(argv))
        argv, base, note = _defaults_for(argv, choice)
        if note:
            _print(note)
        if choice.name == "unsloth":
            standby = peek_option(argv, "vllm_standby", "auto")
            early = from_mapping({"vllm_standby": standby, "fast_inference": choice.fast_inference})
            unsloth_backend = load_backend("unsloth")
            unsloth_backend.refuse_vllm_sleep_mode(unsloth_backend.standby_enabled(early))
            unsloth_backend.prepare_environment(early)
        cfg = parse_config(argv, base=base)
        result = run_training(cfg, choice)
    except (ConfigError, FileNotFoundError, DataError, DataFileError, AdapterError, DiskFullError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return result.exit_code


def _defaults_for(argv: list[str], choice: BackendChoice) -> tuple[list[str], Optional[dict[str, Any]], str]:
    """Which defaults a run without --config gets: the GPU recipe on a GPU, the tiny CPU demo elsewhere.

    Returns (argv, base defaults for parse_config, a line saying which), shared by a run and by --help.
    """
    if "--config" in argv:
        return argv, None, ""
    if choice.name == "unsloth" or _has_cuda():
        return ["--config", str(DEFAULT_GPU_RECIPE), *argv], None, f"no --config: using {DEFAULT_GPU_RECIPE}"
    from pipeline.demo.registry import cpu_demo_config

    return argv, cpu_demo_config(), "no GPU and no --config: running the built-in tiny CPU demo (a few minutes)"


def _print_help(argv: list[str]) -> int:
    """`grpo train --help`, with --config listed and the defaults that apply on this machine shown."""
    import yaml
    from trl import TrlParser

    from pipeline.config import SECTIONS

    try:
        choice = choose_backend(str(peek_option(argv, "backend", "auto")), _peek_fast_inference(argv))
        argv, base, _ = _defaults_for([a for a in argv if a not in ("-h", "--help")], choice)
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
        argv, base, note = _defaults_for(argv, choose_backend(str(peek_option(argv, "backend", "auto")),
                                                            _peek_fast_inference(argv)))
        if note:
            print(f"[grpo] {note}", file=sys.stderr)
        results = run_checks(parse_config(argv, base=base), stop_at_first=False)
    except ConfigError as err:
        results = [Check("config", False, str(err))]
    report = as_json(results)
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return EXIT_OK if report["ok"] else EXIT_BAD_INPUT


def _peek_fast_inference(argv: list[str]) -> bool:
    """`fast_inference` from the command line or the recipe, read before TrlParser (which imports trl)."""
    value = str(peek_option(argv, "fast_inference", True)).strip().lower()
    return value not in ("false", "0", "no") and not {"--no_fast_inference", "--no-fast-inference"} & set(argv)


def _has_cuda() -> bool:
    from pipeline.backends import cuda_available

    return cuda_available()
