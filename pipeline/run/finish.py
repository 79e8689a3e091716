"""The end of a run: is a resumed run already finished (its final files all written), summary.json (how the run
ended, before/after evaluation, final metrics, wall time; plus the plots), and the closing lines that say where
everything went and the command to run next."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.adapters import AdapterError, verify_adapter_dir
from grpo_pipeline.env.kept import read_record
from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.env.paths import atomic_write_json, shell_command
from grpo_pipeline.pipeline.demo.registry import example_question
from grpo_pipeline.pipeline.run.checkpoints import checkpoint_state
from grpo_pipeline.pipeline.run.manifest import MANIFEST_NAME, agent_options
from grpo_pipeline.pipeline.run.plots import METRICS_FILE, plot_run, read_metrics


def _print(msg: str) -> None:
    print(f"[grpo] {msg}", flush=True)


@dataclass(frozen=True)
class Finished:
    """A resumed run whose newest checkpoint reached max_steps. `complete`: its final files all exist (nothing to
    do, exit 0); otherwise a kill during the final save left one missing, and the run writes them, training none."""
    step: int
    complete: bool
    adapter_dir: Path
    summary: dict[str, Any] = field(default_factory=dict)


def finished_run(max_steps: int, output_dir: Path, checkpoint: str) -> Optional[Finished]:
    """A run whose newest checkpoint reached `max_steps` (the option; -1: the checkpoint's own): say so instead of
    training past it. None when there is training left."""
    state = checkpoint_state(checkpoint)
    step = int(state["global_step"])
    target = max_steps if max_steps > 0 else int(state.get("max_steps") or 0)
    if target <= 0 or step < target:
        return None
    saved = output_dir / "lora"
    missing, summary = _final_files_problem(output_dir, step)
    if missing:
        _print(f"{output_dir} has trained all {step} steps, but {missing}: finishing the run from {checkpoint} "
               "(no further training)")
        return Finished(step, False, saved)
    _print(f"run already complete: {output_dir} has trained {step} of max_steps={target} steps; nothing to do.")
    _print(f"  to train longer: raise --max_steps (e.g. --max_steps {step * 2}); it resumes from step {step}")
    _print("  to start over:   --resume never (same folder) or a new --output_dir")
    _print(f"  result:          {saved}")
    return Finished(step, True, saved, summary)


def _final_files_problem(output_dir: Path, step: int) -> tuple[Optional[str], dict[str, Any]]:
    """(what is missing of a completed run's final files, or None; its summary). Complete means: lora/
    verifies, manifest.json reads, and summary.json (written last) says completed at this step."""
    try:  # as pipeline/infer/session.py verify_trained_dir reads it (run/ sits below infer/, so not from there)
        verify_adapter_dir(absolute_path(output_dir / "lora"))
    except AdapterError:
        return "lora/ is missing or incomplete", {}
    read: dict[str, Any] = {}
    for name in (MANIFEST_NAME, "summary.json"):
        try:
            read[name] = json.loads((output_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return f"{name} is missing or unreadable", {}
        if not isinstance(read[name], dict):
            return f"{name} is not a JSON object", {}
    summary = read["summary.json"]
    if summary.get("status") != "completed" or summary.get("steps") != step:
        return f"summary.json records status {summary.get('status')!r} at step {summary.get('steps')}", {}
    return None, summary


def print_where_everything_is(output_dir: Path, status: str, reason: Optional[str], adapter_dir: Optional[Path],
                              resume_hint: str, eval_steps: int, dataset_name: Any, tools: Any,
                              environment_factory: Any) -> None:
    """The closing lines; the next command asks a question of `dataset_name`'s kind with the run's `tools` and
    `environment_factory` (as the recipe gave them); `eval_steps` > 0: best_lora/ is listed."""
    _print(f"run {status}" + (f": {reason}" if reason else ""))
    if status == "interrupted":
        _print(f"resume with: {resume_hint}")
    if status == "stopped":
        _print(f"a checkpoint was kept in {shell_command(output_dir)}; see summary.json for the reason")
    best_dir = output_dir / "best_lora" if eval_steps else None  # pipeline/infer/periodic_eval.py
    for label, path in (("adapter", adapter_dir), ("best adapter", best_dir),
                        ("manifest", output_dir / "manifest.json"),
                        ("metrics", output_dir / "metrics.jsonl"), ("plots", output_dir / "plots"),
                        ("summary", output_dir / "summary.json"), ("data report", output_dir / "data_report.json")):
        if path is not None and path.exists():
            _print(f"  {label:<12} {shell_command(path)}")  # quoted as a shell word: it pastes back as printed
        elif label == "plots" and (output_dir / "metrics.jsonl").is_file():  # plots: false
            _print(f"  {label:<12} none drawn (plots: false): {shell_command('grpo', 'plot', '--run', output_dir)}")
    if adapter_dir is not None:
        _print("next: " + shell_command("grpo", "generate", "--lora", adapter_dir, "--prompt",
                                        example_question(dataset_name), *agent_options(tools, environment_factory)))


# Metrics worth a glance at the end of a run (TRL's names + ours).
FINAL_METRIC_KEYS = ("reward", "reward_std", "kl", "loss", "grad_norm", "completions/mean_length",
                     "health/garbled_rate", "health/repetition_rate", "health/no_answer_rate")


def final_metrics(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The last logged value of each key, rows in step order (train-end records such as train_runtime included)."""
    last: dict[str, Any] = {}
    for record in records:
        last.update(record)
    keys = [k for k in last if k in FINAL_METRIC_KEYS or k.startswith("rewards/") and k.endswith("/mean")]
    return {k: last[k] for k in keys}


def earlier_sessions(output_dir: Path, resumed_from_step: Optional[int]) -> tuple[list[dict[str, Any]], Optional[str]]:
    """The sessions before this one, from the summary.json the last one wrote (empty for a fresh run), and a
    note when a session that led here left no summary (killed before it could write one)."""
    if resumed_from_step is None:
        return [], None
    old = read_record(output_dir / "summary.json")
    if old is None:
        return [], (f"a session before step {resumed_from_step} left no readable summary.json (killed?); "
                    "wall_time_s counts only the sessions listed")
    sessions = old.get("sessions") or [{key: old.get(key) for key in ("status", "steps", "wall_time_s")}]
    note = old.get("wall_time_note")
    if int(old.get("steps") or 0) < resumed_from_step:
        note = (f"the session(s) that trained steps {old.get('steps')}..{resumed_from_step} left no summary.json "
                "(killed?); wall_time_s counts only the sessions listed")
    return list(sessions), note


def write_summary(output_dir: Path, *, status: str, reason: Optional[str], steps: int, wall_time_s: float,
                  eval_before: Optional[dict], eval_after: Optional[dict], warnings: list[str],
                  health: Optional[dict[str, Any]] = None, plot_settings: Optional[dict[str, Any]] = None,
                  draw_plots: bool = True,
                  resumed_from_step: Optional[int] = None, best: Optional[dict[str, Any]] = None,
                  rollbacks: Optional[list[dict[str, Any]]] = None,
                  resume_changes: Optional[dict[str, list[Any]]] = None) -> dict[str, Any]:
    """summary.json. `wall_time_s` is the whole run's: this session's plus the earlier ones' of a resumed run
    (listed in `sessions`). `resume_changes` ({field: [old, new]}, pipeline/run/resume.py resume_changes):
    the schedule settings this session resumed under and applied, recorded in its entry of `sessions`."""
    sessions, note = earlier_sessions(output_dir, resumed_from_step)
    sessions.append({"status": status, "steps": steps, "wall_time_s": round(wall_time_s, 1),
                     **({"resumed_from_step": resumed_from_step} if resumed_from_step is not None else {}),
                     **({"applied_on_resume": resume_changes} if resume_changes else {})})

    # one reader for metrics.jsonl: rows merged per step, a torn last line skipped with a warning
    metrics_path = output_dir / METRICS_FILE
    records = list(read_metrics(metrics_path).values()) if metrics_path.is_file() else []
    plots = [str(p) for p in plot_run(output_dir, **(plot_settings or {}))] if records and draw_plots else []
    summary = {
        "status": status,
        "stop_reason": reason if reason else ("completed" if status == "completed" else None),
        "steps": steps,
        "wall_time_s": round(sum(float(x.get("wall_time_s") or 0) for x in sessions), 1),
        "sessions": sessions,
        **({"wall_time_note": note} if note else {}),
        "eval_before": _strip_samples(eval_before),
        "eval_after": _strip_samples(eval_after),
        "accuracy_gain_points": (round(100 * (eval_after["accuracy"] - eval_before["accuracy"]), 1)
                                 if eval_before and eval_after else None),
        "final_metrics": final_metrics(records),
        # eval_steps: the best held-out accuracy during training and its step; the adapter is in best_lora/
        "best": {"step": best["step"], "accuracy": best["accuracy"]} if best else None,
        "health_warnings": warnings,
        "rollbacks": rollbacks or [],  # on_collapse: rollback: each restore (rule, steps, checkpoint, learning rate)
        "health": health or {},
        "plots": plots,
        "plot_settings": plot_settings or {},  # what `grpo plot` draws this run's plots with, later
    }
    atomic_write_json(output_dir / "summary.json", summary)
    return summary


def _strip_samples(result: Optional[dict]) -> Optional[dict]:
    return None if result is None else {k: v for k, v in result.items() if k != "samples"}
