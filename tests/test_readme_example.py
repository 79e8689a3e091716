"""The README's own-data / own-reward example, run exactly as written: its files, its commands, its output."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
START, END = "## Train on your own data", "\n## "
FENCE = re.compile(r"(?P<intro>[^\n]*)\n\n```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
FILE_INTRO = re.compile(r"^`(?P<name>[\w.-]+\.\w+)`.*:$")


def example_text() -> str:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index(START)
    second = readme.index("## Write your own reward", start)
    return readme[start: readme.index(END, second + 3)]


def example_parts() -> tuple[dict[str, str], list[str], list[str]]:
    """(files by name, the commands of the bash block, the lines of the printed-output block)."""
    files, commands, printed = {}, [], []
    for block in FENCE.finditer(example_text()):
        intro = block["intro"].strip()
        named = FILE_INTRO.match(intro)
        if named:
            files[named["name"]] = block["body"]
        elif block["lang"] == "bash":
            commands = [line for line in block["body"].splitlines() if line.strip()]
        elif intro.endswith("prints:"):
            printed = [line for line in block["body"].splitlines() if line.strip()]
    return files, commands, printed


def test_the_example_has_its_files_commands_and_output():
    files, commands, printed = example_parts()
    assert set(files) == {"my.jsonl", "my.yaml", "my_rewards.py"}
    assert any("--check" in c for c in commands) and printed
    assert len(example_text().splitlines()) <= 70  # compact, as promised


def _grpo() -> list[str]:
    script = shutil.which("grpo")  # the installed console script, as a user runs it
    return [script] if script else [sys.executable, "-m", "grpo_pipeline.pipeline"]


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path):
    files, commands, printed = example_parts()
    for name, body in files.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    outputs = []
    for command in commands:
        argv = shlex.split(command, comments=True)
        assert argv[0] == "grpo"
        proc = subprocess.run(_grpo() + argv[1:], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, (command, proc.stdout[-3000:], proc.stderr[-3000:])
        assert "Traceback" not in proc.stderr
        outputs.append(proc.stdout)
    report = json.loads(outputs[0])
    assert report["ok"] and {"rewards", "lora"} <= {c["name"] for c in report["checks"]}
    rewards = next(c for c in report["checks"] if c["name"] == "rewards")["message"]
    assert "mentions_answer: [1, 0, 1, 0, ...]" in rewards  # what the README says --check shows
    for line in printed:
        for fragment in line.split("..."):
            assert fragment.strip() in outputs[-1], (line, outputs[-1])
    metrics = json.loads((tmp_path / "runs/mine/metrics.jsonl").read_text().splitlines()[0])
    assert {"rewards/mentions_answer/mean", "rewards/mentions_answer/none_frac"} <= set(metrics)


def _trl_doc_example(doc: str) -> tuple[dict[str, str], list[str], str]:
    """docs/coming-from-trl*.md's "Try it": (its files by name, its two commands, the section's text)."""
    text = (REPO_ROOT / doc).read_text(encoding="utf-8")
    start = text.index("\n## ") + 1
    section = text[start: text.index("\n## ", start + 3)]
    files, commands = {}, []
    for block in FENCE.finditer(section):
        named = re.match(r"^`(?P<name>[\w.-]+\.\w+)`.*[:：]$", block["intro"].strip())  # ：in Chinese
        if named:
            files[named["name"]] = block["body"]
        elif block["lang"] == "bash":
            commands = [line for line in block["body"].splitlines() if line.strip()]
    assert set(files) == {"trl.jsonl", "trl.yaml"} and len(commands) == 2, (doc, files, commands)
    return files, commands, section


def _said(section: str) -> list[str]:
    """What the section says `--check` prints: its `prompts: ...` and `trl: ...` lines."""
    return re.findall(r"`((?:prompts|trl): [^`]+)`", section.replace("\n", " "))


def test_the_chinese_trl_example_is_the_english_one_as_data():
    """The Chinese page's example differs from the English one only in its YAML comments: the same rows, the same
    recipe once read, the same commands and the same promised output. So the run below, of the English page's
    files, is the run of both."""
    import yaml

    en_files, en_commands, en_section = _trl_doc_example("docs/coming-from-trl.md")
    zh_files, zh_commands, zh_section = _trl_doc_example("docs/coming-from-trl.zh-CN.md")
    assert zh_files["trl.jsonl"] == en_files["trl.jsonl"] and zh_commands == en_commands
    assert yaml.safe_load(zh_files["trl.yaml"]) == yaml.safe_load(en_files["trl.yaml"])
    assert _said(zh_section) == _said(en_section) and len(_said(en_section)) == 2


@pytest.mark.slow
def test_the_trl_format_example_checks_and_trains_as_written(tmp_path):
    """docs/coming-from-trl.md's "Try it" (README links it from "Train on your own data"; the Chinese page holds
    the same example, above): its two files and its two commands, as written; what --check says it prints, it
    prints."""
    files, commands, section = _trl_doc_example("docs/coming-from-trl.md")
    for name, body in files.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    outputs = []
    for command in commands:
        argv = shlex.split(command)
        proc = subprocess.run(_grpo() + argv[1:], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (command, proc.stdout[-3000:], proc.stderr[-3000:])
        outputs.append(proc.stdout)
    said = _said(section)
    checks = {c["name"]: c["message"] for c in json.loads(outputs[0])["checks"]}
    assert len(said) == 2 and said[0].split(": ", 1)[1] in checks["data"].replace("\n", " ")
    assert said[1].split(": ", 1)[1] == checks["trl"], (said[1], checks["trl"])
    metrics = json.loads((tmp_path / "runs/trl/metrics.jsonl").read_text().splitlines()[0])
    assert "rewards/accuracy_reward/mean" in metrics
