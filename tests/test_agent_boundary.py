"""The user-code boundary around every call into the user's agent code (pipeline/trainer/agent_boundary.py), over the
class: each kind of callable TRL calls (a tool, sync and async; an environment's constructor, reset, tool method and
get_reward, sync and async; a rollout_func) x each kind of fault (raises, exits, wrong type, wrong length, too few
keys, NaN). Each ends as TRL's contract says, or as one named AgentFailure (exit 2 before training, a stop with a
checkpoint while training, as a failing reward): never an error from deep inside TRL."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from cli_helpers import run_cli
from grpo_pipeline.pipeline.trainer.agent_boundary import AgentFailure, ToolCallError, guard_factory, guard_rollout_func, guard_tool
from grpo_pipeline.rewards.contract import RewardFailure, SignalInterrupt

NAN = float("nan")


def fault(kind: str, bad: object):
    """What the user's code does: raise, exit (sys.exit: a BaseException) or return `bad`."""
    if kind == "raises":
        raise ValueError("boom")
    if kind == "exits":
        raise SystemExit(3)
    return bad


# What each kind returns for each fault (absent: the fault has no meaning for that kind)
BAD = {
    "tool": {"wrong type": [1, 2], "NaN": NAN},
    "reset": {"wrong type": 7, "wrong length": ["a", "b"], "NaN": NAN},
    "get_reward": {"wrong type": "high", "wrong length": [1.0, 0.0], "NaN": NAN},
    "rollout_func": {"wrong type": [[1]], "wrong length": {"prompt_ids": [[1]], "completion_ids": [[2]],
                                                           "logprobs": [[0.0]]},
                     "too few keys": {"prompt_ids": [[1], [1]], "completion_ids": [[2], [2]]},
                     "NaN": {"prompt_ids": [[1], [1]], "completion_ids": [[2], [2]], "logprobs": [[NAN], [None]]}},
}
FAULTS = ["raises", "exits", "wrong type", "wrong length", "too few keys", "NaN"]


def make_tool(how: str, is_async: bool):
    if is_async:
        async def lookup(key: str) -> str:
            """Look up.

            Args:
                key: The key.
            """
            await asyncio.sleep(0)
            return fault(how, BAD["tool"].get(how))
        return lookup

    def lookup(key: str) -> str:
        """Look up.

        Args:
            key: The key.
        """
        return fault(how, BAD["tool"].get(how))
    return lookup


def make_environment(where: str, how: str, is_async: bool = False):
    class Broken:
        def __init__(self):
            if where == "init":
                fault(how, None)

        def reset(self, **row):
            return fault(how, BAD["reset"].get(how)) if where == "reset" else None

        def move(self, to: int) -> str:
            """Move.

            Args:
                to: Where.
            """
            return fault(how, BAD["tool"].get(how)) if where == "method" else "moved"

        if is_async:
            async def get_reward(self):
                await asyncio.sleep(0)
                return fault(how, BAD["get_reward"].get(how)) if where == "get_reward" else 1.0
        else:
            def get_reward(self):
                return fault(how, BAD["get_reward"].get(how)) if where == "get_reward" else 1.0

    return Broken


def _run(value):
    return asyncio.run(value) if inspect.isawaitable(value) else value


def call(kind: str, how: str):
    """The guarded callable of `kind` doing `how`, called as TRL calls it; what it returns."""
    if kind in ("tool", "async tool"):
        return _run(guard_tool(make_tool(how, kind == "async tool"), "lookup (mod:lookup)")(key="k"))
    if kind == "rollout_func":
        def roll(prompts, trainer):
            return fault(how, BAD["rollout_func"].get(how))
        return guard_rollout_func(roll, "mod:roll")(["p1", "p2"], object())
    where = {"environment __init__": "init", "reset": "reset", "environment tool method": "method",
             "get_reward": "get_reward", "async get_reward": "get_reward"}[kind]
    env = guard_factory(make_environment(where, how, kind == "async get_reward"), "mod:Broken")()
    if where == "reset":
        return env.reset(answer="3", grpo_id=0)
    if where == "method":
        return _run(env.move(to=1))
    return _run(env.get_reward())


KINDS = ["tool", "async tool", "environment __init__", "reset", "environment tool method", "get_reward",
         "async get_reward", "rollout_func"]
NAMED = {"environment __init__": "Broken()", "reset": "Broken.reset", "get_reward": "Broken.get_reward",
         "async get_reward": "Broken.get_reward", "rollout_func": "roll"}
APPLIES = {"tool": {"raises", "exits", "wrong type", "NaN"}, "environment __init__": {"raises", "exits"},
           "reset": {"raises", "exits", "wrong type", "wrong length", "NaN"},
           "get_reward": {"raises", "exits", "wrong type", "wrong length", "NaN"}, "rollout_func": set(FAULTS)}
