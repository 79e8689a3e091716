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


# The docs' commands, each as `grpo ARGV` typed in its example's folder: the installed console script (its own file,
# run as __main__, as the shell runs it), or `python -m grpo_pipeline.pipeline` where none is installed. All of them
# in ONE fresh process, one after the other (a process per command cost a start of torch, transformers, peft and TRL,
# ~9 s each, four times); each command's exit status and what it wrote to the file descriptors 1 and 2, apart (what
# a shell's user sees on stdout and stderr). A training run in a process of its own is tests/test_train.py's
# test_sigint_saves_a_resumable_checkpoint (`python -m grpo_pipeline.pipeline train`).
_TYPED_IN_A_SHELL = """\
import json, os, runpy, sys, tempfile, traceback

script, commands = json.loads(sys.argv[1])
answers = []
for folder, argv in commands:
    os.chdir(folder)
    streams = [tempfile.TemporaryFile("w+", encoding="utf-8") for _ in (1, 2)]
    saved = [os.dup(1), os.dup(2)]
    for fd, stream in zip((1, 2), streams):
        os.dup2(stream.fileno(), fd)
    sys.argv = [script or "grpo", *argv]
    try:
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module("grpo_pipeline.pipeline", run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as done:
        status = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush(); sys.stderr.flush()
    for fd, kept in zip((1, 2), saved):
        os.dup2(kept, fd)
        os.close(kept)
    texts = []
    for stream in streams:
        stream.seek(0)
        texts.append(stream.read())
        stream.close()
    answers.append([status, *texts])
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    """{example: [(exit status, stdout, stderr) per command], "folders": {example: its folder}} for the README's
    example and docs/coming-from-trl.md's "Try it": each one's files written into a fresh folder as the docs name
    them, then every command of each as written, in the docs' order."""
    readme_files, readme_commands, _ = example_parts()
    trl_files, trl_commands, _ = _trl_doc_example("docs/coming-from-trl.md")
    examples = {"readme": (readme_files, readme_commands), "trl": (trl_files, trl_commands)}
    root = tmp_path_factory.mktemp("typed")
    folders, commands = {}, []
    for example, (files, lines) in examples.items():
        folders[example] = root / example
        folders[example].mkdir()
        for name, body in files.items():
            (folders[example] / name).write_text(body, encoding="utf-8")
        for line in lines:
            argv = shlex.split(line, comments=True)
            assert argv[0] == "grpo", line
            commands.append([str(folders[example]), argv[1:]])
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _TYPED_IN_A_SHELL, json.dumps([shutil.which("grpo"), commands])],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    answers = iter(json.loads(done.stdout))
    results = {example: [next(answers) for _ in lines] for example, (_, lines) in examples.items()}
    return {**results, "folders": folders}


@pytest.mark.slow
def test_the_readme_example_runs_as_written(typed):
    _, commands, printed = example_parts()
    tmp_path = typed["folders"]["readme"]
    outputs = []
    for command, (code, stdout, stderr) in zip(commands, typed["readme"], strict=True):
        assert code == 0, (command, stdout[-3000:], stderr[-3000:])
        assert "Traceback" not in stderr
        outputs.append(stdout)
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
def test_the_trl_format_example_checks_and_trains_as_written(typed):
    """docs/coming-from-trl.md's "Try it" (README links it from "Train on your own data"; the Chinese page holds
    the same example, above): its two files and its two commands, as written; what --check says it prints, it
    prints."""
    _, commands, section = _trl_doc_example("docs/coming-from-trl.md")
    tmp_path = typed["folders"]["trl"]
    outputs = []
    for command, (code, stdout, stderr) in zip(commands, typed["trl"], strict=True):
        assert code == 0, (command, stdout[-3000:], stderr[-3000:])
        outputs.append(stdout)
    said = _said(section)
    checks = {c["name"]: c["message"] for c in json.loads(outputs[0])["checks"]}
    assert len(said) == 2 and said[0].split(": ", 1)[1] in checks["data"].replace("\n", " ")
    assert said[1].split(": ", 1)[1] == checks["trl"], (said[1], checks["trl"])
    metrics = json.loads((tmp_path / "runs/trl/metrics.jsonl").read_text().splitlines()[0])
    assert "rewards/accuracy_reward/mean" in metrics
