"""What a run writes while it trains: metrics.jsonl (one line per logged step: a TrainerCallback's `on_log` sees
TRL's metrics and our health/*), a progress bar, and one line per log of the SFT format warm-up."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from tqdm.auto import tqdm
from transformers import TrainerCallback

from grpo_pipeline.env.paths import atomic_write_text


def _append(path: Path, record: dict[str, Any]) -> None:
    """One line of metrics.jsonl; NaN/inf as "nan"/"inf" (JSON has no such numbers, and a NaN must stay visible)."""
    record = {k: str(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


class MetricsJsonlCallback(TrainerCallback):
    """Appends `{"step": N, ...logs}` to metrics.jsonl on the main process; on resume it first drops the lines of later
    steps (event lines kept), once: another rank could put back a copy read before the main process's first step."""

    def __init__(self, path: str | Path, resume_step: Optional[int] = None):
        self.path = Path(path)
        self.resume_step = resume_step

    def on_train_begin(self, args, state, control, **kwargs):
        resume_step, self.resume_step = self.resume_step, None
        if resume_step is None or not state.is_world_process_zero or not self.path.is_file():
            return
        rows = [(line, json.loads(line)) for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip()]
        kept = [line for line, row in rows if row.get("step", 0) <= resume_step or "event" in row]
        # atomically: a full disk mid-write must not cut the kept history short
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        _append(self.path, {"step": state.global_step, **logs})


def log_event(path: str | Path, step: int, event: str, fields: dict[str, Any]) -> None:
    """One line for something that happened to the run, not a logged step: `{"step", "event", ...fields}`."""
    _append(Path(path), {"step": step, "event": event, **fields})


class RewardProgressCallback(TrainerCallback):
    """A tqdm bar over steps whose postfix shows reward, KL and completion length."""

    def __init__(self) -> None:
        self.bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="GRPO", dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is None or not logs:
            return
        shown = {"reward": "reward", "kl": "kl", "len": "completions/mean_length"}
        postfix = {label: f"{logs[key]:.3g}" for label, key in shown.items()
                   if isinstance(logs.get(key), (int, float))}
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def warmup_log_line(step: int, max_steps: int, logs: dict[str, Any]) -> Optional[str]:
    """The line printed for one warm-up log, or None for logs without a loss (the final summary).

    >>> warmup_log_line(200, 1000, {"loss": 0.4692, "mean_token_accuracy": 0.8891, "entropy": 0.68})
    '[grpo] warm-up step 200/1000: loss 0.469, token accuracy 88.9%'
    >>> warmup_log_line(1000, 1000, {"train_runtime": 75.1}) is None
    True
    """
    if "loss" not in logs:
        return None
    line = f"[grpo] warm-up step {step}/{max_steps}: loss {float(logs['loss']):.3f}"
    if "mean_token_accuracy" in logs:
        line += f", token accuracy {float(logs['mean_token_accuracy']):.1%}"
    return line


class WarmupLogCallback(TrainerCallback):
    """Prints `warmup_log_line` for each SFT warm-up log, in place of transformers' raw-dict printer."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = warmup_log_line(state.global_step, self.max_steps, logs or {})
        if line and state.is_world_process_zero:
            print(line, flush=True)
