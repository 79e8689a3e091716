"""The recipe read once for the trainer and what runs beside it: `trainer_spec` builds the frozen `TrainerSpec` that
build.py (the GRPOTrainer and its GRPOConfig), effective.py (effective_config.json), the health rules and the format
warm-up read, and `agent_settings` the agent options that agents.py resolves. The check builds them
(pipeline/preflight.py) and hands them to the run on its decisions (pipeline/run/decisions.py); nothing beneath
reads the recipe. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Optional

from pipeline.config import HealthArguments, PipelineConfig, parse_limit, role_values, trl_training_args
from pipeline.run.resume import ResumeKey, resume_key
from pipeline.trainer.agents import AgentSettings
from pipeline.trainer.warmup import WarmupSpec


@dataclass(frozen=True)
class TrainerSpec:
    """What the trainer reads of the recipe: the rewards as named and weighted (`reward_weights` as given, None:
    1.0 each), the GRPOConfig keyword arguments the recipe states (`recipe_args`, pipeline/config
    trl_training_args) and the TRL options the user set (`trl_options`), the reporters, gradient checkpointing as
    asked, the completion limit as given (None: `auto`, from the data), the health rules' settings and the sampling
    values they read (`health`: the health section itself, HealthArguments, every field of which is a health rule's
    setting; the rules keep that very object), the model card's names, the agent options, the format warm-up's
    settings, and what each checkpoint records (`checkpoint`, pipeline/run/resume.py)."""

    reward_names: tuple[Any, ...]
    reward_weights: Optional[tuple[float, ...]]
    reward_timeout: Any
    recipe_args: Mapping[str, Any]
    trl_options: Mapping[str, Any]
    reporters: tuple[str, ...]
    gradient_checkpointing: bool
    completion_limit: Optional[int]
    health: HealthArguments
    beta: float
    temperature: float
    num_generations: int
    base_model: str
    dataset_name: Any
    agents: AgentSettings
    warmup: WarmupSpec
    checkpoint: ResumeKey


def agent_settings(cfg: PipelineConfig) -> AgentSettings:
    """The recipe's tools / environment_factory / rollout_func, as given."""
    g = cfg.grpo
    return AgentSettings(tuple(g.tools or ()), g.environment_factory, g.rollout_func)


def trainer_spec(cfg: PipelineConfig) -> TrainerSpec:
    """The one reading of the recipe for pipeline/trainer/ and the health rules."""
    g, h = cfg.grpo, cfg.health
    return TrainerSpec(
        reward_names=tuple(g.reward_funcs),
        reward_weights=None if g.reward_weights is None else tuple(g.reward_weights),
        reward_timeout=g.reward_timeout,
        recipe_args=MappingProxyType(trl_training_args(cfg)), trl_options=MappingProxyType(dict(cfg.trl)),
        reporters=tuple(g.reporters()), gradient_checkpointing=cfg.lora.gradient_checkpointing,
        completion_limit=parse_limit(cfg.data.max_completion_length, "max_completion_length"),
        health=h, beta=g.beta, temperature=g.temperature, num_generations=g.num_generations,
        base_model=cfg.model.model_name_or_path, dataset_name=cfg.data.dataset_name, agents=agent_settings(cfg),
        warmup=WarmupSpec(steps=h.sft_warmup_steps, learning_rate=h.sft_learning_rate, seed=g.seed,
                          max_seq_length=cfg.model.max_seq_length,
                          inputs=MappingProxyType(role_values(cfg, "warmup_input"))),
        checkpoint=resume_key(cfg))
