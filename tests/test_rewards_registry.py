"""Behaviour of rewards/: the registry (names, aliases, plug-ins, weights) and module hygiene."""

from __future__ import annotations

import asyncio
import inspect
import math
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_pipeline import rewards
from grpo_pipeline.rewards import (
    DEFAULT_REWARD_WEIGHTS,
    DEFAULT_REWARDS,
    REWARD_FUNCS,
    check_reward_weights,
    reads_reference,
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


def test_checking_names_takes_what_resolving_takes_and_imports_nothing():
    """check_reward_names (for the commands that call no reward) knows TRL's registry names as get_reward_funcs does,
    without importing trl, and names a module that is nowhere."""
    code = ("import sys; from grpo_pipeline.rewards import check_reward_names; "
            "check_reward_names(['correctness', 'int_reward_func', 'accuracy_reward', 'trl.rewards.accuracy_reward']); "
            "print('trl' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    with pytest.raises(ValueError, match="no module 'nowhere_xyz' in .* put its .py file beside the recipe"):
        rewards.check_reward_names(["nowhere_xyz:score"])
    with pytest.raises(ValueError, match="unknown reward 'corectness'"):
        rewards.check_reward_names(["corectness"])


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


def test_every_name_of_trls_own_registry_is_accepted_as_itself():
    """trl/scripts/grpo.py's reward_funcs_registry, read from the installed TRL (an AST walk here, as a second
    reading): each name resolves to what the script builds (the function, or the factory's reward)."""
    import ast
    import importlib.util

    import trl.rewards

    script = Path(importlib.util.find_spec("trl.scripts.grpo").origin).read_text()
    registry = next(node for node in ast.walk(ast.parse(script)) if isinstance(node, ast.Dict)
                    and any(isinstance(k, ast.Constant) and k.value == "accuracy_reward" for k in node.keys))
    names = [key.value for key in registry.keys]
    assert len(names) >= 4
    for name in names:
        func = resolve_reward(name)
        if hasattr(trl.rewards, name) and not name.startswith("get_"):
            assert func is getattr(trl.rewards, name)
        else:  # a factory: TRL's script registers what it returns
            assert func.__name__ == getattr(trl.rewards, name)(max_completion_len=8, soft_punish_cache=2).__name__
    funcs = rewards.get_reward_funcs(names)
    assert [f.__name__ for f in funcs][:3] == names[:3]


def test_an_unknown_name_lists_ours_and_trls_and_the_nearest():
    with pytest.raises(ValueError) as err:
        resolve_reward("acuracy_reward")
    message = str(err.value)
    assert "did you mean 'accuracy_reward'" in message
    assert "correctness" in message and "think_format_reward" in message and "get_soft_overlong_punishment" in message


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
    # a recipe written before our modules moved under one import name: the message gives the new path
    ("rewards.format:soft_format_reward_func", "write 'grpo_pipeline.rewards.format:soft_format_reward_func'"),
    ("pipeline.demo.calculator.calculator", "write 'grpo_pipeline.pipeline.demo.calculator:calculator'"),
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
    """rewards/ raises plain ValueErrors; grpo_pipeline.pipeline.config wraps them once, naming the config field."""
    from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, validate

    with pytest.raises(ConfigError, match=r"^config error in `reward_funcs`: unknown reward 'corectness'") as err:
        validate(PipelineConfig().replace(reward_funcs=["corectness"]), n_processes=1)
    assert str(err.value).count("config error") == 1
    with pytest.raises(ConfigError, match=r"^config error in `reward_weights`: 1 weights for 5 reward functions"):
        validate(PipelineConfig().replace(reward_weights=[1.0]), n_processes=1)


@pytest.mark.parametrize("source, fragment", [
    ("def f(prompts, completions, **kw)\n    return []\n", "SyntaxError"),
    ("raise RuntimeError('no config')\n", "RuntimeError: no config"),
    ("import no_such_dependency_xyz\n", "no_such_dependency_xyz"),
])
def test_plugin_that_fails_to_import_is_one_message(tmp_path, monkeypatch, source, fragment):
    name = f"broken_plugin_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)  # found in the current folder, as `grpo train` run there finds it
    with pytest.raises(ValueError) as err:
        resolve_reward(f"{name}:f")
    assert name in str(err.value) and fragment in str(err.value)


def test_plugin_in_the_current_folder_is_found(tmp_path, monkeypatch):
    (tmp_path / "cwd_reward_plugin.py").write_text("def f(prompts, completions, **kw):\n    return [1.0]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert resolve_reward("cwd_reward_plugin:f")(prompts=[""], completions=[""]) == [1.0]


# --- every kind of callable a user can name, under the name TRL logs it by ------------------------------------

USER_SCORES = '''
import functools


def plain(prompts, completions, **kwargs):
    return [1.0 for _ in completions]


async def coro(prompts, completions, **kwargs):
    return [2.0 for _ in completions]


lam = lambda prompts, completions, **kwargs: [3.0 for _ in completions]  # noqa: E731


def _scaled(prompts, completions, factor, **kwargs):
    return [factor for _ in completions]


half = functools.partial(_scaled, factor=0.5)
double = functools.partial(_scaled, factor=2.0)


async def _async_scaled(prompts, completions, factor, **kwargs):
    return [factor for _ in completions]


async_half = functools.partial(_async_scaled, factor=0.25)


class Scorer:
    def __init__(self, value):
        self.value = value

    def __call__(self, prompts, completions, **kwargs):
        return [self.value for _ in completions]


class AsyncScorer:
    async def __call__(self, prompts, completions, **kwargs):
        return [7.0 for _ in completions]


low, high, remote = Scorer(4.0), Scorer(5.0), AsyncScorer()


class Holder:
    @staticmethod
    def static(prompts, completions, **kwargs):
        return [6.0 for _ in completions]

    scorer = Scorer(8.0)


class Picky:
    def __call__(self, prompts, completions, **kwargs):
        return [len(completions) + "x"]  # a TypeError inside a reward TRL can call


class Narrow:
    def __call__(self, completions):  # cannot take TRL's call: no prompts, no **kwargs
        return [0.0 for _ in completions]


same_as_plain, same_as_low, picky, narrow = plain, low, Picky(), Narrow()
'''

# spec -> (the name it is logged under, the value it gives, async?)
USER_KINDS = {
    "user_scores:plain": ("plain", 1.0, False),
    "user_scores:coro": ("coro", 2.0, True),
    "user_scores:lam": ("lam", 3.0, False),  # a lambda's own name is "<lambda>"
    "user_scores:half": ("half", 0.5, False),  # two partials of one function: each its own name
    "user_scores:double": ("double", 2.0, False),
    "user_scores:low": ("low", 4.0, False),  # two instances of one class: each its own name
    "user_scores:high": ("high", 5.0, False),
    "user_scores:remote": ("remote", 7.0, True),  # an instance with an async __call__
    "user_scores:Holder.static": ("static", 6.0, False),
    "user_scores:Holder.scorer": ("scorer", 8.0, False),  # an instance at a dotted path: its last part
    "user_scores:async_half": ("async_half", 0.25, True),  # a partial of an async function
}


@pytest.fixture
def user_scores(tmp_path, monkeypatch):
    (tmp_path / "user_scores.py").write_text(USER_SCORES, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_scores", raising=False)
    return tmp_path


def _call(func, n=3):
    from grpo_pipeline.rewards.contract import guard_reward

    completions = [[{"role": "assistant", "content": "x"}]] * n
    output = guard_reward(func, hold=lambda failure: pytest.fail(str(failure)))(
        prompts=[[{"role": "user", "content": "q"}]] * n, completions=completions, answer=["1"] * n)
    return asyncio.run(output) if inspect.isawaitable(output) else output


def test_every_kind_of_callable_is_logged_under_its_own_distinct_name_and_called_as_it_is(user_scores):
    """A function, an async one, a lambda, functools.partials, callable instances (sync and async) and a
    staticmethod, all in one list: each keeps a name of its own (TRL's rewards/<name>/mean), the guard keeps it,
    and each is called (and awaited) as what it is."""
    from grpo_pipeline.rewards.contract import guard_reward, is_async_reward

    specs = list(USER_KINDS)
    funcs = get_reward_funcs(specs)
    assert [f.__name__ for f in funcs] == [name for name, _, _ in USER_KINDS.values()]
    for spec, func in zip(specs, funcs):
        name, value, is_async = USER_KINDS[spec]
        assert guard_reward(func).__name__ == name and is_async_reward(func) == is_async, spec
        assert _call(func) == [value] * 3, spec
        direct = func([[{"role": "user", "content": "q"}]], [[{"role": "assistant", "content": "x"}]])  # by position
        assert (asyncio.run(direct) if is_async else direct) == [value], spec


def test_a_nameless_reward_is_told_apart_as_uncallable_or_raising_by_its_own_signature(user_scores):
    """The name's wrapper keeps the reward's signature readable, so the contract tells a reward TRL cannot call
    (fix the signature) from one that raised inside (fix the body)."""
    from grpo_pipeline.rewards.contract import RewardFailure, guard_reward

    picky, narrow = get_reward_funcs(["user_scores:picky", "user_scores:narrow"])
    with pytest.raises(RewardFailure) as caught:
        guard_reward(picky)(prompts=["q"], completions=["x"])
    assert caught.value.detail.startswith("raised TypeError: unsupported operand type(s) for +: 'int' and 'str'")
    with pytest.raises(RewardFailure) as caught:
        guard_reward(narrow)(prompts=["q"], completions=["x"])
    assert caught.value.detail.startswith("cannot be called the way TRL calls it (")


def test_two_rewards_with_one_name_are_logged_under_their_whole_specs(user_scores):
    for module in ("scores_a", "scores_b"):
        (user_scores / f"{module}.py").write_text(
            f"def score(completions, **kwargs):\n    return [{module == 'scores_b':d}.0 for _ in completions]\n")
    funcs = get_reward_funcs(["scores_a:score", "scores_b:score", "correctness"])
    assert [f.__name__ for f in funcs] == ["scores_a.score", "scores_b.score", "correctness_reward_func"]
    assert [_call(f, 1) for f in funcs[:2]] == [[0.0], [1.0]]


def test_the_same_reward_listed_twice_under_two_names_is_refused(user_scores):
    with pytest.raises(ValueError, match=r"'user_scores:same_as_plain' and 'user_scores:plain' are the same reward "
                                         r"\(plain\)"):
        get_reward_funcs(["user_scores:plain", "user_scores:same_as_plain"])
    with pytest.raises(ValueError, match=r"'user_scores:same_as_low' and 'user_scores:low' are the same reward "
                                         r"\(same_as_low\)"):
        get_reward_funcs(["user_scores:low", "user_scores:same_as_low"])


@pytest.mark.parametrize("spec, name", [
    ("trl.rewards.accuracy_reward", "accuracy_reward"),            # TRL's docs and open-r1 write dotted paths
    ("grpo_pipeline.rewards.format.soft_format_reward_func", "soft_format_reward_func"),
    ("grpo_pipeline.rewards.format:soft_format_reward_func", "soft_format_reward_func"),
])
def test_a_reward_is_any_importable_dotted_path_or_module_function(spec, name):
    assert rewards.resolve_reward(spec).__name__ == name


@pytest.mark.parametrize("spec, message", [
    ("nowhere_pkg.module.score", "cannot import module 'nowhere_pkg.module'"),
    (".", "unknown reward '.'"), ("correctnes", "unknown reward 'correctnes'"),
    ("grpo_pipeline.rewards.format.no_such_reward", "has no 'no_such_reward'"),
])
def test_a_dotted_path_that_does_not_resolve_is_named(spec, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        rewards.resolve_reward(spec)


@pytest.mark.parametrize("kwargs, expected", [
    ({"grpo_answer": ["18", "7"], "answer": ["7", "18"]}, [2.0, 0.0]),  # the pipeline's reference wins
    ({"answer": ["18", "7"]}, [2.0, 0.0]),                               # else TRL's `answer` column
    ({"answer": ["She has 18.\n#### 18", "x #### 7"]}, [2.0, 0.0]),      # a GSM8K answer: its final number
    ({"grpo_answer": [None, "7"], "answer": ["18", "18"]}, [None, 0.0]),  # no reference: not judged
])
def test_correctness_reads_the_pipelines_reference_else_the_answer_column(kwargs, expected):
    completions = [[{"role": "assistant", "content": "<answer>18</answer>"}]] * 2
    assert rewards.correctness_reward_func(prompts=None, completions=completions, **kwargs) == expected


@pytest.fixture
def declared_reward():
    """A made-up built-in reward, declared as ours are (rewards/declared.py), and taken back after the test."""
    from grpo_pipeline.rewards.declared import DECLARED, builtin_reward

    @builtin_reward("units", range=(0.0, 1.0), kind="format", learned_at_max=True, reads_reference=True)
    def units_reward_func(completions, **kwargs):
        return [1.0 if "km" in str(c) else 0.0 for c in completions]

    yield units_reward_func
    DECLARED.pop("units")


def test_a_reward_declared_once_is_known_to_every_reader(declared_reward):
    """One decorated function is the whole of a new built-in reward: the registry resolves it by both its names, the
    data path knows it reads the reference, the plots band it by its range, the flat-reward diagnosis and `grpo
    rewards` take its kind, with no table of ours naming it."""
    from grpo_pipeline.pipeline.health.signal import flat_reward_causes
    from grpo_pipeline.pipeline.infer.dry_run import _judges_format
    from grpo_pipeline.pipeline.run.plots import total_reward_range
    from grpo_pipeline.rewards.registry import is_builtin_reward

    assert resolve_reward("units") is resolve_reward("units_reward_func") is declared_reward
    assert is_builtin_reward("units") and reads_reference(["units"]) is True
    assert total_reward_range({"units_reward_func": 2.0, "correctness_reward_func": 1.0}) == (0.0, 4.0)
    (zero,) = flat_reward_causes({"units_reward_func": 0.0}, temperature=1.0)
    (top,) = flat_reward_causes({"units_reward_func": 1.0}, temperature=1.0)
    assert "sft_warmup_steps" in zero and "the form is learned" in top
    assert _judges_format("units_reward_func") and not _judges_format("correctness_reward_func")
