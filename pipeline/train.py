"""`grpo train`: the one training script.

    grpo train                                   # GPU: configs/qwen2.5-1.5b-gsm8k.yaml; no GPU: tiny CPU demo
    grpo train --config configs/qwen2.5-3b-gsm8k.yaml --learning_rate 1e-5
    grpo train --config my.yaml --resume never   # auto (default) | never | PATH

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

from pipeline.backends import BackendChoice, choose_backend, load_backend, refuse_gpu_recipe_without_cuda
from pipeline.config import ConfigError, PipelineConfig, from_mapping, parse_config, peek_option, validate

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
    validate(cfg, backend=choice.name)  # before any model or tokenizer loads
    refuse_gpu_recipe_without_cuda(cfg, choice)  # never train a GPU recipe on CPU by accident
    backend = load_backend(choice.name)
    if choice.name == "unsloth":
        backend.prepare_environment(cfg)  # UNSLOTH_VLLM_STANDBY + `import unsloth` before trl/transformers/peft
    _print(f"backend: {choice.name} ({choice.reason})")

    from env.paths import absolute_path, atomic_directory
    from pipeline.inference import verify_trained_dir

    output_dir = absolute_path(cfg.grpo.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- data (tokenizer only)
    from pipeline.data import prepare_dataset
    from pipeline.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(cfg.model.model_name_or_path, cfg.model.trust_remote_code)
    prepared = prepare_dataset(cfg, tokenizer, report_dir=output_dir)
    _print(f"data: {len(prepared.dataset)} prompts, max_prompt_length={prepared.max_prompt_length}, "
           f"max_completion_length={prepared.max_completion_length} (report: {prepared.report_path})")
    from pipeline.evaluate import evaluate_rows, load_eval_rows

    # Held-out rows are prepared now, so a bad eval source fails before the model loads.
    eval_rows = load_eval_rows(cfg, tokenizer) if (cfg.eval.eval_before or cfg.eval.eval_after) else []

    # ---------------------------------------------------------------- model
    model, tokenizer = backend.load_for_training(cfg)
    peft_config = backend.peft_config(cfg)

    # ---------------------------------------------------------------- format warm-up (optional SFT)
    if cfg.health.sft_warmup_steps > 0:
        from pipeline.warmup import run_format_warmup

        model = run_format_warmup(model, tokenizer, cfg, prepared, peft_config, output_dir)
        if peft_config is not None:
            peft_config = None  # the warm-up already wrapped the model with this LoRA

    # ---------------------------------------------------------------- eval before
    eval_before = None
    if cfg.eval.eval_before and eval_rows:
        eval_before = evaluate_rows(backend.training_generator(model, tokenizer, cfg), tokenizer, eval_rows,
                                    cfg.data.system_prompt, prepared.max_completion_length)
        _print(f"eval before GRPO: accuracy {eval_before['accuracy']:.1%}, format {eval_before['format_rate']:.1%}")

    # ---------------------------------------------------------------- trainer
    trainer, health = build_trainer(cfg, backend, model, tokenizer, prepared, peft_config, output_dir)
    for callback in callbacks or []:
        trainer.add_callback(callback)

    # ---------------------------------------------------------------- train (resumable)
    from pipeline.checkpoints import GracefulStop, checkpoint_step, resolve_resume

    resume_from = resolve_resume(cfg.grpo.resume, output_dir, log=_print)
    if resume_from:
        _print(f"resuming from {resume_from} (step {checkpoint_step(resume_from)})")
        trainer.metrics_callback_for_resume(checkpoint_step(resume_from))
    with GracefulStop() as stopper:
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
        with atomic_directory(adapter_dir) as staging:
            backend.save_adapter(trainer.model, tokenizer, staging)
        verify_trained_dir(adapter_dir)  # re-read what we wrote: a bad save fails here, not at inference
        from pipeline.manifest import write_manifest

        write_manifest(
            output_dir, cfg_dict=cfg.to_dict(), backend=choice.name, base_model=cfg.model.model_name_or_path,
            system_prompt=cfg.data.system_prompt, chat_template=getattr(tokenizer, "chat_template", None),
            max_prompt_length=prepared.max_prompt_length, max_completion_length=prepared.max_completion_length,
            data_fingerprint=prepared.fingerprint, adapter_dir=adapter_dir,
            adapter_kind="full" if cfg.lora.full_finetune else "lora",
        )
        # ------------------------------------------------------------ eval after
        if cfg.eval.eval_after and eval_rows:
            eval_after = evaluate_rows(backend.training_generator(trainer.model, tokenizer, cfg), tokenizer,
                                       eval_rows, cfg.data.system_prompt, prepared.max_completion_length)
            _print(f"eval after GRPO: accuracy {eval_after['accuracy']:.1%}, format {eval_after['format_rate']:.1%}")

    # ---------------------------------------------------------------- plots + summary
    summary: dict[str, Any] = {}
    if _is_main_process():
        from pipeline.summary import write_summary

        summary = write_summary(output_dir, status=status, reason=reason, steps=steps,
                                wall_time_s=time.time() - start, eval_before=eval_before, eval_after=eval_after,
                                warnings=list(health.warnings), health=health.summary())
        _print_where_everything_is(output_dir, status, reason, adapter_dir, cfg)
    return RunResult(output_dir, status, exit_code, steps, adapter_dir, summary)


def build_trainer(cfg: PipelineConfig, backend, model, tokenizer, prepared, peft_config, output_dir: Path):
    """The wrapped TRL GRPOTrainer: our dataset, rewards (+ the zero-weight health observer) and callbacks."""
    import trl  # after the backend: with Unsloth, trl.GRPOTrainer/GRPOConfig are already its patched classes
    from transformers import PrinterCallback, ProgressCallback

    from pipeline.health import HEALTH_TRAINING_ARGS, build_health
    from pipeline.run_logging import MetricsJsonlCallback, RewardProgressCallback
    from rewards import check_reward_weights, get_reward_funcs

    g = cfg.grpo
    reward_funcs = get_reward_funcs(list(g.reward_funcs))
    weights = check_reward_weights(list(g.reward_funcs), g.reward_weights)
    observer, health = build_health(cfg, tokenizer)
    reward_funcs.append(observer)
    weights.append(0.0)  # the observer only watches; it never changes the reward

    args = trl.GRPOConfig(
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
        reward_weights=weights,
        log_completions=g.log_completions,
        gradient_checkpointing=cfg.lora.gradient_checkpointing and not _on_cpu(),
        disable_tqdm=True,  # our RewardProgressCallback shows reward / KL / length instead
        **HEALTH_TRAINING_ARGS,  # keep NaN losses visible to the health rules
        **backend.grpo_config_kwargs(cfg, model),
    )
    metrics = MetricsJsonlCallback(output_dir / "metrics.jsonl")
    trainer = GRPOTrainer_with_hooks(trl.GRPOTrainer)(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=prepared.dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        # health first: it fills in health/* from its shared state before metrics.jsonl is written
        callbacks=[health, metrics, RewardProgressCallback()],
    )
    for default_printer in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(default_printer)
    health.attach(trainer)
    trainer._metrics_callback = metrics
    return trainer, health


def _on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def GRPOTrainer_with_hooks(base):  # noqa: N802 (returns a class)
    """Subclass the (possibly Unsloth-patched) GRPOTrainer with the one hook resume needs."""

    class PipelineGRPOTrainer(base):
        def metrics_callback_for_resume(self, step: int) -> None:
            from pipeline.run_logging import MetricsJsonlCallback

            fresh = MetricsJsonlCallback(self._metrics_callback.path, resume_step=step)
            self.remove_callback(self._metrics_callback)
            self.add_callback(fresh)
            self._metrics_callback = fresh

    return PipelineGRPOTrainer


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
    if cfg.data.dataset_name == "demo-arithmetic":
        from pipeline.demo import EXAMPLE_QUESTION

        return EXAMPLE_QUESTION
    return "Tom has 3 boxes of 12 pencils and gives away 5. How many pencils are left?"


def main(argv: Optional[list[str]] = None) -> int:
    from pipeline.data import DataError

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        from trl import TrlParser

        from pipeline.config import SECTIONS

        TrlParser(SECTIONS, prog="grpo train", description=__doc__.split("\n\n")[0]).print_help()
        return EXIT_OK
    try:
        # Decide the backend before anything imports trl: Unsloth must be imported first.
        fast_inference = (str(peek_option(argv, "fast_inference", True)).strip().lower() not in ("false", "0", "no")
                          and not {"--no_fast_inference", "--no-fast-inference"} & set(argv))
        choice = choose_backend(str(peek_option(argv, "backend", "auto")), fast_inference)
        base = None
        if "--config" not in argv:
            if choice.name == "unsloth" or _has_cuda():
                argv = ["--config", str(DEFAULT_GPU_RECIPE), *argv]
                _print(f"no --config: using {DEFAULT_GPU_RECIPE}")
            else:
                from pipeline.demo import DEMO_CONFIG

                base = dict(DEMO_CONFIG)
                _print("no GPU and no --config: running the built-in tiny CPU demo (a few minutes)")
        if choice.name == "unsloth":
            standby = peek_option(argv, "vllm_standby", "auto")
            early = from_mapping({"vllm_standby": standby, "fast_inference": choice.fast_inference})
            unsloth_backend = load_backend("unsloth")
            unsloth_backend.refuse_vllm_sleep_mode(unsloth_backend.standby_enabled(early))
            unsloth_backend.prepare_environment(early)
        cfg = parse_config(argv, base=base)
        result = run_training(cfg, choice)
    except (ConfigError, FileNotFoundError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return result.exit_code


def _has_cuda() -> bool:
    from pipeline.backends import cuda_available

    return cuda_available()
