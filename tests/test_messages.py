"""Messages point at the place: every printed command pastes back as the same words (grpo_pipeline.env.paths.shell_command),
and a bad line in any JSONL the tool reads names the file and the line and says nothing was used."""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_pipeline.env.paths import shell_command
from grpo_pipeline.pipeline import cli
from tests.cli_helpers import fault_table

faults = fault_table()

WORD = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40)
# A folder name: anything a file system takes (no "/", no NUL), spaces, quotes, $, `, ;, unicode included.
NAME = st.text(st.characters(blacklist_characters="\x00/", blacklist_categories=("Cs",)), min_size=1,
               max_size=30).filter(lambda n: n not in (".", "..") and len(n.encode()) < 200)
TRICKY = ["my run", "it's", 'say "hi"', "$HOME", "${X}", "`date`", "a;b&c|d", "数据 运行", "tab\there", "new\nline",
          "back\\slash", "~user", "*?[x]"]


@given(st.lists(WORD, min_size=1, max_size=6))
def test_shell_command_round_trips_through_shlex_split(words):
    assert shlex.split(shell_command(*words)) == words


@given(st.lists(WORD.filter(lambda w: not w.startswith("--resume")), max_size=6))
def test_resume_command_round_trips_through_shlex_split(words):
    from grpo_pipeline.pipeline.run.stop import resume_command

    assert shlex.split(resume_command(words)) == ["grpo", "train", *words, "--resume", "auto"]


def _demo_cfg(output_dir: Path):
    from tests.train_helpers import demo_config

    return demo_config(output_dir)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(st.sampled_from(TRICKY), NAME))
def test_printed_next_and_resume_lines_paste_back(name, capsys):
    """pipeline/train.py's closing lines, for a run folder named anything: each printed command is the words
    it names, after the shell has parsed it."""
    from grpo_pipeline.pipeline.run.stop import resume_command
    from grpo_pipeline.pipeline.run.finish import example_question as _example_question
    from grpo_pipeline.pipeline.run.finish import print_where_everything_is as _print_where_everything_is

    with tempfile.TemporaryDirectory() as tmp:
        output_dir = Path(tmp) / name / "run"
        adapter = output_dir / "lora"
        adapter.mkdir(parents=True)
        cfg = _demo_cfg(output_dir)
        _print_where_everything_is(output_dir, "completed", None, adapter, "", cfg.eval.eval_steps,
                                   cfg.data.dataset_name, cfg.grpo.tools, cfg.grpo.environment_factory)
        _print_where_everything_is(output_dir, "interrupted", "SIGINT received", None,
                                   resume_command(["--output_dir", str(output_dir)]), cfg.eval.eval_steps,
                                   cfg.data.dataset_name, cfg.grpo.tools, cfg.grpo.environment_factory)
    lines = capsys.readouterr().out
    nxt = lines.split("[grpo] next: ", 1)[1].split("\n[grpo] ", 1)[0].rstrip("\n")
    assert shlex.split(nxt) == ["grpo", "generate", "--lora", str(adapter), "--prompt", _example_question(cfg.data.dataset_name)]
    resume = lines.split("[grpo] resume with: ", 1)[1].split("\n[grpo] ")[0]
    assert shlex.split(resume.rstrip("\n")) == ["grpo", "train", "--output_dir", str(output_dir), "--resume", "auto"]
    # the listing's paths too: `[grpo]   adapter      PATH` gives back the adapter folder
    listed = lines.split("[grpo]   adapter      ", 1)[1].split("\n[grpo] ", 1)[0]
    assert shlex.split(listed) == [str(adapter)]


