"""The boundary around a user's reward module: found in the working folder (the one base of every relative path, as
TRL reads it; one only beside the recipe is named with the fix), loaded as the
user's whatever its name (ours, the standard library's, an installed package's), never hiding ours; its
import sees none of grpo's arguments; a file that would hide one of our packages is exit 2 naming it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_pipeline.pipeline.config import parse_config
from grpo_pipeline.rewards import correctness_reward_func, get_reward_funcs, resolve_reward

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _own_import_path(monkeypatch):
    """Each test's user folders join a copy of sys.path: none leaks into the next test (as in a fresh process)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
# ours x3, the standard library's (a file, a builtin), an installed package's, a free name
NAMES = ["rewards", "env", "pipeline", "json", "itertools", "trl", "my_rewards"]
FREE = ("rewards", "env", "pipeline", "my_rewards")  # the folders of our checkout are not import names


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
@pytest.mark.parametrize("where", ["working folder"])
@pytest.mark.parametrize("name", NAMES)
def test_a_users_module_loads_as_theirs_whatever_its_name_and_ours_stay_ours(tmp_path, monkeypatch, name, where,
                                                                             package):
    marker = 0.25 + NAMES.index(name) / 100
    for loaded in [m for m in sys.modules if m.partition(".")[0] in FREE]:
        monkeypatch.delitem(sys.modules, loaded)  # another test's my_rewards.py: this one's is free to take the name
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
    # a free name is the user's own (ours are all under grpo_pipeline); a taken one (the standard library's, an
    # installed package's) is aliased
    top = raw.__module__.split(".")[0]
    assert (top == name) if name in FREE else top.startswith(f"_user_{name}_"), raw.__module__
    assert module.SEEN_ARGV == [module.__file__]  # its import saw none of grpo's arguments
    assert sys.argv == argv_before
    # ours, the standard library's and the installed package are untouched
    import grpo_pipeline.env.paths
    import grpo_pipeline.rewards as ours
    import trl

    assert ours.correctness_reward_func is correctness_reward_func
    assert Path(grpo_pipeline.env.paths.__file__).is_relative_to(ROOT) and json.dumps([1]) == "[1]"
    assert hasattr(trl, "GRPOConfig")


def test_a_module_that_is_nowhere_is_named_with_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = parse_config(["--config", str(_recipe(tmp_path / "r", "nowhere_rewards:score"))])
    with pytest.raises(ValueError, match="nowhere_rewards") as err:
        get_reward_funcs(cfg.grpo.reward_funcs)
    assert f"({tmp_path.resolve()})" in str(err.value) and "beside the recipe" not in str(err.value)


