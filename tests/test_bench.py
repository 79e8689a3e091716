"""The benches at tiny size: they measure equal work, force what they say they force, and feed run_all's table.

These check the benches' logic (equal-work checks, forced lengths, the rows protocol, the GPU-report and
bench/reward_cases.py adapters), not their timings.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench import run_all
from bench.overhead import SideRun, UnequalWork, check_equal_work

ROOT = Path(__file__).resolve().parents[1]


def side(steps=4, length=40.0, **config):
    return SideRun(intervals=[0.1] * (steps - 1), cpu_intervals=[0.1] * (steps - 1), steps=steps, mean_completion_length=length,
                   config={"learning_rate": 2e-4, "gradient_checkpointing": False, "output_dir": "/a",
                           "reward_weights": [1.0], **config})


def test_equal_work_allows_only_the_output_folder_and_the_observers_weight_to_differ():
    check_equal_work(side(), side(output_dir="/b", reward_weights=[1.0, 0.0]), "round 1")
    with pytest.raises(UnequalWork, match="gradient_checkpointing"):
        check_equal_work(side(), side(gradient_checkpointing=True), "round 1")


def test_equal_work_fails_on_different_step_counts_or_completion_lengths():
    with pytest.raises(UnequalWork, match="bare TRL completed 20 steps, the pipeline 3"):
        check_equal_work(side(steps=20), side(steps=3), "round 1")
    with pytest.raises(UnequalWork, match="mean completion length"):
        check_equal_work(side(length=40.0), side(length=20.0), "round 1")


def test_overhead_runs_both_sides_to_the_same_step_with_the_same_config():
    from bench.overhead import measure

    lines: list[str] = []
    result = measure(rounds=1, steps=3, log=lines.append)  # raises UnequalWork if the sides differ
    assert len(result["bare"]) == len(result["ours"]) == 2  # 3 steps -> 2 step intervals per side
    assert result["ratio"] > 0 and len(result["round_ratios"]) == 1
    assert result["mean_completion_length"] > 0
    assert lines and "3 steps each" in lines[0]


def test_pipeline_side_uses_build_trainers_config_on_cpu():
    """The config both sides share is the pipeline's: no gradient checkpointing on CPU, our reward weights."""
    from bench.overhead import bench_config, prepare, run_bare

    cfg = bench_config(2)
    bare = run_bare(cfg, prepare(cfg))
    assert bare.steps == 2
    assert bare.config["gradient_checkpointing"] is False
    assert bare.config["max_completion_length"] == 64
    assert len(bare.config["reward_weights"]) == len(cfg.grpo.reward_funcs)


def test_scaling_forces_full_length_and_splits_the_step_into_its_parts():
    from bench.scaling import PARTS, run_setting

    result = run_setting(generations=2, length=8, prompts=1, steps=3)
    assert result["samples"] == 2 and result["completions"] == 2  # step 1 is the warm-up
    for part in PARTS:
        assert result[part] > 0, part  # every part was timed on the step's real call path
    parts_sum = sum(result[p] for p in (*PARTS, "other"))
    assert math.isclose(parts_sum, result["step"], rel_tol=0.5)


def test_affine_fit_recovers_a_known_line():
    from bench.scaling import fit

    intercept, slope = fit([16, 32, 64], [85 + 5.2 * x for x in (16, 32, 64)])
    assert intercept == pytest.approx(85) and slope == pytest.approx(5.2)


def test_rewards_rows_follow_the_protocol_and_judge_cpu_time():
    from bench import reward_cases as rewards_bench

    (row,) = rewards_bench.rows(n=200, repeats=1)
    assert set(row) == set(run_all.ROW_KEYS)
    cpu = float(row["value"].split(" s CPU")[0])
    assert row["holds"] is (cpu < rewards_bench.TARGET_S) and row["samples"] == "best of 1 x 200 completions"


def test_gpu_report_rows_come_from_the_newest_report(tmp_path):
    rows, note = run_all.gpu_report_rows(tmp_path / "missing")
    assert rows == [] and note.startswith("no GPU report")

    old = tmp_path / "a-old.json"
    old.write_text(json.dumps({"bench_rows": [{"figure": "old", "value": 1, "target": "x", "holds": True}]}))
    new = tmp_path / "b-new.json"
    new.write_text(json.dumps({"bench_rows": [
        {"figure": "step time", "value": "1.9 s", "target": "< 3 s", "holds": True},
        {"figure": "no target key"}]}))
    rows, note = run_all.gpu_report_rows(tmp_path)
    assert [r["figure"] for r in rows] == ["step time"]
    assert "b-new.json" in note and "1 malformed" in note

    new.write_text(json.dumps({"steps": 3}))
    rows, note = run_all.gpu_report_rows(tmp_path)
    assert rows == [] and 'no top-level "bench_rows"' in note


def test_run_all_prints_one_table_with_each_figure_its_target_and_whether_it_holds(tmp_path):
    reports = tmp_path / "gpu-reports"
    reports.mkdir()
    (reports / "run.json").write_text(json.dumps(
        {"bench_rows": [{"figure": "GPU step time", "value": "0.8 s", "target": "< 2 s", "holds": False}]}))
    done = subprocess.run([sys.executable, "bench/run_all.py", "--only", "data", "--gpu-reports", str(reports)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("bench "))
    assert header.split() == ["bench", "figure", "value", "target", "holds", "samples"]
    data_row = next(line for line in lines if line.startswith("data "))
    assert "length check, 7500 prompts" in data_row and "< 3 s" in data_row and "3 runs x 7500" in data_row
    gpu_row = next(line for line in lines if line.startswith("gpu "))
    assert "GPU step time" in gpu_row and " NO " in gpu_row
    # The data figure's yes/NO depends on this machine's load; the count must agree with the table.
    missed = sum(1 for line in (data_row, gpu_row) if " NO " in line)
    assert f"2 figures, {missed} targets missed, 0 benches failed" in done.stdout


def test_real_model_bench_help_runs_nothing_and_its_step_split_adds_up():
    """bench/real_model.py --help prints its parts and exits before any model loads; a step's split is TRL's
    profiling blocks: generation and rewards inside _prepare_inputs, the loss and backward the rest of the step."""
    from bench.real_model import Timings

    done = subprocess.run([sys.executable, "bench/real_model.py", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "eval,speed,steps,learn,all" in done.stdout and "load average" not in done.stdout
    timings = Timings()
    timings.by_step[0].update({"transformers.generate": 6.0, "_calculate_rewards": 0.5, "_prepare_inputs": 8.0,
                               "training_step": 11.0})
    (row,) = timings.split()
    assert row == {"step": 1, "total": 11.0, "generation": 6.0, "rewards": 0.5, "other_prepare": 1.5,
                   "loss_backward": 3.0}
