"""The fault table (tests/fault_table.py), one test per case (its id the case's name), each through the real CLI
entry point `grpo_pipeline.pipeline.cli.main` (the cases that hide a package, and a few cases as a user runs them, through
`python -m grpo_pipeline.pipeline` in a fresh process that cannot see the hidden packages: one process for all of them,
`ONE_PROCESS`).

Every case must end with the expected exit code, one message naming the field or file (the expected
text) and no traceback (fault_kit.judge), and leave its folder as the case says (nothing half-written).
"""

import json
import os
import subprocess
import sys

import fault_kit
import pytest
from fault_table import CASES

from grpo_pipeline.pipeline import cli


def run_in_process(case, folder, monkeypatch, capsys):
    for key, value in {**fault_kit.OFFLINE_ENV, **case.env}.items():
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


# The cases run as `python -m grpo_pipeline.pipeline` runs them, in one fresh process (each a fresh process would cost a start of
# torch, transformers and TRL, ~10 s): those that hide a package (only a process that never saw it can not see it),
# and a few of the others as a user runs them (test_fault_through_python_m_pipeline).
AS_A_USER = ("empty data file", "--resume unknown word")
ONE_PROCESS = [c for c in CASES if c.hide] + [c for c in CASES if c.name in AS_A_USER]

# In that process, each case as `python -m grpo_pipeline.pipeline ARGV` in its own folder: the `pipeline` module run as __main__
# (runpy, what `-m` does), its exit status, and all it wrote to the file descriptors 1 and 2 (what a subprocess's
# caller reads); an exception escaping it is printed into that output (a traceback, as Python prints it).
_AS_PYTHON_M = """\
import json, os, runpy, sys, tempfile, traceback

results = []
for folder, argv in json.loads(sys.argv[1]):
    os.chdir(folder)
    sys.stdout.flush(); sys.stderr.flush()
    with tempfile.TemporaryFile("w+", encoding="utf-8") as out:
        kept = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1); os.dup2(out.fileno(), 2)
        sys.argv = ["pipeline", *argv]
        try:
            runpy.run_module("pipeline", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(kept[0], 1); os.dup2(kept[1], 2)
            os.close(kept[0]); os.close(kept[1])
        out.seek(0)
        results.append([code, out.read()])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """{case name: (exit code, output, folder)} for ONE_PROCESS, run in one fresh process that cannot see any package
    a case hides (fault_kit.hidden_env: the path finder skips them, installed or not)."""
    root = tmp_path_factory.mktemp("one-process")
    folders = {case.name: root / f"case-{i}" for i, case in enumerate(ONE_PROCESS)}
    cases = []
    for case in ONE_PROCESS:
        folders[case.name].mkdir()
        assert not case.env and case.patch is None, case.name  # one environment for all; nothing patched
        cases.append([str(folders[case.name]), case.setup(folders[case.name])])
    hidden = tuple(sorted({name for case in ONE_PROCESS for name in case.hide}))
    env = {**os.environ, **fault_kit.OFFLINE_ENV, **fault_kit.hidden_env(hidden, root)}
    done = subprocess.run([sys.executable, "-c", _AS_PYTHON_M, json.dumps(cases)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    # the process itself ended cleanly (nothing at exit) after the cases, each of which it answered
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert len(results) == len(ONE_PROCESS)
    return {case.name: (code, output, folders[case.name]) for case, (code, output) in zip(ONE_PROCESS, results)}


# The cases that read one_process share test_fault_through_the_python_m_pipeline_module's xdist group (conftest names
# it after the module): a module-scoped fixture lives while its module's tests run back to back, and these, sent apart
# from the group, had the fresh process started a second time (~7 s).
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xdist_group("test_faults")) if c.hide else c
                                  for c in CASES], ids=[c.name for c in CASES])
def test_fault_is_one_clear_message(case, tmp_path, monkeypatch, capsys, request):
    folder = tmp_path
    if case.hide:  # a package hidden whether installed or not: only a fresh process can not see it
        code, output, folder = request.getfixturevalue("one_process")[case.name]
    else:
        code, output = run_in_process(case, folder, monkeypatch, capsys)
    problem = fault_kit.judge(case, code, output, folder)
    assert problem is None, (problem, output[-3000:])


def test_check_prints_every_check_as_json(tmp_path, monkeypatch, capsys):
    import json

    monkeypatch.chdir(tmp_path)
    argv = fault_kit.data_file(tmp_path, b'{"question": "1+1?", "answer": "2"}\n{"question": "x\n')
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
    monkeypatch.setattr("grpo_pipeline.pipeline.data.tokenizer.load_tokenizer", lambda *a, **k: asked.append(a))
    monkeypatch.chdir(tmp_path)
    assert cli.main(fault_kit.train(tmp_path, "", "--resume", "latest")) == 2
    assert asked == []
    assert "neither auto, never nor" in capsys.readouterr().err


def test_fault_through_python_m_pipeline(tmp_path):
    """A case as a user runs it: `python -m grpo_pipeline.pipeline` itself, a process of its own (the one that stops before torch
    loads): same exit code and message, no traceback."""
    case = next(c for c in CASES if c.name == "YAML syntax error")
    code, output = fault_kit.run_subprocess(case, tmp_path)
    assert fault_kit.judge(case, code, output, tmp_path) is None, output[-3000:]


@pytest.mark.parametrize("name", AS_A_USER)
def test_fault_through_the_python_m_pipeline_module(name, one_process):
    """Cases that load torch, transformers and TRL before they stop, as `python -m grpo_pipeline.pipeline` runs them, outside the
    test process (ONE_PROCESS: the same module, in one fresh process): same exit code and message."""
    case = next(c for c in CASES if c.name == name)
    code, output, folder = one_process[name]
    assert fault_kit.judge(case, code, output, folder) is None, output[-3000:]
