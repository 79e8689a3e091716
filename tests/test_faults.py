"""The fault table (bench/faults.py), each case through the real CLI entry point `pipeline.cli.main` (a case
that hides a package, through `python -m pipeline` in a subprocess that cannot see it).

Every case must end with the expected exit code, one message naming the field or file (the expected
text) and no traceback. `python bench/faults.py` runs the same table in subprocesses and counts.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

from pipeline import cli

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_faults", ROOT / "bench" / "faults.py")
faults = importlib.util.module_from_spec(_spec)
sys.modules["bench_faults"] = faults
_spec.loader.exec_module(faults)


def run_in_process(case, folder, monkeypatch, capsys):
    for key, value in {**faults.OFFLINE_ENV, **case.env}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(folder)
    argv = case.setup(folder)
    if case.patch is not None:
        case.patch(monkeypatch, folder)
    try:
        code = cli.main(argv)
    except SystemExit as stop:  # argparse's own exits
        code = stop.code
    except Exception as err:  # noqa: BLE001 -- an escaped exception is exactly what this test looks for
        pytest.fail(f"{case.name}: raised {type(err).__name__}: {err}")
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("case", faults.CASES, ids=[c.name for c in faults.CASES])
def test_fault_is_one_clear_message(case, tmp_path, monkeypatch, capsys):
    if case.hide:  # a package hidden whether installed or not: only a fresh process can not see it
        code, output = faults.run_subprocess(case, tmp_path)
    else:
        code, output = run_in_process(case, tmp_path, monkeypatch, capsys)
    problem = faults.judge(case, code, output, tmp_path)
    assert problem is None, (problem, output[-3000:])


def test_check_prints_every_check_as_json(tmp_path, monkeypatch, capsys):
    import json

    monkeypatch.chdir(tmp_path)
    argv = faults.data_file(tmp_path, b'{"question": "1+1?", "answer": "2"}\n{"question": "x\n')
    assert cli.main([*argv, "--check", "--resume", "latest"]) == 2
    report = json.loads(capsys.readouterr().out)
    by_name = {c["name"]: c for c in report["checks"]}
    assert report["ok"] is False
    assert set(by_name) == {"nodes", "config", "trl", "effective_config", "output_dir", "packages", "gpu", "model", "memory",
                            "resume", "data", "eval", "warmup", "rewards", "agents", "lora", "engine"}
    assert not by_name["rewards"]["ok"] and "the data check failed" in by_name["rewards"]["message"]
    assert not by_name["data"]["ok"] and "line 2" in by_name["data"]["message"]
    assert not by_name["resume"]["ok"] and by_name["config"]["ok"] and by_name["output_dir"]["ok"]
    assert not (tmp_path / "run").exists()  # --check writes nothing


def test_check_refuses_before_loading_any_model(tmp_path, monkeypatch, capsys):
    """A failing pre-load check stops `grpo train` before the tokenizer (and so the model) is asked for."""
    asked = []
    monkeypatch.setattr("pipeline.data.tokenizer.load_tokenizer", lambda *a, **k: asked.append(a))
    monkeypatch.chdir(tmp_path)
    assert cli.main(faults.train(tmp_path, "", "--resume", "latest")) == 2
    assert asked == []
    assert "neither auto, never nor" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["YAML syntax error", "empty data file", "--resume unknown word"])
def test_fault_through_python_m_pipeline(name, tmp_path):
    """A few cases as a user runs them (`python -m pipeline`, a fresh process): same exit code and message."""
    case = next(c for c in faults.CASES if c.name == name)
    code, output = faults.run_subprocess(case, tmp_path)
    assert faults.judge(case, code, output, tmp_path) is None, output[-3000:]
