"""`grpo data`: prints the data report (table or JSON) and writes data_report.json, loading only the tokenizer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_pipeline.pipeline import cli
from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer as REAL_LOAD_TOKENIZER
from grpo_pipeline.pipeline.data_command import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def tokenizer_requests(qwen_tokenizer, monkeypatch):
    """In-process calls get the session's tokenizer instead of loading it again (~3-10 s each);
    the names `grpo data` asks for are recorded. The demo test and the subprocess run the real loader."""
    requested = []

    def load_tokenizer(name, trust_remote_code=False, source="hf"):
        requested.append(name)
        return qwen_tokenizer

    monkeypatch.setattr("grpo_pipeline.pipeline.data.tokenizer.load_tokenizer", load_tokenizer)
    return requested


def write_config(tmp_path, **values):
    config = {"dataset_name": "sample", "model_name_or_path": "bundled:qwen2.5",
              "output_dir": str(tmp_path / "run"), "data_cache_dir": str(tmp_path / "cache"), **values}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


def test_json_output_matches_the_written_report(tmp_path, capsys, tokenizer_requests):
    recipe = write_config(tmp_path)
    assert main(["--config", str(recipe), "--json", "--max_samples", "20"]) == 0
    assert tokenizer_requests == ["bundled:qwen2.5"]  # the config's model name; a tokenizer, no model
    printed = json.loads(capsys.readouterr().out)
    assert (printed["rows_in"], printed["rows_kept"], printed["rows_unused_max_samples"]) == (50, 20, 30)
    assert printed["limits"]["max_prompt_length"] + printed["limits"]["max_completion_length"] == 1024
    on_disk = json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))
    assert on_disk["fingerprint"] == printed["fingerprint"] and on_disk["rows_kept"] == 20


def test_table_output_shows_rows_lengths_and_limits(tmp_path, capsys):
    recipe = write_config(tmp_path, max_prompt_length="64")
    assert main(["--config", str(recipe)]) == 0
    out = capsys.readouterr().out
    for text in ("rows in", "rows kept", "prompt_too_long", "p90", "p99", "max_prompt_length", "max_completion_length",
                 "built and saved"):
        assert text in out, text
    assert main(["--config", str(recipe)]) == 0
    assert "hit (no re-tokenization)" in capsys.readouterr().out


# Each way the data cannot be used as configured (prepare.py's DataError): the file, the settings, the rejected id the
# report lists and what the message names.
UNUSABLE = [
    ("strict", '{"question": "Q?", "answer": "#### 1"}\n{"question": "", "answer": "2"}\n', {"strict": True},
     ("empty_question", "train-1"), "strict: true"),
    ("overlong_policy error", '{"question": "Q?", "answer": "1"}\n{"question": "' + "long " * 80 + '", "answer": "2"}\n',
     {"overlong_policy": "error", "max_prompt_length": 64}, ("prompt_too_long", "train-1"), "overlong_policy"),
    ("no rows left", '{"question": "", "answer": "1"}\n{"question": null, "answer": "2"}\n', {},
     ("empty_question", "train-0"), "no rows left"),
]


@pytest.mark.parametrize("name,text,settings,rejected,says", UNUSABLE, ids=[case[0] for case in UNUSABLE])
def test_unusable_data_exits_2_as_grpo_train_does_and_still_prints_the_report(tmp_path, capsys, name, text, settings,
                                                                              rejected, says):
    """Bad input, exit 2 (1 is a bug's): `grpo data` prints the report first, then the reason; `grpo train --check`
    refuses the same data with the same status."""
    data = tmp_path / "d.jsonl"
    data.write_text(text, encoding="utf-8")
    recipe = write_config(tmp_path, dataset_name=str(data), sft_warmup_steps=0, eval_before=False, eval_after=False,
                          **settings)
    assert main(["--config", str(recipe), "--json"]) == 2
    captured = capsys.readouterr()
    reason, row_id = rejected
    assert row_id in json.loads(captured.out)["rows_rejected"][reason]["ids"]
    assert says in captured.err and "Traceback" not in captured.err
    assert cli.main(["train", "--config", str(recipe), "--check"]) == 2
    out = capsys.readouterr().out
    checks = {c["name"]: c for c in json.JSONDecoder().raw_decode(out[out.index("{"):])[0]["checks"]}
    assert not checks["data"]["ok"] and says in checks["data"]["message"], checks["data"]


def test_config_error_exits_2_naming_the_field(tmp_path, capsys):
    recipe = write_config(tmp_path, max_prompt_length="8")
    assert main(["--config", str(recipe)]) == 2
    assert "max_prompt_length" in capsys.readouterr().err


def test_unreadable_data_exits_2_with_the_reason(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    assert main(["--config", str(write_config(tmp_path, dataset_name=str(empty)))]) == 2
    assert "is empty" in capsys.readouterr().err


# `python -m grpo_pipeline.pipeline data --config RECIPE --json` in a process of its own (the real loader; stdout is the JSON alone):
# tests/test_config_plumbing.py test_process_substitution_works_through_the_command_line, with the recipe given as
# `<(...)` in a real shell (one process for both).


def run_cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "grpo_pipeline.pipeline", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=180)


def test_data_help_is_its_own_and_documents_the_offline_names(tmp_path):
    shown = run_cli("data", "--help", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: grpo data")
    assert "bundled:qwen2.5" in shown.stdout and "--learning_rate" not in shown.stdout


def run_in_process(argv, capsys):
    """`grpo ARGV` through grpo_pipeline.pipeline.cli.main in this process: (exit status, stdout, stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as stop:  # argparse's own exits
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def no_gpu_here(tmp_path, monkeypatch):
    """As run_cli's subprocess: in tmp_path, no GPU visible, 80 columns (argparse's width without a terminal)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("COLUMNS", "80")


def test_data_without_options_prepares_the_cpu_demo_offline(tmp_path, monkeypatch, capsys):
    """In this process (the `grpo` process: test_data_help_is_its_own... and tests/test_config_plumbing.py), with the
    real tokenizer loader, offline (tests/conftest.py)."""
    no_gpu_here(tmp_path, monkeypatch)
    monkeypatch.setattr("grpo_pipeline.pipeline.data.tokenizer.load_tokenizer", REAL_LOAD_TOKENIZER)
    code, out, err = run_in_process(["data", "--json"], capsys)  # no GPU here: the demo's data, no hub
    assert code == 0, err[-3000:]
    assert json.loads(out)["rows_kept"] > 0 and "Traceback" not in err
    assert (tmp_path / "outputs" / "cpu-demo" / "data_report.json").is_file()


def test_train_help_lists_config_and_the_defaults_that_apply_here(tmp_path, monkeypatch, capsys):
    no_gpu_here(tmp_path, monkeypatch)
    code, shown, _ = run_in_process(["train", "--help"], capsys)
    assert code == 0 and "--config YAML" in shown
    assert shown.startswith("defaults shown below: the built-in tiny CPU demo")
    from grpo_pipeline.pipeline.demo.registry import cpu_demo_config

    import re

    shown_default = re.search(r"\n  --max_steps MAX_STEPS, .*?\(default:\s+(\S+?)\)", shown, re.S).group(1)
    assert shown_default == str(cpu_demo_config()["max_steps"])  # the demo's, not the field's class default
    code, recipe, _ = run_in_process(["train", "--config", str(ROOT / "configs" / "qwen2.5-3b-gsm8k.yaml"), "--help"],
                                  capsys)
    assert code == 0 and "defaults shown below: the recipe" in recipe and "Qwen2.5-3B" in recipe
