"""The known-good matrix against the install sets' lock files, against pyproject.toml, and against itself.

All offline. The lock files (env/pylock.plain.toml, env/pylock.gpu.toml, PEP 751) are uv's resolution of
pyproject.toml's pins, made with the commands in env/known_good.toml's header: the resolver checked every
declared requirement of every package when it wrote them. What is provable without the registry is checked
here: each lock holds every pin of its set inside the pin's specifier, was made from today's pyproject.toml
pins by the documented command, and pyproject.toml says what known_good.toml says.
"""

import copy
import json
import math
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from grpo_pipeline.env.report import known_bad_applies
from grpo_pipeline.env.matrix import LOCK_PATHS, MATRIX_PATH, MatrixError, load_matrix, locked_versions, matrix_from_dict, pip_install_command

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


@pytest.fixture(scope="module")
def pyproject():
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]


def raw_matrix() -> dict:
    """A fresh, mutable copy of the parsed TOML, for building broken variants."""
    with open(MATRIX_PATH, "rb") as handle:
        return tomllib.load(handle)


# --- the lock files ------------------------------------------------------------------------------


def lock_disagreements(matrix, set_name: str, locked: dict[str, str]) -> list[str]:
    """Each pin of the set whose locked version is missing or outside every specifier that applies to it."""
    problems = []
    for key, pin in matrix.packages(set_name).items():
        specifier = matrix.specifier(set_name, key)
        if key not in locked:
            problems.append(f"{pin.name} is not in env/pylock.{set_name}.toml")
        elif not specifier.contains(locked[key], prereleases=True):
            problems.append(f"{pin.name} is {locked[key]} in env/pylock.{set_name}.toml, outside {specifier}")
    return problems


@pytest.mark.parametrize("set_name", ["plain", "gpu"])
def test_each_lock_holds_every_pin_of_its_set(matrix, set_name):
    assert lock_disagreements(matrix, set_name, locked_versions(set_name)) == []
    exact = {key: pin.exact for key, pin in matrix.packages(set_name).items() if pin.exact}
    assert {key: locked_versions(set_name)[key] for key in exact} == exact


def test_a_pin_changed_without_regenerating_the_lock_is_reported():
    """Guard against a check that passes because it checks nothing: a bumped pin and a range that excludes the
    locked version are both named."""
    data = raw_matrix()
    data["plain"]["trl"]["spec"] = "==1.16.0"
    data["plain"]["datasets"]["spec"] = ">=4.7.0,<5.0.0,!=4.8.5"
    problems = lock_disagreements(matrix_from_dict(data), "gpu", locked_versions("gpu"))
    assert problems == ["trl is 1.15.0 in env/pylock.gpu.toml, outside ==1.16.0",
                        "datasets is 4.8.5 in env/pylock.gpu.toml, outside !=4.8.5,<5.0.0,>=4.7.0"]


@pytest.mark.parametrize("set_name", ["plain", "gpu"])
def test_each_lock_was_made_from_pyprojects_pins_by_the_documented_command(pyproject, set_name):
    """Every requirement pyproject.toml declares for the set is satisfied in its lock (a pin bumped there without
    regenerating the lock fails here), and the lock's header names the command known_good.toml documents."""
    lines = pyproject["dependencies"] + (pyproject["optional-dependencies"]["gpu"] if set_name == "gpu" else [])
    locked = locked_versions(set_name)
    for line in lines:
        requirement = Requirement(line)
        assert requirement.specifier.contains(locked[canonicalize_name(requirement.name)], prereleases=True), line
    header = LOCK_PATHS[set_name].read_text(encoding="utf-8").splitlines()[1].strip("# ")
    assert header.startswith("uv pip compile pyproject.toml") and header.endswith(f"-o env/pylock.{set_name}.toml")
    assert f"#   {header}" in MATRIX_PATH.read_text(encoding="utf-8")
    assert tomllib.loads(LOCK_PATHS[set_name].read_text(encoding="utf-8"))["lock-version"] == "1.0"