def test_one_base_for_every_relative_path_and_the_missing_path_error_says_which(tmp_path, monkeypatch):
    """A recipe run from another folder: its reward module beside it and its relative data path are both read
    against the working folder, and each error says so, with the fix."""
    from grpo_pipeline.pipeline.preflight import run_checks

    recipe_dir, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    spec = _reward_file(recipe_dir, "beside_rewards", 1.0)
    (recipe_dir / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    recipe = recipe_dir / "a.yaml"
    recipe.write_text(f"reward_funcs: ['{spec}']\nmodel_name_or_path: tiny-demo\ndataset_name: train.jsonl\n")
    monkeypatch.chdir(elsewhere)
    cfg = parse_config(["--config", str(recipe)])
    with pytest.raises(ValueError) as err:
        get_reward_funcs(cfg.grpo.reward_funcs)
    assert "beside the recipe" in str(err.value) and f"working folder ({elsewhere.resolve()})" in str(err.value)
    data = next(c for c in run_checks(cfg.replace(reward_funcs=["xmlcount"], output_dir=str(tmp_path / "o")),
                                      stop_at_first=False) if c.name == "data")
    assert not data.ok and f"read against the working folder ({elsewhere.resolve()})" in data.message
    monkeypatch.chdir(recipe_dir)  # from the folder the paths are relative to, both are found
    assert get_reward_funcs(cfg.grpo.reward_funcs)[0](completions=["a"]) == [1.0]


def test_a_users_rewards_env_and_pipeline_py_first_on_the_import_path_hide_nothing_of_ours(tmp_path):
    """Ours install under one import name (grpo_pipeline): a user's rewards.py, env.py and pipeline.py, in the
    working folder of `python -m` and on PYTHONPATH, are simply theirs (before, the first two were refused)."""
    folder = tmp_path / "mine"
    for name in ("rewards", "env", "pipeline"):
        _reward_file(folder, name, 1.0)
        (folder / f"{name}.py").write_text((folder / f"{name}.py").read_text() + "raise SystemExit('imported')\n")
    env = {**os.environ, "PYTHONPATH": str(folder)}
    command = [sys.executable, "-m", "grpo_pipeline.pipeline", "data", "--help"]
    out = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "usage:" in out.stdout and "imported" not in out.stderr + out.stdout


def test_sibling_imports_work_from_a_module_and_from_a_package_in_the_working_folder(tmp_path, monkeypatch):
    """The user's folder joins the import path (at its end), so their reward module can import its helpers."""
    recipes = tmp_path / "recipes"
    (recipes / "deep_pkg").mkdir(parents=True)
    (recipes / "helper_for_rewards.py").write_text("VALUE = 0.75\n")
    (recipes / "file_rewards.py").write_text("import helper_for_rewards\n\n"
                                             "def score(completions, **kw):\n"
                                             "    return [helper_for_rewards.VALUE] * len(completions)\n")
    (recipes / "deep_pkg" / "__init__.py").write_text("")
    (recipes / "deep_pkg" / "inner").mkdir()
    (recipes / "deep_pkg" / "inner" / "__init__.py").write_text("")
    (recipes / "deep_pkg" / "inner" / "scoring.py").write_text(
        "import sys\nimport helper_for_rewards\nSEEN_ARGV = list(sys.argv)\n\n"
        "def score(completions, **kw):\n    return [helper_for_rewards.VALUE + 0.125] * len(completions)\n")
    monkeypatch.chdir(recipes)
    monkeypatch.setattr(sys, "path", list(sys.path))
    parse_config(["--config", str(_recipe(recipes, "file_rewards:score"))])
    file_reward = resolve_reward("file_rewards:score")
    assert file_reward(completions=["a"]) == [0.75]
    assert not hasattr(sys.modules[file_reward.__module__], "__path__")  # a file is a module, not a package
    deep = resolve_reward("deep_pkg.inner.scoring:score")
    assert deep(completions=["a"]) == [0.875]
    module = sys.modules[deep.__module__]
    assert module.SEEN_ARGV == [str(recipes / "deep_pkg" / "inner" / "scoring.py")]
    assert str(recipes) in sys.path and sys.path.index(str(recipes)) > 0


def test_a_module_on_the_import_path_sees_only_its_name_as_argv_and_no_recipe_means_the_working_folder(
        tmp_path, monkeypatch):
    from grpo_pipeline.rewards.user_code import search_dirs

    elsewhere = tmp_path / "site"
    elsewhere.mkdir()
    (elsewhere / "installed_rewards.py").write_text(
        "import sys\nSEEN_ARGV = list(sys.argv)\n\n"
        "def score(completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.setattr(sys, "path", [str(elsewhere), *sys.path])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    parse_config([])  # no recipe: the working folder alone, then the import path
    assert search_dirs() == [work.resolve()]
    func = resolve_reward("installed_rewards:score")
    assert sys.modules[func.__module__].SEEN_ARGV == ["installed_rewards"]
    assert func.__module__ == "installed_rewards"


def test_two_recipes_with_a_reward_module_of_one_name_each_get_their_own(tmp_path, monkeypatch):
    """A notebook trying two recipes, each from its own folder: the second folder's `same_name.py` is not the
    first one's."""
    got = []
    for marker in (0.5, 0.25):
        folder = tmp_path / f"r{marker}"
        _reward_file(folder, "same_name_rewards", marker)
        monkeypatch.chdir(folder)
        parse_config(["--config", str(_recipe(folder, "same_name_rewards:score"))])
        got.append(resolve_reward("same_name_rewards:score")(completions=["a"]))
    assert got == [[0.5], [0.25]]


def test_a_package_alone_in_the_working_folder_can_import_its_siblings(tmp_path, monkeypatch):
    """The folder that holds the package (not the package's own folder) joins the import path."""
    recipes = tmp_path / "recipes"
    (recipes / "lone_pkg").mkdir(parents=True)
    (recipes / "lone_helper.py").write_text("VALUE = 0.625\n")
    (recipes / "lone_pkg" / "__init__.py").write_text("import lone_helper\n\n"
                                                      "def score(completions, **kw):\n"
                                                      "    return [lone_helper.VALUE] * len(completions)\n")
    monkeypatch.chdir(recipes)
    monkeypatch.setattr(sys, "path", list(sys.path))
    parse_config(["--config", str(_recipe(recipes, "lone_pkg:score"))])
    assert resolve_reward("lone_pkg:score")(completions=["a"]) == [0.625]
    assert str(recipes) in sys.path and str(recipes / "lone_pkg") not in sys.path


# -- nothing shared runs code: a folder someone else wrote (issue 59 item 5 and "a shared file we refuse to load must
# be named") -------------------------------------------------------------------------------------------------------

def _adapter(folder: Path, weights: str = "adapter_model.safetensors") -> Path:
    """A LoRA adapter folder as verify_adapter_dir reads it: its config and one valid weights file."""
    import struct

    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "base_model_name_or_path":
                                                            "tiny-demo", "target_modules": ["q_proj"]}))
    if weights.endswith(".safetensors"):
        header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
        (folder / weights).write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    return folder


