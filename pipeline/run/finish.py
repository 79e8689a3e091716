"""The end of a run: is a resumed run already finished (its final files all written), and the closing lines
that say where everything went and the command to run next."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.adapters import AdapterError, verify_adapter_dir
from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.env.paths import shell_command
from grpo_pipeline.pipeline.demo.registry import example_question
from grpo_pipeline.pipeline.run.checkpoints import checkpoint_state
from grpo_pipeline.pipeline.run.manifest import MANIFEST_NAME, agent_options


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
    if adapter_dir is not None:
        _print("next: " + shell_command("grpo", "generate", "--lora", adapter_dir, "--prompt",
                                        example_question(dataset_name), *agent_options(tools, environment_factory)))
