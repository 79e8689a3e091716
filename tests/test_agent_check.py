"""The check before load speaks for tools, environments and rollout_func: each failure one message naming the tool,
class or row and the fix (exit 2 from `grpo train --check`); what passes is said."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cli_helpers import run_cli
from grpo_pipeline.pipeline.assets import load_qwen_tokenizer
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer
from grpo_pipeline.pipeline.trainer.agent_check import check_agents
from grpo_pipeline.pipeline.trainer.agents import resolve_agents
from train_helpers import tiny_qwen_config

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
COUNTER_AND_NOTES = {"count": "agent_helpers:Counter", "notes": "agent_helpers:Notes"}


@pytest.fixture(scope="module")
def tokenizers():
    return {"qwen": load_qwen_tokenizer(), "demo": load_tokenizer("tiny-demo", False, "hf")}


def training_set(prompt=CHAT, **columns):
    from datasets import Dataset

    return SimpleNamespace(dataset=Dataset.from_dict({"prompt": [prompt], "grpo_id": [3],
                                                      **{k: [v] for k, v in columns.items()}}))


# (options, tokenizer, training-set columns, the field named, words the message must hold)
FAILURES = {
    "a tool without a docstring": (dict(tools=["agent_helpers:undocumented"]), "qwen", {}, "tools",
                                   ["undocumented", "docstring"]),
    "a tool without type hints": (dict(tools=["agent_helpers:untyped"]), "qwen", {}, "tools",
                                  ["untyped (agent_helpers:untyped)", "type hint"]),
    "a tool that is not there": (dict(tools=["agent_helpers:nowhere"]), "qwen", {}, "tools", ["nowhere"]),
    "a chat template without tools": (dict(tools=["agent_helpers:add"]), "demo", {}, "tools",
                                      ["cannot render tool calls", "Qwen2.5-Instruct"]),
    "standard prompts": (dict(tools=["agent_helpers:add"]), "qwen", {"prompt": "2+3="}, "tools", ["conversational"]),
    "an environment without reset": (dict(environment_factory="agent_helpers:NoReset"), "qwen", {},
                                     "environment_factory", ["NoReset", "`reset`"]),
    "an environment tool without hints": (dict(environment_factory="agent_helpers:BadMethod"), "qwen", {},
                                          "environment_factory", ["BadMethod.move", "type hint"]),
    "an environment mapping that is no JSON": (dict(environment_factory="{count: x"), "qwen", {},
                                               "environment_factory", ["JSON"]),
    "rows without an environment column": (dict(environment_factory=COUNTER_AND_NOTES), "qwen", {}, "dataset_name",
                                           ["`environment` column", "count, notes"]),
    "a row naming an unknown environment": (dict(environment_factory=COUNTER_AND_NOTES), "qwen",
                                            {"environment": "game"}, "dataset_name", ["row 3", "game"]),
    "an environment whose constructor raises": (dict(environment_factory="agent_boundary_cases:InitRaises"), "qwen",
                                                {}, "environment_factory", ["`InitRaises()`", "raised OSError"]),
    "an environment whose reset raises": (dict(environment_factory="agent_helpers:ResetRaises"), "qwen", {},
                                          "environment_factory", ["`ResetRaises.reset`", "raised KeyError", "grpo_id"]),
    "an environment whose reset returns a number": (dict(environment_factory="agent_boundary_cases:ResetNumber"),
                                                    "qwen", {}, "environment_factory",
                                                    ["`ResetNumber.reset`", "returned 7 (a int)"]),
    "a get_reward of the wrong type": (dict(environment_factory="agent_helpers:RewardWrongType"), "qwen", {},
                                       "environment_factory", ["`RewardWrongType.get_reward`", "'high' (a str)"]),
    "a get_reward that returns NaN": (dict(environment_factory="agent_boundary_cases:RewardNaN"), "qwen", {},
                                      "environment_factory", ["`RewardNaN.get_reward`", "returned nan", "finite"]),
    "an async get_reward that raises": (dict(environment_factory="agent_boundary_cases:AsyncRewardRaises"), "qwen",
                                        {}, "environment_factory", ["`AsyncRewardRaises.get_reward`",
                                                                    "raised ZeroDivisionError"]),
    "a tool and an environment method with one name": (dict(tools=["agent_helpers:bump"],
                                                            environment_factory="agent_helpers:Counter"), "qwen", {},
                                                       "tools", ["'bump'", "Counter.bump", "Rename one"]),
    "no reward source": (dict(environment_factory="agent_helpers:Notes", reward_funcs=[]), "qwen", {},
                         "reward_funcs", ["no environment has a get_reward"]),
    "a rollout_func of the wrong shape": (dict(rollout_func="agent_helpers:untyped"), "qwen", {}, "rollout_func",
                                         ["(prompts, trainer)"]),
}


@pytest.mark.parametrize("case", FAILURES)
def test_each_failure_names_the_tool_class_or_row_and_the_fix(case, tokenizers, tmp_path):
    options, tokenizer, columns, field, words = FAILURES[case]
    prompt = columns.pop("prompt", CHAT)
    cfg = tiny_qwen_config(tmp_path, **options)
    with pytest.raises(ConfigError) as err:
        check_agents(resolve_agents(cfg.grpo), cfg.model.model_name_or_path, tokenizers[tokenizer],
                     training_set(prompt, **columns), cfg.grpo.reward_funcs)
    assert err.value.field == field
    for word in words:
        assert word in str(err.value)


def test_what_passes_is_said(tokenizers, tmp_path):
    cfg = tiny_qwen_config(tmp_path, tools=["agent_helpers:add", "agent_helpers:lookup"],
                           environment_factory=COUNTER_AND_NOTES, rollout_func="agent_helpers:fixed_rollout")
    said = check_agents(resolve_agents(cfg.grpo), cfg.model.model_name_or_path, tokenizers["qwen"],
                        training_set(environment="notes"))
    assert said == ("tools: add, lookup; environment count: Counter (tools bump; its get_reward is a reward; no "
                    "prepared row names it); environment notes: Notes (tools write; reset called on "
                    "prepared rows); the chat template renders them; rollout_func fixed_rollout")
    assert check_agents(resolve_agents(tiny_qwen_config(tmp_path).grpo),
                        tiny_qwen_config(tmp_path).model.model_name_or_path, tokenizers["qwen"], training_set()) == \
        "no tools, environment_factory or rollout_func"


def test_grpo_train_check_refuses_a_bad_tool_with_exit_2_and_no_traceback(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model_name_or_path: tiny-qwen2.5\nbackend: plain\ndataset_name: sample\nmax_samples: 4\n"
                      f"output_dir: {tmp_path / 'run'}\ntools: [agent_helpers:add, agent_helpers:untyped]\n")
    code, out = run_cli(["train", "--config", str(recipe), "--check"], capsys)
    assert code == 2 and "Traceback" not in out
    assert "untyped (agent_helpers:untyped)" in out and "type hint" in out


def test_the_docs_examples_pass_the_check_and_work(tokenizers, tmp_path, monkeypatch):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "agents.md").read_text(encoding="utf-8")
    tools_code, env_code = re.findall(r"^```python\n(.*?)^```", doc, flags=re.S | re.M)
    (tmp_path / "calc_tools.py").write_text(tools_code)
    (tmp_path / "counter_env.py").write_text(env_code)
    monkeypatch.chdir(tmp_path)
    cfg = tiny_qwen_config(tmp_path / "run", tools=["calc_tools:calculator"],
                           environment_factory="counter_env:Counter")
    said = check_agents(resolve_agents(cfg.grpo), cfg.model.model_name_or_path, tokenizers["qwen"],
                        training_set())
    assert said.startswith("tools: calculator; environment Counter (tools bump; its get_reward is a reward; reset and "
                           "get_reward called on prepared rows)")
    from calc_tools import calculator
    from counter_env import Counter

    env = Counter()
    assert env.reset(answer="3") == " (reach 3 with the `bump` tool)" and env.bump(3) == 3 and env.get_reward() == 1.0
    assert calculator(2, "*", 3) == 6


def test_the_options_are_read_from_yaml_and_the_command_line_with_trls_meaning(tmp_path):
    from grpo_pipeline.pipeline.config import parse_config
    from grpo_pipeline.pipeline.trainer.agents import agent_names, resolve_agents

    recipe = tmp_path / "agent.yaml"
    recipe.write_text("tools: [agent_helpers:add, agent_helpers.lookup]\n"
                      "environment_factory: {count: agent_helpers:Counter, notes: agent_helpers:Notes}\n"
                      "rollout_func: agent_helpers:fixed_rollout\nmax_tool_calling_iterations: 3\n")
    from_yaml = parse_config(["--config", str(recipe)])
    from_cli = parse_config(["--tools", "agent_helpers:add", "agent_helpers.lookup", "--environment_factory",
                             '{"count": "agent_helpers:Counter", "notes": "agent_helpers:Notes"}',
                             "--rollout_func", "agent_helpers:fixed_rollout", "--max_tool_calling_iterations", "3"])
    for cfg in (from_yaml, from_cli):
        assert agent_names(cfg.grpo) == {"tools": ["agent_helpers:add", "agent_helpers.lookup"],
                                    "environment_factory": {"count": "agent_helpers:Counter",
                                                            "notes": "agent_helpers:Notes"},
                                    "rollout_func": "agent_helpers:fixed_rollout"}
        assert int(cfg.trl["max_tool_calling_iterations"]) == 3
        kwargs = resolve_agents(cfg.grpo).trainer_kwargs()  # what trl.GRPOTrainer is handed
        assert [t.__name__ for t in kwargs["tools"]] == ["add", "lookup"]
        assert {k: v.__name__ for k, v in kwargs["environment_factory"].items()} == {"count": "Counter",
                                                                                   "notes": "Notes"}
        assert kwargs["rollout_func"].__name__ == "fixed_rollout"
    single = parse_config(["--environment_factory", "agent_helpers:Counter"])
    # TRL's one-class form
    assert resolve_agents(single.grpo).trainer_kwargs()["environment_factory"].__name__ == "Counter"