class _WritesMarker:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # unpickled: the file someone shipped runs code (it opens a file)


def _plant_tokenizer_code(folder: Path, marker: Path) -> Path:
    (folder / "tokenization_mine.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["tokenization_mine.MyTokenizer", None]}}))
    return folder / "tokenizer_config.json"


def _plant_pickle(folder: Path, marker: Path) -> Path:
    import torch

    (folder / "adapter_model.safetensors").unlink()
    torch.save({"w": _WritesMarker(str(marker))}, folder / "adapter_model.bin")
    return folder / "adapter_model.bin"


SHARED_CODE = {"a tokenizer that needs its own code": _plant_tokenizer_code,
               "a pickled weights file that names code": _plant_pickle}
COMMANDS = {
    "generate": lambda lora: ["generate", "--lora", lora, "--prompt", "1+1?", "--trust_remote_code",
                              "--backend", "plain"],
    "eval": lambda lora: ["eval", "--lora", lora, "--data", "demo-arithmetic", "--limit", "1", "--trust_remote_code",
                          "--backend", "plain"],
    "export": lambda lora: ["export", "--lora", lora, "--to", "merged16", "--out", lora + "-merged",
                            "--trust_remote_code", "--backend", "plain"],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", SHARED_CODE)
def test_code_shipped_in_an_adapter_folder_never_runs_and_is_named_exit_2(tmp_path, monkeypatch, capsys, kind,
                                                                          command):
    """--trust_remote_code runs the base model's own code only: a folder someone shared is refused before anything
    loads (env/adapters.py refuse_shipped_code), exit 2 naming the file and the choice, never exit 1."""
    from grpo_pipeline.pipeline import cli

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran.txt"
    lora = _adapter(tmp_path / "lora")
    planted = SHARED_CODE[kind](lora, marker)
    assert cli.main(COMMANDS[command](str(lora))) == 2
    err = capsys.readouterr().err
    assert str(planted) in err and "Choose" in err and "Traceback" not in err, err
    assert not marker.exists()


def test_a_torch_saved_adapter_bin_of_tensors_only_is_read_as_before(tmp_path):
    import torch

    from grpo_pipeline.env.adapters import pickled_code, verify_adapter_dir

    lora = _adapter(tmp_path / "lora", weights="adapter_model.bin")
    torch.save({"base_model.model.q_proj.lora_A.weight": torch.zeros(4, 8)}, lora / "adapter_model.bin")
    assert pickled_code(lora / "adapter_model.bin") is None
    assert verify_adapter_dir(lora).weights_file.name == "adapter_model.bin"


def test_the_adapter_folders_tokenizer_loads_without_remote_code_whatever_the_flag(tmp_path, monkeypatch):
    """Behind the refusal too: an adapter folder's tokenizer is read with trust_remote_code off (run_tokenizer: the
    plain backend's generator, and grpo eval's data check before the weights load)."""
    from types import SimpleNamespace

    from grpo_pipeline.pipeline.config import PipelineConfig
    from grpo_pipeline.pipeline.data import tokenizer

    calls = []
    monkeypatch.setattr(tokenizer, "load_tokenizer", lambda source, trust, src: calls.append((source, trust)))
    cfg = PipelineConfig().replace(trust_remote_code=True, model_source="hf")
    (tmp_path / "tokenizer_config.json").write_text("{}")  # the adapter folder carries a tokenizer
    tokenizer.run_tokenizer(SimpleNamespace(path=tmp_path), "base", cfg)
    tokenizer.run_tokenizer(None, "base", cfg)
    assert calls == [(str(tmp_path), False), ("base", True)]
