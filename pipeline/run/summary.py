"""summary.json: how the run ended, before/after evaluation, final metrics, wall time; plus the plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.kept import read_record
from grpo_pipeline.env.paths import atomic_write_json
from grpo_pipeline.pipeline.run.plots import METRICS_FILE, plot_run, read_metrics

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
    plots = [str(p) for p in plot_run(output_dir, **(plot_settings or {}))] if records else []
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
    }
    atomic_write_json(output_dir / "summary.json", summary)
    return summary


def _strip_samples(result: Optional[dict]) -> Optional[dict]:
    return None if result is None else {k: v for k, v in result.items() if k != "samples"}
