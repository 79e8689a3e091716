"""Behaviour of rewards/: the registry (names, aliases, plug-ins, weights) and module hygiene."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

import rewards
from rewards import (
    DEFAULT_REWARD_WEIGHTS,
    DEFAULT_REWARDS,
    REWARD_FUNCS,
    check_reward_weights,
    get_reward_funcs,
    resolve_reward,
)
from tests.reward_helpers import wrap

REPO_ROOT = Path(__file__).resolve().parents[1]


# --- registry ---------------------------------------------------------------------------------

def test_registry_names_defaults_and_stable_dunder_names():
    assert list(REWARD_FUNCS) == ["xmlcount", "soft_format", "strict_format", "int", "correctness",
                                  "language_consistency"]
    assert DEFAULT_REWARDS == ["xmlcount", "soft_format", "strict_format", "int", "correctness"]
    assert DEFAULT_REWARD_WEIGHTS == [1.0] * 5
    names = [f.__name__ for f in get_reward_funcs(DEFAULT_REWARDS)]
    assert names == ["xmlcount_reward_func", "soft_format_reward_func", "strict_format_reward_func",
                     "int_reward_func", "correctness_reward_func"]


def test_resolve_reward_aliases_and_callables():
    for short, func in REWARD_FUNCS.items():
        assert resolve_reward(short) is func
        assert resolve_reward(func.__name__) is func
        assert resolve_reward(f" {short} ") is func
    assert resolve_reward(len) is len


def test_resolve_reward_unknown_name_lists_known_ones():
    with pytest.raises(ValueError) as err:
        resolve_reward("corectness")
    message = str(err.value)
    assert "'corectness'" in message and "reward_funcs" not in message  # the config layer names the field
    for name in list(REWARD_FUNCS) + [f.__name__ for f in REWARD_FUNCS.values()]:
        assert name in message
    for bad in ("", "   ", None, 3):
        with pytest.raises(ValueError, match="not a reward name"):
            resolve_reward(bad)


def test_plugin_module_function(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    func = resolve_reward("test_rewards_plugin_helper:answer_length_reward")
    assert func.__name__ == "answer_length_reward"
    assert func(completions=[wrap("18"), "none"], prompts=None) == pytest.approx([0.2, 0.0])
    funcs = get_reward_funcs(["correctness", "test_rewards_plugin_helper:answer_length_reward"])
    assert [f.__name__ for f in funcs] == ["correctness_reward_func", "answer_length_reward"]


@pytest.mark.parametrize("spec, fragment", [
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("test_rewards_plugin_helper:missing", "has no 'missing'"),
    ("test_rewards_plugin_helper:NOT_A_FUNCTION", "not a function"),
    (":f", "package.module:function"), ("test_rewards_plugin_helper:", "package.module:function"),
])
def test_plugin_errors(monkeypatch, spec, fragment):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with pytest.raises(ValueError) as err:
        resolve_reward(spec)
    assert fragment in str(err.value) and "reward_funcs" not in str(err.value)


def test_get_reward_funcs_rejects_bad_lists():
    with pytest.raises(ValueError, match=r"expected a list"):
        get_reward_funcs("correctness")
    with pytest.raises(ValueError, match="empty"):
        get_reward_funcs([])
    with pytest.raises(ValueError, match="same reward"):
        get_reward_funcs(["correctness", "correctness_reward_func"])


def test_check_reward_weights():
    assert check_reward_weights(DEFAULT_REWARDS, None) == [1.0] * 5
    assert check_reward_weights(["int", "correctness"], [0.5, 2]) == [0.5, 2.0]
    assert check_reward_weights(["int"], [-1.0]) == [-1.0]  # a penalty is allowed
    for weights in ([1.0], [1.0, 2.0, 3.0], [1.0, math.nan], [1.0, math.inf], [1.0, "2"], [1.0, True], "1,1"):
        with pytest.raises(ValueError) as err:
            check_reward_weights(["int", "correctness"], weights)
        assert "reward_weights" not in str(err.value) and "config error" not in str(err.value)


# --- module hygiene ---------------------------------------------------------------------------

def test_import_is_light():
    code = ("import sys, time; t = time.perf_counter(); import rewards; dt = time.perf_counter() - t; "
            "heavy = [m for m in ('torch', 'math_verify', 'sympy', 'transformers', 'trl') if m in sys.modules]; "
            "print(heavy, dt)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    heavy, seconds = out.stdout.rsplit(" ", 1)
    assert heavy == "[]"
    assert float(seconds) < 1.0


def test_public_names():
    for name in ("correctness_reward_func", "int_reward_func", "strict_format_reward_func",
                 "language_consistency_reward_func",
                 "soft_format_reward_func", "xmlcount_reward_func", "extract_xml_answer", "extract_hash_answer",
                 "normalize_answer", "answers_match", "REWARD_FUNCS", "get_reward_funcs", "resolve_reward",
                 "DEFAULT_REWARDS", "DEFAULT_REWARD_WEIGHTS", "check_reward_weights"):
        assert hasattr(rewards, name) and name in rewards.__all__



def test_config_layer_names_the_field_the_rewards_do_not():
    """rewards/ raises plain ValueErrors; pipeline.config wraps them once, naming the config field."""
    from pipeline.config import ConfigError, PipelineConfig, validate

    with pytest.raises(ConfigError, match=r"^config error in `reward_funcs`: unknown reward 'corectness'") as err:
        validate(PipelineConfig().replace(reward_funcs=["corectness"]), n_processes=1)
    assert str(err.value).count("config error") == 1
    with pytest.raises(ConfigError, match=r"^config error in `reward_weights`: 1 weights for 5 reward functions"):
        validate(PipelineConfig().replace(reward_weights=[1.0]), n_processes=1)
