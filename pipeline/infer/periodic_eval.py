"""Held-out evaluation during training (`eval_steps: N`) and the best adapter it keeps (`output_dir/best_lora/`).

Every N steps the before/after evaluation puts `eval/accuracy` and `eval/format_rate` into that step's log; a new
best accuracy writes the adapter to `best_lora/` with `grpo_best.json`. A resumed run keeps a best measured from
the same inputs; one measured otherwise is moved to previous/.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from transformers import TrainerCallback

# paths through the module, looked up at each call: tests/test_writers.py stands in there.
from grpo_pipeline.env import paths
from grpo_pipeline.env.kept import read_record, record, reusable
from grpo_pipeline.env.locations import snapshot
from grpo_pipeline.pipeline.run.metric_names import EVAL_ACCURACY, EVAL_FORMAT_RATE, EVAL_N
from grpo_pipeline.pipeline.infer.evaluate import headline
from grpo_pipeline.pipeline.infer.session import verify_trained_dir
from grpo_pipeline.pipeline.run.checkpoints import set_aside_stale
from grpo_pipeline.pipeline.run.manifest import write_adapter_metadata

BEST_DIR = "best_lora"
BEST_NAME = "grpo_best.json"


class BestAdapter:
    """The best adapter so far by held-out accuracy (`best`: {"step", "accuracy", ...}); `save(model, staging_dir)`
    writes the adapter and its metadata."""

    def __init__(self, output_dir: Path, save: Callable[[Any, Path], None], resume: bool,
                 inputs: Optional[dict[str, Any]] = None, log: Callable[[str], None] = print):
        self.path = Path(output_dir) / BEST_DIR
        self.save_adapter = save
        self.inputs = dict(inputs or {})
        self.best: Optional[dict[str, Any]] = None
        kept = read_record(self.path / BEST_NAME) if resume else None
        if kept is not None and isinstance(kept.get("accuracy"), (int, float)):  # a readable best_lora/
            if reusable(self.path / BEST_NAME, self.inputs, "best adapter", log=log) is not None:
                self.best = kept
            else:
                set_aside_stale(self.path, output_dir, f"{BEST_DIR}/ was measured on other evaluation inputs", log)
        self.seen = snapshot(self.path, fix="Move it away (or copy it elsewhere), then resume the run.")

    def offer(self, model: Any, step: int, result: dict[str, Any]) -> bool:
        """Keep `model` when its accuracy beats the best so far (ties keep the earlier one); True when kept."""
        if self.best is not None and result["accuracy"] <= self.best["accuracy"]:
            return False
        best = {"step": int(step), "accuracy": result["accuracy"], "format_rate": result["format_rate"],
                "n": result["n"]}
        with paths.atomic_directory(self.path, seen=self.seen) as staging:
            self.save_adapter(model, staging)
            paths.atomic_write_json(staging / BEST_NAME, record(self.inputs, **best))
        self.seen = snapshot(self.path, fix=self.seen.fix)
        verify_trained_dir(self.path)
        self.best = best
        return True


class PeriodicEvalCallback(TrainerCallback):
    """Every `every` steps: evaluate, log, offer to `best`. `last`: (step, result) of the latest eval, which eval
    after training reads instead of scoring the same weights again when it was the final step's."""

    def __init__(self, every: int, evaluate: Callable[[Any], dict[str, Any]], best: BestAdapter,
                 log: Callable[[str], None] = print):
        self.every = int(every)
        self.evaluate = evaluate
        self.best = best
        self.log = log
        self.pending: dict[str, float] = {}
        self.last: Optional[tuple[int, dict[str, Any]]] = None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every or not state.is_world_process_zero:
            return control
        result = self.evaluate(model)
        self.last = (state.global_step, result)
        self.pending = {EVAL_ACCURACY: result["accuracy"], EVAL_FORMAT_RATE: result["format_rate"],
                        EVAL_N: result["n"]}
        kept = self.best.offer(model, state.global_step, result)
        self.log(f"eval at step {state.global_step}: {headline(result)}"
                 + (f" (best so far: kept in {self.best.path})" if kept else ""))
        if args.world_size == 1:
            # Log this step off the logging_steps grid too; not under DDP, where every rank must log together.
            control.should_log = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.pending and logs is not None and "loss" in logs:  # a training step's log, not the final summary
            logs.update(self.pending)
            self.pending = {}
        return control


def build_periodic_eval(eval_steps: int, evaluate: Callable[[Any], dict[str, Any]], backend, tokenizer,
                        inputs: dict[str, Any], output_dir: Path, manifest: dict[str, Any], resume: bool,
                        log: Callable[[str], None] = print) -> PeriodicEvalCallback:
    """The callback for a run with `eval_steps`: `inputs` is what `evaluate(model)` measures from (eval_inputs)."""
    def save(model, staging: Path) -> None:
        backend.save_adapter(model, tokenizer, staging)
        write_adapter_metadata(staging, {**manifest, "adapter_dir": str(output_dir / BEST_DIR)})

    return PeriodicEvalCallback(eval_steps, evaluate, BestAdapter(output_dir, save, resume, inputs, log), log=log)