def test_the_pinned_vllm_is_inside_trls_supported_range(matrix):
    """Unsloth's rollouts run through TRL's VLLMGeneration: the pinned vLLM satisfies trl's own `vllm` extra (trl
    1.15.0's METADATA, as the GPU check kit stores it), and a vLLM outside TRL's range (0.33.0, the earlier pin) is
    reported, naming both packages."""
    records = json.loads((ROOT / "scripts" / "gpu_check" / "roots-requires.json").read_text(encoding="utf-8"))
    trl = next(record for record in records["records"] if record["name"] == "trl")
    assert trl["version"] == matrix.plain["trl"].exact
    wanted = [Requirement(line) for line in trl["requires_dist"] if line.startswith("vllm")]
    assert wanted and all(r.specifier.contains(matrix.gpu["vllm"].exact) for r in wanted), wanted
    entry = next(bad for bad in matrix.known_bad if bad.id == "vllm-outside-trl-range")
    assert SpecifierSet(entry.unless["vllm"]).contains(matrix.gpu["vllm"].exact)
    assert not SpecifierSet(entry.unless["vllm"]).contains("0.33.0")


def test_the_vllm_pin_carries_its_evidence(matrix):
    evidence = matrix.gpu["vllm"].evidence
    assert {"unsloth_install", "release_dates", "unsloth_zoo", "unsloth", "trl", "rejected"} <= set(evidence)
    assert "0.21.0..0.31.0" in evidence["trl"] and "0.11.0-0.27.1" in evidence["unsloth"]
    assert "vllm 0.33.0: 2026-11-01" in evidence["release_dates"]


# --- pyproject -----------------------------------------------------------------------------------


def test_pyproject_agrees_with_the_matrix(matrix, pyproject):
    def declared(lines):
        return {canonicalize_name(Requirement(line).name): str(Requirement(line).specifier) for line in lines}

    def pinned(pins):
        return {key: str(SpecifierSet(pin.spec)) for key, pin in pins.items()}

    assert SpecifierSet(pyproject["requires-python"]) == SpecifierSet(matrix.python)
    assert declared(pyproject["dependencies"]) == pinned(matrix.plain)
    assert declared(pyproject["optional-dependencies"]["gpu"]) == pinned(matrix.gpu)
    assert not any(Requirement(line).marker or Requirement(line).extras
                   for line in pyproject["dependencies"] + pyproject["optional-dependencies"]["gpu"])


# --- known-bad combinations ----------------------------------------------------------------------


def _facts_for_set(matrix, set_name, **machine):
    facts = {key: locked_versions(set_name)[key] for key in matrix.packages(set_name)}
    facts.update(machine)
    return facts


def test_the_known_good_gpu_set_triggers_only_warnings(matrix):
    facts = _facts_for_set(
        matrix, "gpu", **{"@python": "3.11.7", "@torch-cuda": "13.0", "@nvidia-driver": "580.65.06"}
    )
    applied = {bad.id: bad.severity for bad in matrix.known_bad if known_bad_applies(bad, facts, set())}
    assert applied == {"xformers-cu12-beside-cuda13-torch": "warn"}


@pytest.mark.parametrize(
    ("change", "missing", "expected"),
    [
        ({"trl": "1.16.0"}, set(), "trl-above-unsloth-cap"),
        ({"transformers": "5.18.0"}, set(), {"transformers-above-unsloth-cap", "vllm-transformers-range"}),
        ({"transformers": "5.10.0"}, set(), "vllm-transformers-range"),
        ({"torch": "2.14.0"}, set(), "vllm-torch-exact"),
        ({"@nvidia-driver": "535.104.05"}, set(), "driver-too-old-for-cuda13-torch"),
        ({"@python": "3.10.12"}, set(), "python-too-old"),
        ({}, {"vllm-bnb-plugin"}, "vllm-without-bnb-plugin"),
    ],
)
def test_each_known_bad_fires_on_its_combination(matrix, change, missing, expected):
    facts = _facts_for_set(
        matrix, "gpu", **{"@python": "3.11.7", "@torch-cuda": "13.0", "@nvidia-driver": "580.65.06"}
    )
    facts.update(change)
    for key in missing:
        facts.pop(key)
    applied = {
        bad.id for bad in matrix.known_bad if known_bad_applies(bad, facts, missing) and bad.severity == "error"
    }
    assert applied == (expected if isinstance(expected, set) else {expected})


