"""What a run writes while it trains: metrics.jsonl (one line per logged step) and a progress bar.

TRL logs through the HF Trainer's `log()`, so a TrainerCallback's `on_log` sees every metric:
TRL's own (`reward`, `rewards/<name>/mean`, `kl`, `completions/mean_length`, ...) and ours
(`health/*`, logged by the health observer through TRL's `log_metric`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from transformers import TrainerCallback


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan" / "inf": JSON has no such numbers, and a NaN must stay visible
    return value


class MetricsJsonlCallback(TrainerCallback):
    """Appends `{"step": N, ...logs}` to output_dir/metrics.jsonl on the main process.

    On resume, lines for steps after the checkpoint are dropped first: they describe a
    trajectory that the resumed run replaces.
    """

    def __init__(self, path: str | Path, resume_step: Optional[int] = None):
        self.path = Path(path)
        if resume_step is not None and self.path.is_file():
            kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, **{k: _jsonable(v) for k, v in logs.items()}}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


class RewardProgressCallback(TrainerCallback):
    """A tqdm bar over steps whose postfix shows reward, KL and completion length."""

    def __init__(self) -> None:
        self.bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

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
