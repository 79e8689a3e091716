"""The run's decisions, made once by the check before anything loads (pipeline/preflight.py `run_checks`) and handed
to the phases (pipeline/train.py), frozen: a phase reads them, none works them out again. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Optional, Sequence

from grpo_pipeline.pipeline.config import PipelineConfig, role_values
from grpo_pipeline.rewards import reads_reference
from grpo_pipeline.rewards.registry import check_reward_weights


@dataclass(frozen=True)
class Limits:
    """The token limits the run trains with: the data's (prompt, completion), measured when `auto`."""
    max_seq_length: int
    max_prompt_length: int
    max_completion_length: int


@dataclass(frozen=True)
class RewardSpec:
    """One reward as the run resolved it: its name in the recipe, the name TRL logs it under, its weight and whether
    it scores against the row's reference answer (None: its source cannot tell). A built-in reward's other facts
    (range, kind) are its declaration's (rewards/declared.py `facts_of`)."""
    name: str
    logged_name: str
    weight: float
    reads_reference: Optional[bool]


@dataclass(frozen=True)
class EvalKey:
    """What an evaluation's kept result depends on in the recipe (pipeline/infer/evaluate.py eval_inputs): the
    fields declaring eval_input and eval_start (what eval before's weights start from)."""
    inputs: Mapping[str, Any]
    start: Mapping[str, Any]


def eval_key(cfg: PipelineConfig) -> EvalKey:
    """The recipe's EvalKey, by the fields' roles (the check builds it once for the run)."""
    return EvalKey(role_values(cfg, "eval_input"), role_values(cfg, "eval_start"))


@dataclass(frozen=True)
class RunDecisions:
    """What the check decided for the run. `backend` is `load_backend(backend_name)` as it returned it."""
    backend_name: str
    backend_reason: str
    backend: Any
    rewards: tuple[RewardSpec, ...]
    limits: Limits
    data_key: str
    prompt_format: Mapping[str, Any]
    config: PipelineConfig  # the recipe as the check validated it: what the backend's operations and the data take
    eval_key: Optional[EvalKey] = None
    agents: Any = None  # the tools, environments, rollout_func: resolved once by the check (trainer/agents.py Agents)
    tokenizer: Any = None  # the tokenizer the check loaded: the run's data and model use it (loaded once a run)


def reward_specs(names: Sequence[Any], weights: Optional[Sequence[float]],
                 funcs: Sequence[Any]) -> tuple[RewardSpec, ...]:
    """The rewards of a recipe as the check resolved them (`funcs`: its fresh instances, named as the run's are)."""
    return tuple(RewardSpec(name=str(name), logged_name=func.__name__, weight=weight,
                            reads_reference=reads_reference([name]))
                 for name, func, weight in zip(names, funcs, check_reward_weights(names, weights), strict=True))


def run_decisions(choice: Any, backend: Any, rewards: tuple[RewardSpec, ...], prepared: Any, config: PipelineConfig,
                  eval_key: Optional[EvalKey] = None, agents: Any = None, tokenizer: Any = None) -> RunDecisions:
    """The record from what the check worked out: the backend `choice` (a BackendChoice) and `backend` loaded for
    it, the rewards, the prepared data (its limits, key and prompt format), the recipe as validated, the eval's key
    and the agents."""
    report = prepared.report
    return RunDecisions(
        backend_name=choice.name, backend_reason=choice.reason, backend=backend, rewards=rewards,
        limits=Limits(report["limits"]["max_seq_length"], prepared.max_prompt_length, prepared.max_completion_length),
        data_key=prepared.fingerprint, prompt_format=MappingProxyType(dict(report["prompt_format"])), config=config,
        eval_key=eval_key, agents=agents, tokenizer=tokenizer)