def test_known_bad_fix_commands_use_the_matrix_pins(matrix):
    """A fix that pins a version must pin the matrix's version, or it would fix one thing and break another."""
    pins = matrix.packages("gpu")
    for bad in matrix.known_bad:
        for requirement in re.findall(r'"([^"]+)"', bad.fix):
            parsed = Requirement(requirement)
            key = canonicalize_name(parsed.name)
            allowed = {str(SpecifierSet(pin.spec)) for pin in (matrix.plain.get(key), matrix.gpu.get(key)) if pin}
            assert str(parsed.specifier) in allowed, (bad.id, requirement, allowed)
        for name in [*bad.when, *bad.unless, *bad.missing]:
            assert name.startswith("@") or canonicalize_name(name) in pins, (bad.id, name)


# --- profiles ------------------------------------------------------------------------------------

RECIPE = re.compile(r"^configs/qwen2\.5-(0\.5b|1\.5b|3b|7b)-gsm8k\.yaml$")


def unsloth_standby_utilization(memory_gib: float) -> float:
    """unsloth_zoo 2026.10.9's standby tier for vLLM >= 0.11 (unsloth_zoo.vllm_utils.load_vllm)."""
    ten_percent = memory_gib * 0.1
    tiers = [(4.0, 0.925), (2.5, 0.9), (2.0, 0.825), (1.4, 0.8), (1.0, 0.775)]
    tier = next((value for floor, value in tiers if ten_percent >= floor), 0.75)
    return tier * 0.95


def test_profiles_are_consistent(matrix):
    expected = {
        "colab-t4",
        "colab-l4",
        "colab-a100-40gb",
        "colab-a100-80gb",
        "autodl-rtx3090",
        "autodl-rtx4090",
        "autodl-a800",
        "autodl-cuda12",
    }
    assert set(matrix.profiles) == expected
    for profile in matrix.profiles.values():
        assert RECIPE.match(profile.recipe), profile.id
        assert profile.smaller_recipe is None or RECIPE.match(profile.smaller_recipe), profile.id
        assert profile.dtype == ("bfloat16" if profile.bf16 else "float16"), profile.id
        root = {"colab": "/content/", "autodl": "/root/autodl-tmp/"}[profile.platform]
        for directory in (profile.data_dir, profile.cache_dir, profile.output_dir, profile.env.get("HF_HOME", root)):
            assert directory.startswith(root), (profile.id, directory)
        if profile.platform == "autodl":
            assert any("HF_ENDPOINT" in note for note in profile.notes), profile.id
        if profile.backend == "unsloth":
            assert profile.install == "gpu" and profile.gpu_match, profile.id
            major = int(profile.compute_capability.split(".")[0])
            assert profile.bf16 == (major >= 8), profile.id  # vLLM refuses bf16 below sm80
            assert profile.float8_kv_cache is False or major >= 8, profile.id  # unsloth raises below 8.0
            assert (profile.env.get("UNSLOTH_VLLM_STANDBY") == "1") == profile.standby, profile.id
            # Under standby unsloth_zoo replaces our value by its tier; ours must be that tier, rounded down.
            tier = unsloth_standby_utilization(profile.memory_gib)
            assert math.floor(tier * 100) / 100 == profile.gpu_memory_utilization, (profile.id, tier)