@pytest.mark.slow
def test_the_next_command_a_real_run_prints_runs(tmp_path, monkeypatch, capsys):
    """A tiny real run into a folder with spaces, quotes, a ~ and CJK: its `next:` line, pasted, generates.
    (A `$NAME` in a path is read as an environment variable, on purpose: grpo_pipeline.env.path_check.)"""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "it's a \"run\" ~x 数据"
    recipe = faults.recipe(tmp_path, "sft_warmup_steps: 0\nmax_steps: 1\nsave_steps: 1\neval_before: false\n"
                           "eval_after: false\n")
    assert cli.main(["train", "--config", str(recipe), "--output_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    line = next(line for line in printed.splitlines() if line.startswith("[grpo] next: "))
    words = shlex.split(line.removeprefix("[grpo] next: "))
    assert words[:4] == ["grpo", "generate", "--lora", str(out / "lora")]
    assert cli.main(words[1:]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["prompt"] == words[-1] and record["adapter"] == str(out / "lora")


def test_tensorboard_hint_pastes_back(tmp_path):
    from grpo_pipeline.pipeline.preflight import tensorboard_hint

    folder = tmp_path / "it's a run"
    hint = tensorboard_hint(folder)
    assert shlex.split(hint.split("run `", 1)[1].rstrip("`")) == ["tensorboard", "--logdir", str(folder / "runs")]


# ---------------------------------------------------------------- bad lines name the file and the line

GOOD = '{"prompt": "What is 2+3?"}'
BAD_LINES = {
    "broken JSON": b'{"prompt": "What',
    "a JSON list": b'["What is 2+3?"]',
    "no prompt field": b'{"text": "What is 2+3?"}',
    "an empty prompt": b'{"prompt": "  "}',
    "not UTF-8": b'{"prompt": "\xb2\xe2\xca\xd4"}',
}


def _no_generation(monkeypatch):
    import grpo_pipeline.pipeline.backends.plain as plain

    def started(*args, **kwargs):
        raise AssertionError("a generator was loaded for a file with a bad line")

    monkeypatch.setattr(plain, "load_generator", started)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.integers(0, 5), after=st.integers(0, 5), blank=st.booleans(), kind=st.sampled_from(list(BAD_LINES)),
       name=st.sampled_from(["in.jsonl", "my questions.jsonl", "问题.jsonl"]))
def test_bad_input_line_is_named_and_nothing_is_written(before, after, blank, kind, name, tmp_path, monkeypatch,
                                                        capsys):
    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        folder = Path(tmp)
        lines = [GOOD.encode()] * before + ([b""] if blank else []) + [BAD_LINES[kind]] + [GOOD.encode()] * after
        path = folder / name
        path.write_bytes(b"\n".join(lines) + b"\n")
        out = folder / "answers.jsonl"
        with monkeypatch.context() as patch:
            _no_generation(patch)
            code = cli.main(["generate", "--base", "--model", "tiny-qwen2.5", "--input", str(path), "--output",
                             str(out), "--backend", "plain"])
        output = capsys.readouterr().err
        assert code == 2 and "Traceback" not in output, output
        assert f"{path} line {before + blank + 1}:" in output and "Nothing was generated" in output, output
        assert not out.exists()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.integers(1, 4), kind=st.sampled_from(["broken JSON", "a JSON list", "not UTF-8"]))
def test_bad_data_file_line_is_named_before_training(before, kind, tmp_path, monkeypatch, capsys):
    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        folder = Path(tmp)
        good = b'{"question": "1+1?", "answer": "2"}'
        path = folder / "train data.jsonl"
        path.write_bytes(b"\n".join([good] * before + [BAD_LINES[kind], good]) + b"\n")
        monkeypatch.chdir(folder)
        with monkeypatch.context() as patch:
            patch.setattr("grpo_pipeline.pipeline.backends.plain.load_for_training", _raises_if_called)  # the data check reads it
            code = cli.main(faults.train(folder, f"dataset_name: '{path}'\n"))
        output = capsys.readouterr().err
        assert code == 2 and f"{path} line {before + 1} " in output, output
        assert "No row of the file was used" in output


def _raises_if_called(*args, **kwargs):
    raise AssertionError("the model loaded for a data file with a bad line")
