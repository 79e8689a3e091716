"""Tools, environments and rollout functions handed to the real trl.GRPOTrainer, on the tiny Qwen2 with the real
Qwen2.5 tokenizer and chat template (tools included). A random model never calls a tool by itself, so the tool runs
steer generation with TRL's own `generation_kwargs.sequence_bias` (tests/agent_helpers.py forced_text_bias): the
model writes Qwen2.5's tool-call format, TRL parses it and runs the tool loop, as it would for a trained model.
The tests that need only reach TRL's first step (a fault, a reward source) use the byte-level demo models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_helpers import add, forced_text_bias, tool_call_text
from grpo_pipeline.pipeline.run.manifest import ADAPTER_METADATA_NAME
from grpo_pipeline.pipeline.train import run_training
from train_helpers import tiny_qwen_config

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def calls(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def train_with(tmp_path_factory, monkeypatch_env, name: str, forced: str | None, tokenizer=None, **overrides):
    """One tiny-Qwen2 run, steered to write `forced` (biased with `tokenizer`, the session's Qwen2.5 one, read only):
    (RunResult, the agents' recorded calls, the first training step's metrics, the run folder)."""
    root = tmp_path_factory.mktemp(name)
    log = root / "calls.jsonl"
    monkeypatch_env.setenv("AGENT_CALLS", str(log))
    extra = {}
    if forced is not None:
        extra["generation_kwargs"] = {"sequence_bias": forced_text_bias(tokenizer, forced)}
    settings = dict(max_steps=1, save_steps=100, max_samples=4, num_generations=2, per_device_train_batch_size=2,
                    max_completion_length="96", **extra)
    cfg = tiny_qwen_config(root / "run", **{**settings, **overrides})
    result = run_training(cfg)
    metrics = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return result, calls(log), next(m for m in metrics if "loss" in m), root / "run"


@pytest.fixture(scope="module")
def env_patch():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
        yield mp


@pytest.fixture(scope="module")
def tools_run(tmp_path_factory, env_patch, qwen_tokenizer):
    """Standalone tools (one sync, one async) beside an environment that owns its reward (get_reward)."""
    forced = tool_call_text(("add", {"a": 2, "b": 3}), ("lookup", {"key": "k"}), ("bump", {"by": 2}))
    return train_with(tmp_path_factory, env_patch, "tools", forced, qwen_tokenizer,
                      tools=["agent_helpers:add", "agent_helpers.lookup"], environment_factory="agent_helpers:Counter",
                      max_tool_calling_iterations=1, reward_funcs=["train_helpers:digit_share_reward"],
                      max_completion_length="192")  # room for the second turn's calls, which the cap leaves unrun


def test_sync_and_async_tools_and_an_environment_with_get_reward_run_in_trls_tool_loop(tools_run):
    result, seen, step, run_dir = tools_run
    assert result.status == "completed" and result.steps == 1
    tools = [c.get("tool") for c in seen if "tool" in c]
    assert tools.count("add") == 2 and tools.count("lookup") == 2 and tools.count("bump") == 2  # 2 rollouts
    assert [{k: v for k, v in c.items() if k != "tool"} for c in seen if c.get("tool") == "add"][0] == {"a": 2, "b": 3}
    resets = [c for c in seen if c.get("event") == "reset"]
    # 2 by the check (it builds each environment and calls reset and get_reward on two prepared rows first),
    # then 2 by TRL's 2 rollouts
    assert len(resets) == 4 and all({"prompt", "question", "answer"} <= set(r["columns"]) for r in resets)
    # the check's get_reward on fresh environments (no tool called yet: 0), then the rollouts' (2 tools called)
    assert [c["count"] for c in seen if c.get("event") == "get_reward"] == [0, 0, 2, 2]
    assert step["rewards/Counter/mean"] == 2.0  # get_reward, logged under the class name, weight 1
    assert step["tools/call_frequency"] == 3.0 and step["tools/failure_frequency"] == 0.0
    assert step["tools/max_iterations_share"] == 1.0  # the steered model asks again after its one allowed round


def test_the_records_name_the_tools_and_environments(tools_run):
    _, _, _, run_dir = tools_run
    effective = json.loads((run_dir / "effective_config.json").read_text())
    assert effective["agents"] == {"tools": ["agent_helpers:add", "agent_helpers.lookup"],
                                   "environment_factory": "agent_helpers:Counter",
                                   "tools_offered": ["add", "bump", "lookup"]}
    assert effective["fields"]["max_tool_calling_iterations"]["value"] == 1
    adapter = json.loads((run_dir / "lora" / ADAPTER_METADATA_NAME).read_text())
    assert adapter["config"]["tools"] == ["agent_helpers:add", "agent_helpers.lookup"]
    assert adapter["config"]["environment_factory"] == "agent_helpers:Counter"


@pytest.fixture(scope="module")
def multi_env_run(tmp_path_factory, env_patch, qwen_tokenizer):
    """TRL's multi-environment form: each row's `environment` column picks Counter (get_reward) or Notes (none)."""
    data = tmp_path_factory.mktemp("data") / "mixed.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i}+1?", "answer": str(i + 1),
                                        "environment": ("count", "notes")[i % 2]}) + "\n" for i in range(2)))
    forced = tool_call_text(("bump", {"by": 1}), ("write", {"text": "hi"}))
    return train_with(tmp_path_factory, env_patch, "multi", forced, qwen_tokenizer, dataset_name=str(data),
                      environment_factory={"count": "agent_helpers:Counter", "notes": "agent_helpers:Notes"},
                      max_tool_calling_iterations=1, reward_funcs=["train_helpers:digit_share_reward"],
                      per_device_train_batch_size=4)  # both rows (one per environment), 2 rollouts each


def test_the_multi_environment_form_routes_each_row_to_its_environment(multi_env_run):
    result, seen, step, _ = multi_env_run
    assert result.status == "completed"
    resets = {c["env"] for c in seen if c.get("event") == "reset"}
    assert resets == {"Counter", "Notes"}
    # each environment exposes only its own tools: bump fails in Notes, write in Counter
    assert {c["env"] for c in seen if c.get("tool") == "bump"} == {"Counter"}
    assert {c["env"] for c in seen if c.get("tool") == "write"} == {"Notes"}
    assert step["tools/failure_frequency"] == 0.5
    assert step["rewards/Counter/mean"] == 1.0  # the Notes rollouts have no get_reward: None, left out of the mean


def test_rollout_func_generates_the_completions_and_its_extra_fields_reach_the_rewards(tmp_path, env_patch,
                                                                                       monkeypatch):
    """On the byte-level demo model (one_step_config below): what reaches the rewards does not depend on the
    vocabulary."""
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("AGENT_CALLS", str(log))
    cfg = one_step_config(tmp_path / "run", "tiny-demo", rollout_func="agent_helpers:fixed_rollout",
                          reward_funcs=["agent_helpers:saw_rollout_source"])
    result = run_training(cfg)
    seen = calls(log)
    step = next(m for m in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
                if "loss" in m)
    assert result.status == "completed"
    assert [c for c in seen if "rollout" in c][0] == {"rollout": "fixed_rollout", "prompts": 2, "completions": 2}
    assert {"reward": "saw_rollout_source", "rollout_source": ["fixed"]} in seen
    assert step["rewards/saw_rollout_source/mean"] == 1.0  # "<answer>k</answer>": one digit each


def test_export_keeps_the_chat_templates_tool_support(tools_run, tmp_path, capsys):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import supports_tool_calling

    from cli_helpers import run_cli

    _, _, _, run_dir = tools_run
    code, out = run_cli(["export", "--lora", str(run_dir / "lora"), "--to", "merged16", "--out",
                         str(tmp_path / "merged"), "--backend", "plain"], capsys)
    assert code == 0, out
    exported = AutoTokenizer.from_pretrained(str(tmp_path / "merged"))
    assert supports_tool_calling(exported)
    rendered = exported.apply_chat_template([{"role": "user", "content": "2+3?"}], tools=[add], tokenize=False)
    assert '"name": "add"' in rendered and "<tools>" in rendered


def one_step_config(output_dir: Path, model: str, **overrides):
    """The least run that reaches TRL's first training step: the byte-level demo model (`tiny-demo`, or
    `tiny-demo-tools` with Qwen2.5's chat template and tools), one short arithmetic prompt, a group of 2 and 4-token
    completions. What these tests prove (how an agent's fault or its reward reaches the run) does not depend on the
    vocabulary, and the real tokenizer's 151k-token loads and head are the bulk of a tiny-qwen2.5 run."""
    return tiny_qwen_config(output_dir, model_name_or_path=model, dataset_name="demo-arithmetic", max_seq_length=512,
                            max_samples=2, num_generations=2, per_device_train_batch_size=2,
                            max_completion_length="4", max_steps=1, save_steps=100,
                            lora_target_modules=["q_proj"], **overrides)


def test_a_rollout_func_that_breaks_trls_contract_stops_the_run_naming_it(tmp_path, env_patch):
    """Found while training, an agent's fault ends as a failing reward's does: stopped (exit 3), named, never an
    internal error."""
    cfg = one_step_config(tmp_path / "run", "tiny-demo", rollout_func="agent_helpers:rollout_without_logprobs",
                          reward_funcs=["agent_helpers:saw_rollout_source"])
    result = run_training(cfg)
    assert result.status == "stopped" and result.exit_code == 3
    reason = result.summary["reason"] if "reason" in result.summary else json.dumps(result.summary)
    assert "rollout_func `rollout_without_logprobs` (agent_helpers:rollout_without_logprobs)" in reason
    assert "without 'logprobs'" in reason


def test_an_environments_get_reward_may_be_the_only_reward(tmp_path, env_patch):
    cfg = one_step_config(tmp_path / "run", "tiny-demo-tools", environment_factory="agent_helpers:Counter",
                          reward_funcs=[], max_tool_calling_iterations=1)
    result = run_training(cfg)
    assert result.status == "completed"
    step = next(json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
                if "loss" in json.loads(line))
    assert "rewards/Counter/mean" in step  # TRL's own reward column for it, weight 1