def test_t4_profile_runs_fp16_without_fp8(matrix):
    t4 = matrix.profiles["colab-t4"]
    assert (t4.compute_capability, t4.bf16, t4.dtype, t4.float8_kv_cache) == ("7.5", False, "float16", False)
    assert t4.recipe.endswith("1.5b-gsm8k.yaml") and t4.smaller_recipe.endswith("0.5b-gsm8k.yaml")


# --- pip commands and the loader -----------------------------------------------------------------


def _requirements_in(command: str) -> dict[str, str]:
    return {
        canonicalize_name(Requirement(r).name): str(Requirement(r).specifier)
        for r in re.findall(r'"([^"]+)"', command)
    }


def test_pip_install_command_installs_exactly_the_set(matrix):
    gpu = _requirements_in(pip_install_command("gpu", matrix))
    assert gpu == {key: str(Requirement(pin.requirement).specifier) for key, pin in matrix.packages("gpu").items()}
    assert gpu["torch"] == "==2.13.0" and gpu["trl"] == "==1.15.0" and gpu["vllm-bnb-plugin"] == "==0.0.3"
    plain = pip_install_command("plain", matrix)
    assert "unsloth" not in plain and '"torch>=2.5,<2.15"' in plain
    assert pip_install_command("colab-t4", matrix) == pip_install_command("gpu", matrix)
    cuda12 = pip_install_command("autodl-cuda12", matrix)
    assert cuda12.startswith("python -m pip install --extra-index-url https://download.pytorch.org/whl/cu126 ")
    # An exact CUDA 12 torch, not the plain range (from which pip would take PyPI's newest, a CUDA 13 build).
    assert _requirements_in(cuda12) == {**_requirements_in(plain), "torch": "==2.12.1+cu126"}
    assert pip_install_command("plain", matrix, only=["TRL", "math_verify"]) == (
        'python -m pip install "trl==1.15.0" "math-verify>=0.8.0"'
    )


def test_the_cuda12_profile_says_what_it_cannot_run(matrix):
    profile = matrix.profiles["autodl-cuda12"]
    assert profile.install == "plain" and profile.backend == "plain"
    notes = " ".join(profile.notes)
    assert "No vLLM" in notes and "fast_inference: false" in notes
    # The pinned vLLM needs a torch newer than the profile's CUDA 12 build (its torch in the GPU set's lock).
    torch_for_vllm = locked_versions("gpu")["torch"]
    assert not SpecifierSet(f"=={torch_for_vllm}").contains(profile.pins["torch"].split("==")[1])


@pytest.mark.parametrize(("pins", "message"), [
    ({"torch": ">=2.12"}, r"pins.torch: must be an exact '==' pin"),
    ({"torch": "==2.16.0+cu126"}, r"pins.torch: ==2.16.0\+cu126 is outside the set's torch>=2.5,<2.15"),
    ({"vllm": "==0.31.0"}, r"pins.vllm: not a package of the 'plain' set"),
])
def test_profile_pins_are_checked(pins, message):
    data = raw_matrix()
    data["profiles"]["autodl-cuda12"]["pins"] = pins
    with pytest.raises(MatrixError, match=message):
        matrix_from_dict(data)


