"""The boundary around a user's reward module: found beside the recipe or in the working folder, loaded as the
user's whatever its name (ours, the standard library's, an installed package's), never hiding ours; its
import sees none of grpo's arguments; a file that would hide one of our packages is exit 2 naming it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import parse_config
from rewards import correctness_reward_func, get_reward_funcs, resolve_reward

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["rewards", "env", "pipeline", "json", "trl", "my_rewards"]  # ours x3, stdlib, installed, free


def _reward_file(folder: Path, name: str, marker: float, package: bool = False) -> str:
    body = (f"import sys\nSEEN_ARGV = list(sys.argv)\n\n"
            f"def score(completions, **kwargs):\n    return [{marker}] * len(completions)\n")
    if package:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text("")
        (folder / name / "scoring.py").write_text(body)
        return f"{name}.scoring:score"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(body)
    return f"{name}:score"


def _recipe(folder: Path, spec: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "recipe.yaml"
    path.write_text(f"reward_funcs: ['{spec}']\nmodel_name_or_path: tiny-qwen2.5\n")
    return path


@pytest.mark.parametrize("package", [False, True])
@pytest.mark.parametrize("where", ["beside the recipe", "working folder"])
@pytest.mark.parametrize("name", NAMES)
def test_a_users_module_loads_as_theirs_whatever_its_name_and_ours_stay_ours(tmp_path, monkeypatch, name, where,
                                                                             package):
    marker = 0.25 + NAMES.index(name) / 100
    recipe_dir, work = tmp_path / "recipes", tmp_path / "work"
    work.mkdir()
    spec = _reward_file(recipe_dir if where == "beside the recipe" else work, name, marker, package)
    monkeypatch.chdir(work)
    argv_before = list(sys.argv)
    cfg = parse_config(["--config", str(_recipe(recipe_dir, spec))])
    (func,) = get_reward_funcs(cfg.grpo.reward_funcs)
    assert func(completions=["a", "b"]) == [marker, marker]
    raw = resolve_reward(cfg.grpo.reward_funcs[0])
    module = sys.modules[raw.__module__]
    assert Path(module.__file__).is_relative_to(recipe_dir if where == "beside the recipe" else work)
    assert module.SEEN_ARGV == [module.__file__]  # its import saw none of grpo's arguments
    assert sys.argv == argv_before
    # ours, the standard library's and the installed package are untouched
    import env.paths
    import rewards as ours
    import trl

    assert ours.correctness_reward_func is correctness_reward_func
    assert Path(env.paths.__file__).is_relative_to(ROOT) and json.dumps([1]) == "[1]"
    assert hasattr(trl, "GRPOConfig")


def test_a_module_that_is_nowhere_is_named_with_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = parse_config(["--config", str(_recipe(tmp_path / "r", "nowhere_rewards:score"))])
    with pytest.raises(ValueError, match="nowhere_rewards") as err:
        get_reward_funcs(cfg.grpo.reward_funcs)
    assert str(tmp_path / "r") in str(err.value)


@pytest.mark.parametrize("how", ["PYTHONPATH", "python -m from the folder"])
@pytest.mark.parametrize("name", ["rewards", "env"])
def test_a_file_that_would_hide_one_of_our_packages_is_exit_2_naming_it(tmp_path, name, how):
    folder = tmp_path / "mine"
    _reward_file(folder, name, 1.0)
    env = {**os.environ, "PYTHONPATH": str(folder) if how == "PYTHONPATH" else str(ROOT)}
    command = [sys.executable, "-m", "pipeline", "data", "--help"]
    out = subprocess.run(command, cwd=folder if how != "PYTHONPATH" else tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert str(folder / f"{name}.py") in out.stderr and "Traceback" not in out.stderr