APPLIES.update({"async tool": APPLIES["tool"], "environment tool method": APPLIES["tool"],
                "async get_reward": APPLIES["get_reward"]})
CASES = [(kind, how) for kind in KINDS for how in FAULTS if how in APPLIES[kind]]


@pytest.mark.parametrize("kind,how", CASES, ids=[f"{k}-{h}" for k, h in CASES])
def test_every_call_into_agent_code_ends_as_trls_contract_says_or_as_one_named_failure(kind, how):
    tool = kind in ("tool", "async tool", "environment tool method")
    if tool and how == "raises":  # TRL's meaning: the model reads {"error": "boom"}, a failed call
        with pytest.raises(ValueError, match="boom"):
            call(kind, how)
    elif tool and how == "NaN":  # any value is a result: TRL hands the model str(value)
        assert call(kind, how) != call(kind, how)  # nan, returned as it is
    elif tool:  # exits, or a list that is not content blocks: still a failed call (an Exception TRL catches)
        with pytest.raises(ToolCallError) as caught:
            call(kind, how)
        assert ("move" if kind == "environment tool method" else "lookup") in str(caught.value)
        assert isinstance(caught.value, Exception) and not isinstance(caught.value, RewardFailure)
    elif kind == "rollout_func" and how == "NaN":  # TRL's meaning: a NaN or None logprob is neutralised
        assert call(kind, how)["logprobs"][1] == [None]
    else:
        with pytest.raises(AgentFailure) as caught:
            call(kind, how)
        message = str(caught.value)
        assert f"`{NAMED[kind]}`" in message and "mod:" in message, message
        assert isinstance(caught.value, RewardFailure)  # a run stops on it as on a failing reward
        said = {"raises": "raised ValueError: boom", "exits": "raised SystemExit: 3"}.get(how)
        if said:
            assert said in message
        elif how == "too few keys":
            assert "without 'logprobs'" in message
        elif kind == "rollout_func" and how == "wrong length":
            assert "returned 1 prompt_ids for 2 prompts" in message
        else:
            assert "returned" in message


@pytest.mark.parametrize("where", ["reset", "get_reward", "method"])
def test_a_real_signal_passes_through(where):
    class Interrupted:
        def reset(self, **row):
            if where == "reset":
                raise SignalInterrupt("SIGTERM")

        def move(self, to: int) -> str:
            """Move.

            Args:
                to: Where.
            """
            raise SignalInterrupt("SIGTERM")

        def get_reward(self):
            raise SignalInterrupt("SIGTERM")

    env = guard_factory(Interrupted, "mod:Interrupted")()
    with pytest.raises(SignalInterrupt):
        {"reset": lambda: env.reset(), "get_reward": env.get_reward, "method": lambda: env.move(to=1)}[where]()


def test_the_guarded_environment_is_still_the_users_class_with_its_tools_schemas_and_kinds():
    from transformers.utils.chat_template_utils import get_json_schema

    cls = make_environment("none", "ok", is_async=True)
    env = guard_factory(cls, "mod:Broken")()
    assert type(env) is cls and guard_factory(cls, "mod:Broken").__name__ == "Broken"  # TRL names the reward so
    assert get_json_schema(env.move)["function"]["name"] == "move"
    assert inspect.iscoroutinefunction(env.get_reward)  # TRL awaits an async get_reward on its loop
    assert asyncio.run(env.get_reward()) == 1.0 and env.reset() is None


def test_a_valid_rollout_passes_unchanged():
    out = {"prompt_ids": [[1, 2]], "completion_ids": [[3]], "logprobs": [[-0.5]], "source": ["x"], "tag": "all"}
    assert guard_rollout_func(lambda prompts, trainer: out, "mod:r")(["p"], object()) is out


RECIPE = ("model_name_or_path: tiny-qwen2.5\nbackend: plain\ndataset_name: sample\nmax_samples: 4\n"
          "output_dir: {out}\nenvironment_factory: agent_helpers:{env}\n{extra}")


@pytest.mark.parametrize("env,extra,code,words", [
    ("ResetRaises", "", 2, ["environment `ResetRaises.reset`", "raised KeyError", "called with the row"]),
    ("Counter", "reward_funcs: []\n", 0, ["its get_reward is a reward", "reset and get_reward called"]),
], ids=["reset raises", "get_reward the only reward"])
def test_grpo_train_check_calls_the_environment_first(env, extra, code, words, tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(out=tmp_path / "run", env=env, extra=extra))
    got, out = run_cli(["train", "--config", str(recipe), "--check"], capsys)
    assert got == code, out
    assert "Traceback" not in out and "a bug in grpo-pipeline" not in out
    for word in words:
        assert word in out, out
