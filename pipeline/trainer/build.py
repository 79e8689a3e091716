"""Build the wrapped TRL GRPOTrainer: our dataset, rewards (+ the zero-weight health observer), callbacks,
and the trl.GRPOConfig it trains with.

Import this only after the backend's `prepare_environment` ran: with Unsloth, `trl.GRPOTrainer` and
`trl.GRPOConfig` are its patched classes from then on, and both functions read them at call time.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

from grpo_pipeline.env.secret_fields import masked, masked_pickle_class
from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.backends import load_backend, on_cpu
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, parse_limit, trl_training_args
from grpo_pipeline.pipeline.config.trl_fields import grpo_trainer_module, trainer_choices, trl_with
from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path
from grpo_pipeline.pipeline.health.rollout import build_probe
from grpo_pipeline.pipeline.run.checkpoints import file_mode_callback
from grpo_pipeline.pipeline.run.resume import resume_key
from grpo_pipeline.pipeline.trainer.agent_boundary import hold_failures
from grpo_pipeline.pipeline.trainer.agents import Agents
from grpo_pipeline.pipeline.trainer.effective import predicted_changes, write_effective_config
from grpo_pipeline.pipeline.trainer.trl_internals import RewardFailureLatch, replace_trl_internals
from grpo_pipeline.rewards import check_reward_weights, get_reward_funcs
from grpo_pipeline.rewards.contract import guard_reward


def build_trainer(agents: Agents, backend, cfg: PipelineConfig, model, tokenizer, prepared,
                  peft_config, output_dir: Path, resume_step: Optional[int] = None, periodic_eval=None,
                  rollbacks_done: int = 0, previous: Any = None):
    """The wrapped TRL GRPOTrainer and its HealthCallback. `resume_step`: the checkpoint's step (metrics.jsonl drops
    the lines after it; None: a fresh run); `periodic_eval`: the eval_steps callback or None; `rollbacks_done` > 0:
    a rolled-back run, its learning rate scaled by rollback_lr_factor ** that; `previous`: the trainer it replaces,
    whose colocated vLLM engine it takes over."""
    import trl  # lazy, after the backend: with Unsloth, trl.GRPOTrainer/GRPOConfig are already its patched classes
    from transformers import PrinterCallback, ProgressCallback

    # lazy: these import transformers (--check and `import grpo_pipeline.pipeline.train` load no torch)
    from grpo_pipeline.pipeline.health.rollback import LrScaleCallback, base_model_reference
    from grpo_pipeline.pipeline.health.rules import build_health
    from grpo_pipeline.pipeline.run.log import MetricsJsonlCallback, RewardProgressCallback

    # none: the environments' get_reward is the reward (TRL's form; the check refused it without one)
    g = cfg.grpo
    reward_funcs = get_reward_funcs(list(g.reward_funcs)) if g.reward_funcs else []
    weights = check_reward_weights(list(g.reward_funcs), g.reward_weights)
    observer, health = build_health(cfg, tokenizer, rollbacks_done)
    reward_funcs.append(observer)
    weights.append(0.0)  # the observer only watches; it never changes the reward
    # The reward contract around every function (rewards/contract.py); a failure is held and raised after TRL's
    # reward gather, on every process together (trl_internals.py).
    latch = RewardFailureLatch()
    reward_funcs = guarded_rewards(reward_funcs, observer, latch.hold, g.reward_timeout)

    args = grpo_training_args(backend, cfg, model, prepared, output_dir, weights)
    grpo_trainer_module(uses_vllm=bool(getattr(args, "use_vllm", False)))  # before trl.GRPOTrainer is read
    engine = contextlib.nullcontext()
    if getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", None) == "colocate":
        # lazy: vLLM is a heavy optional package. One engine for the process's trainers (vllm_engine.py)
        from grpo_pipeline.pipeline.backends.vllm_engine import colocated_engine

        engine = colocated_engine(previous)
    # One kl reference on both backends, after a warm-up and after a rollback too: the base model (rollback.py).
    with base_model_reference(model), engine:
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=prepared.dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
            **agents.trainer_kwargs(),  # TRL's tools / environment_factory / rollout_func, when set
            # periodic eval, then health: they put eval/* and health/* into a step's log before metrics.jsonl is
            # written, and the health rules read eval/accuracy
            callbacks=[*([periodic_eval] if periodic_eval else []), health,
                       MetricsJsonlCallback(output_dir / "metrics.jsonl", resume_step=resume_step),
                       RewardProgressCallback(), file_mode_callback()],
        )
    # TRL appends one reward per environment class with a get_reward (named after it, weight 1): its failures
    # (agent_boundary.py) are held and raised after the gather too
    ours = len(reward_funcs)
    trainer.reward_funcs[ours:] = [hold_failures(func, latch.hold) for func in trainer.reward_funcs[ours:]]
    if rollbacks_done:
        trainer.add_callback(LrScaleCallback(cfg.health.rollback_lr_factor ** rollbacks_done))
    for default_printer in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(default_printer)
    health.attach(trainer)
    backend.prepare_trainer(trainer, cfg)
    health.rollout_probe = build_probe(cfg.health.rollout_probe_steps, tokenizer,  # None without a separate engine
                                       lambda: backend.rollout_engine(trainer, tokenizer, cfg))
    replace_trl_internals(trainer, ModelCard(cfg.model.model_name_or_path, cfg.data.dataset_name), latch,
                          resume_key(cfg), prepared.dataset)  # pipeline/trainer/trl_internals.py: each one and why
    return trainer, health


def guarded_rewards(reward_funcs: list, observer, hold, timeout: Optional[float]) -> list:
    """Every reward in the contract (rewards/contract.py guard_reward), failures handed to `hold`; with `timeout`,
    each but the health `observer` (whose state the callback reads) in a process of its own (rewards/worker.py)."""
    return [guard_reward(func, hold=hold, timeout=timeout, own_process=func is not observer) for func in reward_funcs]


def record_effective_config(trainer, backend, cfg: PipelineConfig, model,
                            max_completion_length: int, output_dir: Path) -> list[str]:
    """effective_config.json from the built trainer's args (effective.py), with the kwargs passed worked out again
    as grpo_training_args did; the changed-field lines."""
    weights = list(trainer.args.reward_weights or [])
    decided = run_decided_args(backend, cfg, model, max_completion_length, output_dir, weights)
    passed = {**trl_training_args(cfg), **decided}
    return write_effective_config(output_dir, cfg, backend, trainer, passed,
                                  backend.grpo_config_kwargs(cfg, model))


@dataclass(frozen=True)
class ModelCard:
    """The base model and dataset TRL's model card (output_dir/README.md) should name. TRL reads config._name_or_path:
    a local folder gives "fine-tuned version of [None]", Unsloth's the pre-quantized repo. A hub id is named; for
    anything else no card is written (its hub links would point nowhere)."""

    base_model: Optional[str]
    dataset: Optional[str]

    def write(self, trainer, model_name=None, dataset_name=None, tags=None) -> None:
        """Stands in for `trainer.create_model_card` (same keyword arguments)."""
        if not self.base_model or not is_hub_id(self.base_model):
            return
        config = trainer.model.config
        local_name = getattr(config, "_name_or_path", "")
        config._name_or_path = self.base_model
        try:
            type(trainer).create_model_card(
                trainer, model_name=model_name, tags=tags,
                dataset_name=dataset_name or (self.dataset if is_hub_id(self.dataset) else None))
        finally:
            config._name_or_path = local_name


def is_hub_id(name: Optional[str]) -> bool:
    """`org/name` that is neither a built-in name nor a local path."""
    return bool(name) and name.count("/") == 1 and not os.path.exists(name) and resolve_model_path(name) == name


def grpo_training_args(backend, cfg: PipelineConfig, model, prepared, output_dir: Path,
                       reward_weights: list[float]):
    """The trl.GRPOConfig a run trains with (bench/overhead.py gives bare TRL this same one, to compare equal work)."""
    decided = run_decided_args(backend, cfg, model, prepared.max_completion_length, output_dir,
                               reward_weights)
    return build_grpo_config(cfg, decided)


def run_decided_args(backend, cfg: PipelineConfig, model, max_completion_length: int,
                     output_dir: Path, reward_weights: list[float]) -> dict:
    """What the run works out for trl.GRPOConfig (not a config value as given)."""
    # lazy: health/rules imports transformers
    from grpo_pipeline.pipeline.health.rules import HEALTH_TRAINING_ARGS

    return dict(
        output_dir=str(output_dir),
        max_completion_length=max_completion_length,  # `auto` resolved from the data
        report_to=cfg.grpo.reporters() or "none",
        reward_weights=reward_weights,  # + the health observer's 0
        gradient_checkpointing=cfg.lora.gradient_checkpointing and not on_cpu(),
        disable_tqdm=True,  # our RewardProgressCallback shows reward / KL / length instead
        **HEALTH_TRAINING_ARGS,  # keep NaN losses visible to the health rules
        **backend.grpo_config_kwargs(cfg, model),
    )


def build_grpo_config(cfg: PipelineConfig, decided: dict):
    """trl.GRPOConfig from our fields, the user's TRL options (`cfg.trl`) and what the run decided. A TRL option the
    backend decides otherwise (role backend_decided) is refused naming what decides it; a value TRL's own
    validation refuses is a ConfigError naming the field."""
    import trl  # lazy: imported after the backend, as in build_trainer (Unsloth patches GRPOConfig)

    for name, value in cfg.trl.items():
        if name in decided and decided[name] != value:
            raise ConfigError(name, f"{name}: {excerpt(value)} does not fit this run: the backend, on this machine, "
                              f"needs {excerpt(decided[name])}. It is decided by "
                              f"{trl_with('backend_decided').get(name, 'the run')}; set that instead, or remove "
                              f"{name}.")
    kwargs = {**trl_training_args(cfg), **decided}
    try:
        # pickled into every checkpoint (training_args.bin) with its secrets masked (env/secret_fields.py)
        config = masked_pickle_class(trl.GRPOConfig)(**kwargs)
    except (ValueError, TypeError, NotImplementedError) as err:
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(err)))  # a TRL option the user set, else any field
        named = next((name for name in [*cfg.trl, *kwargs] if name in words), "trl")
        raise ConfigError(named, f"trl.GRPOConfig refused the config: {err}") from None
    for name, choices in trainer_choices().items():  # values only TRL's trainer would refuse, mid-step
        value = getattr(config, name, None)
        if isinstance(value, str) and value not in choices:
            raise ConfigError(name, f"got {excerpt(value)}; TRL's GRPOTrainer takes {', '.join(choices)}.")
    return config


def check_grpo_config(backend_name: str, cfg: PipelineConfig) -> str:
    """`--check`'s `trl` step: the trl.GRPOConfig the run will build, with TRL's own validation, before anything
    loads (Unsloth's device settings need the model: the run checks those)."""
    with tempfile.TemporaryDirectory() as scratch:
        build_grpo_config(cfg, _model_free_decided(backend_name, cfg, Path(scratch)))
    named = ", ".join(f"{k}={excerpt(v)}" for k, v in masked(dict(cfg.trl)).items())
    return f"trl.GRPOConfig accepts it{f' (TRL options: {named})' if named else ''}"


def check_effective_config(backend_name: str, cfg: PipelineConfig) -> str:
    """`--check`'s `effective_config` step: the fields the backend will change (effective.py predicted_changes)."""
    with tempfile.TemporaryDirectory() as scratch:
        decided = _model_free_decided(backend_name, cfg, Path(scratch))
        changes = predicted_changes(backend_name, cfg, decided)
    if not changes:
        return f"the {backend_name} backend changes no GRPOConfig field"
    return f"the {backend_name} backend changes {len(changes)} GRPOConfig field(s): " + "; ".join(changes)


def _model_free_decided(backend_name: str, cfg: PipelineConfig, scratch: Path) -> dict:
    """run_decided_args as far as it is known before the model loads (the data's limit, the reward weights)."""
    weights = [*check_reward_weights(list(cfg.grpo.reward_funcs), cfg.grpo.reward_weights), 0.0]
    completion_limit = parse_limit(cfg.data.max_completion_length, "max_completion_length")  # None: auto
    backend = load_backend(backend_name)
    if backend.KWARGS_NEED_MODEL:  # Unsloth's device settings follow the loaded model: none known before it loads
        device = {"use_cpu": True, "bf16": False, "fp16": False} if on_cpu() else {}
        backend = SimpleNamespace(grpo_config_kwargs=lambda cfg, model: device)
    return run_decided_args(backend, cfg, None, completion_limit or 256, scratch, weights)
