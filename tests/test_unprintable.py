"""The crash handler can never crash (issue 48, class 6): pipeline/errors.py report_bug and run_command fed every
kind of unprintable value (an exception whose str or repr raises or is not text, surrogate escapes of a non-UTF-8
name, lone surrogates, control characters, a huge message, a cycle of causes, a non-UTF-8 argv, run folder and
working folder) into an ASCII-only stderr: one line, exit 1, a log file that reads back as UTF-8."""

import io
import os
import sys

import pytest

from grpo_pipeline.pipeline import errors

NOT_UTF8 = os.fsdecode(b"caf\xe9")


class StrRaises(Exception):
    def __str__(self):
        raise ValueError("no str")


class NothingWorks(Exception):
    def __str__(self):
        raise ValueError("no str")

    def __repr__(self):
        raise ValueError("no repr")


class StrNotText(Exception):
    def __str__(self):
        return 42  # type: ignore[return-value]


def cycle() -> BaseException:
    first, second = RuntimeError("first"), RuntimeError("second")
    first.__cause__, second.__cause__ = second, first
    return first


UNPRINTABLE = {
    "str raises": StrRaises("x"),
    "str and repr raise": NothingWorks(),
    "str is not text": StrNotText(),
    "surrogate escapes": RuntimeError(f"no file {NOT_UTF8}.jsonl"),
    "lone surrogate": RuntimeError("\ud800 alone"),
    "control characters": RuntimeError("a\x00b\x1b[31mred\r\n"),
    "a huge message": RuntimeError("x" * 2_000_000),
    "bytes arguments": OSError(2, b"\xff\xfe", b"/no/\xff"),
    "a cycle of causes": cycle(),
    "a non-ASCII message": RuntimeError("模型 фолдер ü"),
}


@pytest.mark.parametrize("err", list(UNPRINTABLE.values()), ids=list(UNPRINTABLE))
def test_the_crash_handler_reports_every_unprintable_value_in_one_line_and_a_log(err, tmp_path, monkeypatch):
    run_folder = tmp_path / f"run {NOT_UTF8}"
    run_folder.mkdir()
    cwd = tmp_path / NOT_UTF8
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    stderr = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")  # an ASCII locale's stderr
    monkeypatch.setattr(sys, "stderr", stderr)

    def command(argv):
        errors.note_run_folder(run_folder)
        raise err

    code = errors.run_command("train", command, ["--output_dir", str(run_folder), "--hub_token", "hf_x\ud800"])
    stderr.flush()
    printed = stderr.buffer.getvalue().decode("ascii")
    assert code == errors.EXIT_BUG
    assert "a bug in grpo-pipeline" in printed and "Traceback" not in printed
    logs = list((run_folder / "logs").iterdir())
    assert len(logs) == 1
    text = logs[0].read_bytes().decode("utf-8")  # valid UTF-8 whatever the values held
    assert "command: grpo train" in text and "hf_x" not in text  # the secret option's value masked


def test_a_user_error_with_unprintable_text_is_one_line_exit_2(monkeypatch):
    from grpo_pipeline.pipeline.config import ConfigError

    stderr = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    monkeypatch.setattr(sys, "stderr", stderr)

    def command(argv):
        raise ConfigError("dataset_name", f"{NOT_UTF8}.jsonl is missing; 模型")

    assert errors.run_command("data", command, []) == errors.EXIT_BAD_INPUT
    stderr.flush()
    assert "caf\\xe9.jsonl is missing" in stderr.buffer.getvalue().decode("ascii")
