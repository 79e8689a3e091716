"""The state one `grpo train` run's phases share (pipeline/train.py reads them top to bottom), and what the run
returns."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.pipeline.backends import BackendChoice
from grpo_pipeline.pipeline.config import PipelineConfig
from grpo_pipeline.rewards.contract import RewardFailure

EXIT_OK, EXIT_BAD_INPUT, EXIT_HEALTH_STOP, EXIT_INTERRUPTED = 0, 2, 3, 130


def tell(msg: str) -> None:
    """A line of the run's output."""
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
    """What the phases of one run share, filled in top to bottom: each phase reads what the ones above it set."""
    # The recipe, whole only for manifest.json's copy of it (cfg_dict, what lora/ was trained with). The phases read
    # single values of it and hand on the check's records (`decisions`); the calls that still take it are the
    # backends', the data's and eval's, narrowed in their own folders.
    cfg: PipelineConfig
    choice: BackendChoice
    backend: Any
    output_dir: Path
    callbacks: Optional[list]
    start: float
    resume_hint: str
    decisions: Any = None  # the check's RunDecisions (pipeline/run/decisions.py): backend, rewards, limits, ...
    # resume
    resume_from: Optional[str] = None
    resume_step: Optional[int] = None
    finish_only: bool = False  # trained to max_steps already, a final file missing: write them, train no step
    resume_changes: dict[str, Any] = field(default_factory=dict)
    adapter_seen: Any = None  # what lora/ and eval_before.json were at the start (grpo_pipeline.env.locations.snapshot)
    eval_before_seen: Any = None
    # data, model
    tokenizer: Any = None
    prepared: Any = None
    eval_rows: Any = None
    model: Any = None
    peft_config: Any = None
    manifest: dict[str, Any] = field(default_factory=dict)
    agents: Any = None  # the run's tools / environments, resolved once (pipeline/trainer/agents.py Agents)
    # eval before, train
    eval_before: Optional[dict[str, Any]] = None
    periodic_eval: Any = None
    trainer: Any = None
    health: Any = None
    rollbacks: list[dict[str, Any]] = field(default_factory=list)  # on_collapse: rollback (health/rollback.py)
    earlier_warnings: list[str] = field(default_factory=list)
    reward_failure: Optional[RewardFailure] = None
    kept: Optional[Path] = None
    signal_name: Optional[str] = None
    # outcome, save, eval after
    steps: int = 0
    status: str = "completed"  # completed | stopped | interrupted
    exit_code: int = EXIT_OK
    reason: Optional[str] = None
    adapter_dir: Optional[Path] = None
    eval_after: Optional[dict[str, Any]] = None