def test_pip_install_command_rejects_unknown_targets(matrix):
    with pytest.raises(MatrixError, match="colab-t4"):
        pip_install_command("colab", matrix)
    with pytest.raises(MatrixError, match="vllm"):
        pip_install_command("plain", matrix, only=["vllm"])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["plain"]["trl"].__setitem__("sepc", "==1.0"), r"\[plain.trl\]: unknown field\(s\) \['sepc'\]"),
        (lambda d: d["plain"]["trl"].pop("spec"), r"\[plain.trl\]: missing field 'spec'"),
        (lambda d: d["gpu"]["vllm"].__setitem__("spec", "=>0.33"), r"\[gpu.vllm\].spec: invalid version specifier"),
        (lambda d: d["known_bad"][0].__setitem__("severity", "fatal"), r"severity: 'fatal' is not one of"),
        (lambda d: d["plain"]["accelerate"].__setitem__("tested", "1.15.0"), r"\[plain.accelerate\]: unknown field"),
        (lambda d: d["gpu"]["torch"].update(spec=">=2.14"), r"must be an exact '==' pin"),
        (lambda d: d["profiles"]["colab-t4"].__setitem__("gpu_memory_utilization", 1.5), r"must be in \(0, 1\)"),
    ],
)
def test_loader_names_the_bad_field(mutate, message):
    data = copy.deepcopy(raw_matrix())
    mutate(data)
    with pytest.raises(MatrixError, match=message):
        matrix_from_dict(data)


# --- the upstream signature snapshot (tests/upstream_signatures.py) ------------------------------------


def test_signature_extraction_reads_parameters_defaults_and_fields_from_source():
    import ast

    from tests.upstream_signatures import _find, _module_constants, function_signature, struct_fields

    tree = ast.parse(
        "TARGETS = ['q_proj', 'v_proj']\n"
        "class Model:\n"
        "    def get_peft_model(model, r=16, target_modules=TARGETS, *args, device_map=DEVICE, **kwargs):\n"
        "        raise NotImplementedError('x')\n"
        "class Params(Struct):\n"
        "    n: int = 1\n"
        "    stop: list[str] | None = field(default=None)\n"
        "    _private: ClassVar[int] = 0\n"
    )
    params = function_signature(_find(tree, "Model.get_peft_model"), _module_constants(tree))
    assert [(p["name"], p["kind"]) for p in params] == [
        ("model", "POSITIONAL_OR_KEYWORD"), ("r", "POSITIONAL_OR_KEYWORD"),
        ("target_modules", "POSITIONAL_OR_KEYWORD"), ("args", "VAR_POSITIONAL"),
        ("device_map", "KEYWORD_ONLY"), ("kwargs", "VAR_KEYWORD")]
    assert "default" not in params[0] and params[1]["default"] == {"source": "16", "value": 16}
    assert params[2]["default"] == {"source": "TARGETS", "value": ["q_proj", "v_proj"]}  # resolved constant
    assert params[4]["default"] == {"source": "DEVICE"}  # not a literal: kept as source text only
    fields = struct_fields(_find(tree, "Params"))
    assert [(f["name"], f["default"].get("value", "?")) for f in fields] == [("n", 1), ("stop", None)]


def test_committed_snapshot_names_where_each_callable_lives():
    snapshot = json.loads((ROOT / "tests" / "upstream_signatures.json").read_text())
    for name, entry in snapshot["callables"].items():
        assert entry["file"].startswith(entry["package"] + "/") and entry["qualname"] and entry["how"], name
        assert entry["parameters"], name
    # The dynamically attached ones point at the functions really attached.
    assert snapshot["callables"]["model.load_lora"]["qualname"] == "load_lora"
    assert snapshot["callables"]["model.save_lora[fast_inference=False]"]["qualname"] == "save_lora_adapter"
    assert snapshot["callables"]["model.fast_generate[fast_inference=True]"]["qualname"] == "LLM.generate"
    # The generated configs: TRL's fields plus Unsloth's own, and Unsloth's replaced defaults.
    grpo, sft = snapshot["UnslothGRPOConfig"], snapshot["UnslothSFTConfig"]
    assert {"vllm_sampling_params", "unsloth_num_chunks", "beta", "use_vllm"} <= set(grpo["fields"])
    assert "num_generations" not in sft["fields"] and "max_seq_length" in sft["fields"]
    assert grpo["unsloth_default_overrides"]["vllm_importance_sampling_correction"]["value"] is False
    assert set(grpo["unsloth_default_overrides"]) <= set(grpo["fields"])
