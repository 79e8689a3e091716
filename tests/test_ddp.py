"""Data-parallel CPU training through the pipeline (gloo): two machines of one process each (killed and resumed),
and two processes of one machine (a reward failing on one)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from grpo_pipeline.pipeline.train import run_training
from train_helpers import demo_config

ROOT = Path(__file__).resolve().parents[1]
TWO_MACHINES = ROOT / "configs" / "accelerate" / "cpu_2machines.yaml"
pytestmark = pytest.mark.slow


def _two_processes(tmp_path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(ROOT / "tests" / "ddp_worker.py"), str(tmp_path), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _machine(tmp_path, rank: int, port: int, mode: str) -> tuple[subprocess.Popen, Path]:
    """One "machine" of configs/accelerate/cpu_2machines.yaml: its own accelerate launcher (torchrun underneath),
    started as a user starts each node, in its own session so the test can kill it whole."""
    log = tmp_path / f"machine{rank}-{mode}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(TWO_MACHINES),
         "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
         str(ROOT / "tests" / "ddp_worker.py"), str(tmp_path), mode],
        cwd=tmp_path, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def _two_machines(tmp_path, mode: str, until: str | None = None, timeout: int = 420) -> list[str]:
    """Both machines launched; each one's output once both exited (or, with `until`, once both printed it; then
    their training processes, which torchrun starts in sessions of their own, and launchers are killed with SIGKILL,
    as a crash would)."""
    port = _free_port()
    machines = [_machine(tmp_path, rank, port, mode) for rank in (0, 1)]
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            outputs = [log.read_text() for _, log in machines]
            if until and all(until in out for out in outputs):
                for pid in re.findall(r"waiting to be killed \(pid (\d+)\)", "".join(outputs)):
                    os.kill(int(pid), signal.SIGKILL)
                return outputs
            if all(proc.poll() is not None for proc, _ in machines):
                assert not until, f"exited before {until!r}:\n" + "\n".join(out[-3000:] for out in outputs)
                return outputs
            time.sleep(0.2)  # two small files read: the kill or the exit is seen within 0.2 s, not up to 1 s
        raise AssertionError(f"{mode}: not done in {timeout} s:\n" + "\n".join(log.read_text()[-3000:]
                                                                            for _, log in machines))
    finally:
        for proc, _ in machines:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


# torch's elastic agent logs, traceback and all, an exit barrier that failed because the other machine's agent (the
# store's host) had already gone: after both runs completed (torch/distributed/elastic/agent/server/api.py
# _exit_barrier, logger.exception; seen once, on a loaded machine). torch's output about its own race, not the product's.
_EXIT_BARRIER_LOG = re.compile(r"^[EWI]\d{4} [^\n]*torch/distributed/elastic/agent/server/api\.py:\d+\][^\n]*\n?", re.M)


def _ours(output: str) -> str:
    """What the launch printed, less torch's log of a failed exit barrier (when that is what it logged)."""
    return _EXIT_BARRIER_LOG.sub("", output) if "Error waiting on exit barrier" in output else output


def _seen(folder: Path) -> dict[int, list[str]]:
    """step -> the prompts scored at that step, by every rank (and launch) whose record is in `folder`."""
    steps: dict[int, list[str]] = {}
    for path in folder.glob("seen-rank*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault(record["step"], []).extend(record["prompts"])
    return {step: sorted(prompts) for step, prompts in steps.items()}


def test_two_machines_train_are_killed_resume_and_agree(tmp_path, monkeypatch):
    """2 machines x 1 process (configs/accelerate/cpu_2machines.yaml: gloo, 127.0.0.1, machine_rank 0 and 1):
    a 2-step format warm-up, an eval before, checkpoint-2, SIGKILL, resume to step 3 (and an eval after). The ranks end with identical adapters, only rank 0 wrote the run folder
    (rank 1: its own RNG state in the checkpoint, as transformers saves it, and the check's writability probe), and the prompts of each step, over both
    ranks and both launches, are those of one process training the same global batch (8 completions)."""
    _two_machines(tmp_path, "hang-after-checkpoint", until="checkpoint-2 saved, waiting to be killed")
    assert (tmp_path / "run" / "checkpoint-2" / "trainer_state.json").is_file()
    assert not (tmp_path / "run" / "lora").exists()
    assert (tmp_path / "run" / "warmup" / "adapter_config.json").is_file()  # one writer: the run went on
    assert (tmp_path / "run" / "eval_before.json").is_file()
    outputs = _two_machines(tmp_path, "resume")
    assert "rank 0 of 2: completed after 3 steps" in outputs[0], outputs[0][-4000:]
    assert "rank 1 of 2: completed after 3 steps" in outputs[1], outputs[1][-4000:]
    assert "checkpoint-2" in outputs[0] and "Traceback" not in _ours("".join(outputs))

    rank0 = load_file(str(tmp_path / "rank0.safetensors"))
    rank1 = load_file(str(tmp_path / "rank1.safetensors"))
    assert rank0.keys() == rank1.keys() and rank0
    for name in rank0:
        assert (rank0[name] == rank1[name]).all(), f"ranks disagree on {name}"
    # The ranks trained (the adapter moved away from its zero-initialised B matrices) ...
    assert any(name.endswith("lora_B.default.weight") and rank0[name].abs().sum() > 0 for name in rank0)
    # ... only rank 0 wrote the run's files ...
    assert (tmp_path / "run" / "lora" / "adapter_config.json").is_file()
    assert (tmp_path / "run" / "summary.json").is_file()
    for launch in ("hang-after-checkpoint", "resume"):
        assert json.loads((tmp_path / f"writes-rank0-{launch}.json").read_text())
        rank1_writes = json.loads((tmp_path / f"writes-rank1-{launch}.json").read_text())
        # rank 1's own: the writability probe of the check (created and removed) and, inside a checkpoint being
        # staged, the folder its RNG state goes to (rng_state_1.pth, written by torch.save's C++ writer)
        assert all(path.startswith((".grpo-write-test-", ".checkpoint-")) for path in rank1_writes), rank1_writes
    # ... and the data seen is a one-machine run's of the same global batch (1 process x 8 completions).
    reference = tmp_path / "one-machine"
    reference.mkdir()
    monkeypatch.setenv("GRPO_SEEN_DIR", str(reference))
    result = run_training(demo_config(reference / "run", max_steps=3, save_steps=100, num_generations=4,
                                      per_device_train_batch_size=8, learning_rate=1e-2, resume="never",
                                      reward_funcs=["correctness", "train_helpers:record_seen"]))
    assert result.status == "completed"
    seen, expected = _seen(tmp_path), _seen(reference)
    assert sorted(expected) == [0, 1, 2] and seen == expected


def test_a_reward_failing_on_one_process_stops_every_process_with_its_message(tmp_path):
    """Raised inside TRL's reward loop on process 1 only, the failure used to leave process 0 waiting in the
    loop's gather (until the collective timed out); both must stop after step 1, naming the reward and process."""

    proc = _two_processes(tmp_path, "reward-fails-on-process-1", timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "rank 0 of 2: stopped after 1 steps" in output and "rank 1 of 2: stopped after 1 steps" in output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "stopped" and "step 2" in summary["stop_reason"]
    assert "`fails_on_process_1` raised ValueError: no answer column on this shard" in summary["stop_reason"]
    assert "(on process 1 of 2)" in summary["stop_reason"]
    assert (tmp_path / "run" / "checkpoint-1" / "trainer_state.json").is_file()
    assert "Traceback" not in _ours(output)
