"""The figure printer, bench/run_all.py, run as a user runs it: one table of each figure, its target and whether it
holds, from the benches' own processes and the newest GPU report.

Tests import nothing from bench/ (issue 60); the benches check their own honesty when they run (bench/overhead.py
stops on unequal work, bench/scaling.py on completions not forced to full length or a part not timed,
bench/real_model.py on a step split that does not add up), and run_all.py counts a bench that stops as failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_run_all_prints_one_table_with_each_figure_its_target_and_whether_it_holds(tmp_path):
    """Two CPU benches without torch (the prompt length check; the five rewards beside the Unsloth notebook's, which
    bench/reward_cases.py imports from tests/unsloth_notebook_rewards.py) and the newest of two GPU reports, one of
    its rows malformed."""
    reports = tmp_path / "gpu-reports"
    reports.mkdir()
    (reports / "a-old.json").write_text(json.dumps({"bench_rows": [{"figure": "old", "value": 1, "target": "x", "holds": True}]}))
    (reports / "b-new.json").write_text(json.dumps({"bench_rows": [
        {"figure": "GPU step time", "value": "0.8 s", "target": "< 2 s", "holds": False}, {"figure": "no target"}]}))
    done = subprocess.run([sys.executable, "bench/run_all.py", "--only", "data", "reward_cases", "--gpu-reports",
                           str(reports)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("bench "))
    assert header.split() == ["bench", "figure", "value", "target", "holds", "samples"]
    data_row = next(line for line in lines if line.startswith("data "))
    assert "length check, 7500 prompts" in data_row and "< 3 s" in data_row and "3 runs x 7500" in data_row
    rewards_row = next(line for line in lines if line.startswith("reward_cases "))
    assert "5 rewards on 10000 completions" in rewards_row and " s CPU, " in rewards_row
    assert "(notebook's " in rewards_row and "< 1 s CPU" in rewards_row and "best of 3 x 10000 completions" in rewards_row
    gpu_rows = [line for line in lines if line.startswith("gpu ")]
    assert len(gpu_rows) == 1 and "GPU step time" in gpu_rows[0] and " NO " in gpu_rows[0]
    assert "GPU rows from b-new.json (1 malformed rows left out)" in lines
    # The CPU figures' yes/NO depend on this machine's load; the count must agree with the table.
    missed = sum(1 for line in (data_row, rewards_row, *gpu_rows) if " NO " in line)
    assert f"3 figures, {missed} targets missed, 0 benches failed" in done.stdout
