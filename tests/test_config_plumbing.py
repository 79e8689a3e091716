"""Config and message plumbing: a recipe is read once (a pipe works), a YAML alias bomb is refused cheaply, every
message quotes a bounded excerpt of a value, and the crash-log path printed on a bug is the real one."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from grpo_pipeline.env.path_check import OUTPUT_FILE, PathError, check_path
from grpo_pipeline.env.text import excerpt, shorten
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, check_field_values, parse_config, peek_option
from grpo_pipeline.pipeline.config.parse import read_recipe
from grpo_pipeline.pipeline.config.validate import parse_limit, sampling_params_mapping
from grpo_pipeline.pipeline.config.pipeline_config import check_choices, coerce, typed_value

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "max_steps: 7\nseed: 11\nenv:\n  GRPO_TEST_FROM_RECIPE: 'yes'\n"


# ---------------------------------------------------------------- a recipe is read once


def test_a_recipe_from_a_pipe_is_read_once_by_every_reader(monkeypatch):
    """The bootstrap's peek_option, then parse_config (which once let TrlParser open --config again): one pipe,
    whose text can be read only once, serves both."""
    monkeypatch.delenv("GRPO_TEST_FROM_RECIPE", raising=False)
    read_end, write_end = os.pipe()
    os.write(write_end, RECIPE.encode())
    os.close(write_end)
    path = f"/dev/fd/{read_end}"
    try:
        assert peek_option(["--config", path], "seed") == 11
        cfg = parse_config(["--config", path, "--seed", "5"])
    finally:
        os.close(read_end)
    assert (cfg.grpo.max_steps, cfg.grpo.seed) == (7, 5)  # the recipe's value, the command line's over it
    assert os.environ["GRPO_TEST_FROM_RECIPE"] == "yes"  # `env:` applied, as TrlParser does


def test_a_recipe_from_a_fifo_is_read_once(tmp_path, monkeypatch):
    monkeypatch.delenv("GRPO_TEST_FROM_RECIPE", raising=False)
    fifo = tmp_path / "recipe.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(RECIPE), daemon=True)
    writer.start()
    cfg = parse_config(["--config", str(fifo)])
    writer.join(timeout=10)
    assert cfg.grpo.max_steps == 7 and not writer.is_alive()


def test_a_changed_recipe_file_is_read_again(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_steps: 3\n")
    assert read_recipe(str(recipe)) == {"max_steps": 3}
    recipe.write_text("max_steps: 40\n")
    os.utime(recipe, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert read_recipe(str(recipe)) == {"max_steps": 40}


def test_process_substitution_works_through_the_command_line(tmp_path):
    """`python -m grpo_pipeline.pipeline data --config <(...) --json`, in a real shell: the recipe, a pipe read once by every reader,
    is applied (max_samples, output_dir). Also tests/test_data_cli.py's one `grpo data` process: the real tokenizer
    loader, offline, and stdout the JSON report alone (logs go to stderr)."""
    recipe = "dataset_name: sample\nmodel_name_or_path: bundled:qwen2.5\nmax_samples: 4\n" \
             f"output_dir: {tmp_path / 'run'}\ndata_cache_dir: {tmp_path / 'cache'}\n"
    script = f"{shlex.quote(sys.executable)} -m grpo_pipeline.pipeline data --config <(printf %s {shlex.quote(recipe)}) --json"
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)  # stdout is the JSON alone
    assert (report["rows_in"], report["rows_kept"], report["status"]) == (50, 4, "ok")
    assert (tmp_path / "run" / "data_report.json").is_file()


# ---------------------------------------------------------------- YAML alias bombs


def _alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nlora_target_modules: *a{levels - 1}\n"


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(_alias_bomb())
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"bomb\.yaml line \d+: its YAML aliases expand to more than 100,000"):
        read_recipe(str(recipe))
    assert time.monotonic() - started < 5


def test_a_recursive_alias_is_refused(tmp_path):
    recipe = tmp_path / "loop.yaml"
    recipe.write_text("lora_target_modules: &x [q_proj, *x]\n")
    with pytest.raises(ConfigError, match="alias refers to the value that holds it"):
        read_recipe(str(recipe))


def test_a_few_aliases_are_fine(tmp_path):
    recipe = tmp_path / "ok.yaml"
    recipe.write_text("lora_target_modules: &m [q_proj, v_proj]\nlora_modules_to_save: *m\n")
    assert read_recipe(str(recipe))["lora_modules_to_save"] == ["q_proj", "v_proj"]


# ---------------------------------------------------------------- every message quotes a bounded excerpt

HUGE_TEXT = "x" * 5_000_000
HUGE_LIST = [["q_proj"] * 1000] * 1000  # shared rows: a million entries, as an alias bomb builds them
BOUND = 1000  # characters: any message about a huge value stays shorter


def _raises(call, *args):
    def run():
        with pytest.raises((ConfigError, PathError)) as caught:
            call(*args)
        return str(caught.value)
    return run


# Every kind of site that quotes a user value in a message: coerce (numbers, bools), choices, list entries,
# recipe value types, limits, sampling params, path variables and users, duplicate keys, reward outputs.
SITES = {
    "coerce-int": _raises(coerce, HUGE_TEXT, int, "max_steps"),
    "coerce-bool": _raises(coerce, HUGE_LIST, bool, "eval_before"),
    "coerce-float-list": _raises(coerce, HUGE_LIST, float, "beta"),
    "choices": _raises(check_choices, __import__("grpo_pipeline.pipeline.config", fromlist=["HealthArguments"])
                       .HealthArguments(kl_action=HUGE_TEXT)),
    "list-entry": _raises(check_field_values, PipelineConfig().replace(lora_target_modules=[HUGE_LIST, ""])),
    "recipe-type-list": _raises(typed_value, "max_steps", HUGE_LIST),
    "recipe-type-text": _raises(typed_value, "output_dir", HUGE_LIST),
    "recipe-nested-list": _raises(typed_value, "lora_target_modules", HUGE_LIST),
    "limit": _raises(parse_limit, HUGE_TEXT, "max_prompt_length"),
    "sampling-params": _raises(sampling_params_mapping, HUGE_TEXT),
    "path-unset-variable": _raises(check_path, "output_dir", "$GRPO_SURELY_UNSET/" + HUGE_TEXT[:3000], OUTPUT_FILE),
    "path-unknown-user": _raises(check_path, "output_dir", "~nosuchuser" + "y" * 3000 + "/x", OUTPUT_FILE),
}


@pytest.mark.parametrize("site", list(SITES))
def test_a_message_about_a_huge_value_is_bounded(site):
    message = SITES[site]()
    assert len(message) < BOUND, (site, len(message), message[:300])
    assert " characters … " in message or "..." in message  # it says something was left out


def test_a_reward_returning_a_huge_value_gives_a_bounded_message():
    from grpo_pipeline.rewards.contract import RewardFailure, check_rewards

    for output in (HUGE_TEXT, [HUGE_TEXT], [float("nan")] * 2):
        with pytest.raises(RewardFailure) as caught:
            check_rewards("f", output, 1 if isinstance(output, list) and len(output) == 1 else 2)
        assert len(str(caught.value)) < BOUND


def test_a_duplicate_huge_key_is_named_by_an_excerpt(tmp_path):
    recipe = tmp_path / "r.yaml"
    key = "k" * 1000  # YAML's longest plain key is 1024 characters
    recipe.write_text(f"{key}: 1\n{key}: 2\n")
    with pytest.raises(ConfigError) as caught:
        read_recipe(str(recipe))
    assert "set twice" in str(caught.value) and len(str(caught.value)) < BOUND


def test_the_handler_bounds_any_user_error_it_prints(capsys):
    """The backstop for a message built without excerpt: the start and the fix at the end are kept."""
    from grpo_pipeline.pipeline.errors import MAX_MESSAGE_CHARS, run_command

    def fail(argv):
        raise ConfigError("x", "start " + HUGE_TEXT + " the fix")

    assert run_command("data", fail, []) == 2
    printed = capsys.readouterr().err
    assert len(printed) <= MAX_MESSAGE_CHARS + 20
    assert "config error in `x`: start" in printed and printed.rstrip().endswith("the fix")


def test_excerpt_is_repr_for_small_values_and_cut_for_large_ones():
    assert [excerpt(v) for v in ("tpu", 1.5, None, [1, "a"])] == ["'tpu'", "1.5", "None", "[1, 'a']"]
    assert len(excerpt(HUGE_TEXT)) <= 200 and len(excerpt(HUGE_LIST)) <= 200
    assert shorten("a" * 10) == "a" * 10 and len(shorten("a" * 10_000, 50)) <= 50


# ---------------------------------------------------------------- the crash log printed on a bug


def test_the_printed_crash_log_path_exists_as_printed(tmp_path, monkeypatch, capsys):
    """A cache root with capitals, spaces and non-ASCII: the path the bug line prints (a shell word) is the log."""
    from grpo_pipeline.pipeline.errors import run_command

    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "My Cache ÄÖ"))

    def bug(argv):
        raise RuntimeError("boom")

    assert run_command("data", bug, []) == 1
    line = capsys.readouterr().err
    printed = re.search(r"The traceback is in (.+?); rerun with", line).group(1)
    (path,) = shlex.split(printed)
    assert Path(path).is_file() and "RuntimeError: boom" in Path(path).read_text(encoding="utf-8")
    assert Path(path).parent == tmp_path / "My Cache ÄÖ" / "logs"
