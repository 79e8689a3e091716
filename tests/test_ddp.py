"""Two CPU processes (gloo) train data-parallel through the pipeline and end with identical adapters."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _two_processes(tmp_path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(ROOT / "tests" / "ddp_worker.py"), str(tmp_path), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout,
    )


def test_two_process_data_parallel_ranks_agree(tmp_path):
    proc = _two_processes(tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "rank 0 of 2: completed after 2 steps" in output and "rank 1 of 2: completed after 2 steps" in output
    rank0 = load_file(str(tmp_path / "rank0.safetensors"))
    rank1 = load_file(str(tmp_path / "rank1.safetensors"))
    assert rank0.keys() == rank1.keys() and rank0
    for name in rank0:
        assert (rank0[name] == rank1[name]).all(), f"ranks disagree on {name}"
    # The ranks trained (the adapter moved away from its zero-initialised B matrices) ...
    assert any(name.endswith("lora_B.default.weight") and rank0[name].abs().sum() > 0 for name in rank0)
    # ... and only rank 0 wrote the run's files.
    assert (tmp_path / "run" / "lora" / "adapter_config.json").is_file()
    assert (tmp_path / "run" / "summary.json").is_file()


def test_a_reward_failing_on_one_process_stops_every_process_with_its_message(tmp_path):
    """Raised inside TRL's reward loop on process 1 only, the failure used to leave process 0 waiting in the
    loop's gather (until the collective timed out); both must stop after step 1, naming the reward and process."""
    import json

    proc = _two_processes(tmp_path, "reward-fails-on-process-1", timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "rank 0 of 2: stopped after 1 steps" in output and "rank 1 of 2: stopped after 1 steps" in output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "stopped" and "step 2" in summary["stop_reason"]
    assert "`fails_on_process_1` raised ValueError: no answer column on this shard" in summary["stop_reason"]
    assert "(on process 1 of 2)" in summary["stop_reason"]
    assert (tmp_path / "run" / "checkpoint-1" / "trainer_state.json").is_file()
    assert "Traceback" not in output
