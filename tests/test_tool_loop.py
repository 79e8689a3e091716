"""The tool loop outside training (pipeline/infer/tool_loop.py): TRL's own _tool_call_loop driven by the backend's
generator, in `grpo rewards`, `grpo generate` and `grpo eval`; and what `grpo generate` does with an adapter vLLM
cannot serve.

The loop's mechanics run against a scripted generator (the one stand-in, at the generator boundary: it writes the
turns a trained model would); the commands run end to end on the tiny Qwen2 with the real Qwen2.5 tokenizer, steered
to call the tools by transformers' own `sequence_bias` (tests/agent_helpers.py forced_text_bias), as the training
tests steer TRL's rollouts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agent_helpers import forced_text_bias, tool_call_text
from grpo_pipeline.pipeline.backends import Completion
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.trainer.agents import resolve_agents
from train_helpers import tiny_qwen_config

CALLS = tool_call_text(("add", {"a": 2, "b": 3}), ("lookup", {"key": "k"}), ("bump", {"by": 2}))


@pytest.fixture(autouse=True)
def _silence_trl(monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")


class Scripted:
    """A generator writing the given turns in order (each ended by <|im_end|>), keeping the prompts it was given."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.prompts = tokenizer, list(turns), []

    def generate(self, prompts, max_tokens, **sampling):
        done = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            ids = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False)
            ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
            done.append(Completion(self.tokenizer.decode(ids, skip_special_tokens=True), len(ids), ids))
        return done


def loop(tokenizer, turns, max_iterations, rows=None, **options):
    """`turns` through run_as_trained with the session's Qwen2.5 tokenizer (read only: it encodes and renders)."""
    from grpo_pipeline.pipeline.infer.tool_loop import LoopSettings, run_as_trained

    generator = Scripted(tokenizer, turns)
    rows = rows or [{"question": "2+3?", "answer": "5"}]
    agents = resolve_agents(tiny_qwen_config(Path("unused"), **options).grpo)
    rollouts = run_as_trained(LoopSettings(max_iterations, 2048), generator, tokenizer, agents,
                              [[{"role": "user", "content": "2+3?"}]] * len(rows), rows, 400)
    return rollouts, generator, tokenizer, agents


def test_sync_and_async_tools_an_environment_and_a_failing_call_run_in_trls_loop(qwen_tokenizer):
    from grpo_pipeline.pipeline.infer.tool_loop import describe, env_rewards, tool_stats

    rollouts, generator, tokenizer, agents = loop(
        qwen_tokenizer, [CALLS + "\n" + tool_call_text(("nope", {})), "<answer>5</answer>"], 3,
        tools=["agent_helpers:add", "agent_helpers.lookup"], environment_factory="agent_helpers:Counter")
    (rollout,) = rollouts
    assert [(c.name, c.arguments, c.result, c.error) for c in rollout.calls] == [
        ("add", {"a": 2, "b": 3}, "5", None), ("lookup", {"key": "k"}, "value-of-k", None),
        ("bump", {"by": 2}, "2", None), ("nope", {}, "{'error': 'Tool nope not found.'}", "Tool nope not found.")]
    assert rollout.turns == 2 and rollout.completion == "<answer>5</answer>"
    assert rollout.environment == "Counter" and rollout.env_reward == 2.0  # get_reward after the loop
    assert env_rewards(agents, rollouts) == {"Counter": [2.0]}
    assert tool_stats(rollouts) == {"calls_per_rollout": 4.0, "failures_per_call": 0.25}
    first, second = (tokenizer.decode(ids) for ids in generator.prompts)
    assert '"name": "add"' in first and '"name": "bump"' in first  # the schemas, environment methods included
    assert first.endswith("(you may bump the counter)<|im_end|>\n<|im_start|>assistant\n")  # reset's observation
    assert second.startswith(first) and "<tool_response>\n5\n</tool_response>" in second  # no re-tokenising
    assert describe(rollout)[1] == "  add(a=2, b=3) -> '5'"


def test_the_cap_leaves_the_last_calls_unrun_and_an_environment_without_get_reward_scores_nothing(qwen_tokenizer):
    from grpo_pipeline.pipeline.infer.tool_loop import describe, env_rewards

    turns = [tool_call_text(("write", {"text": "hi"})), tool_call_text(("write", {"text": "x"}))]
    rollouts, _, _, agents = loop(qwen_tokenizer, turns, 1, environment_factory="agent_helpers:Notes")
    (rollout,) = rollouts
    assert [(c.result, c.error) for c in rollout.calls] == [("ok", None), (None, None)]
    assert rollout.env_reward is None and env_rewards(agents, rollouts) == {}
    assert describe(rollout)[-1] == "  write(text='x') -> not run (max_tool_calling_iterations)"


def test_the_multi_environment_form_routes_each_row_and_refuses_a_row_without_one(qwen_tokenizer):
    from grpo_pipeline.pipeline.config import ConfigError

    envs = {"count": "agent_helpers:Counter", "notes": "agent_helpers:Notes"}
    bump = tool_call_text(("bump", {"by": 1}))
    rows = [{"environment": "count"}, {"environment": "notes"}]
    rollouts, _, _, _ = loop(qwen_tokenizer, [bump, bump, "done", "done"], 2, rows=rows, environment_factory=envs)
    assert [r.environment for r in rollouts] == ["Counter", "Notes"]
    assert [r.calls[0].error for r in rollouts] == [None, "Tool bump not found."]
    with pytest.raises(ConfigError, match="environment"):
        loop(qwen_tokenizer, ["x"], 1, rows=[{"question": "q"}], environment_factory=envs)


# ------------------------------------------------------------------ the commands, on the tiny Qwen2, steered


@pytest.fixture
def steered(monkeypatch, qwen_tokenizer):
    """Every model the plain backend loads writes CALLS, then ends its turn (transformers' sequence_bias)."""
    from grpo_pipeline.pipeline.backends import plain

    bias = forced_text_bias(qwen_tokenizer, CALLS)
    real = plain.load_model

    def load_model(*args, **kwargs):
        model = real(*args, **kwargs)
        model.generation_config.sequence_bias = bias
        return model

    monkeypatch.setattr(plain, "load_model", load_model)


@pytest.mark.slow
def test_grpo_rewards_runs_rollouts_with_the_tools_live_and_shows_them(steered, tmp_path, capsys):
    from grpo_pipeline.pipeline.infer.dry_run import main

    options = dict(model_name_or_path="tiny-qwen2.5", backend="plain", dataset_name="sample", max_seq_length=1024,
                   num_generations=2, per_device_train_batch_size=2, lora_r=8, lora_alpha=16,
                   max_completion_length=192, max_tool_calling_iterations=1, max_samples=4, output_dir=tmp_path / "r",
                   reward_funcs="train_helpers:digit_share_reward", environment_factory="agent_helpers:Counter")
    argv = [f"--{key}={value}" for key, value in options.items()]
    argv += ["--lora_target_modules", "q_proj", "v_proj", "--tools", "agent_helpers:add", "agent_helpers.lookup",
             "--prompts", "1"]
    assert main(argv) == 0
    shown = capsys.readouterr().out
    result = json.loads((tmp_path / "r" / "reward_dry_run.json").read_text())
    assert set(result["rewards"]) == {"digit_share_reward", "Counter", "total"}
    assert result["rewards"]["Counter"]["mean"] == 2.0  # get_reward: bump(by=2) ran once in each rollout
    (rollout,) = result["rollouts"]
    assert [(c["name"], c["result"]) for c in rollout["tool_calls"]] == [
        ("add", "5"), ("lookup", "value-of-k"), ("bump", "2"), ("add", None), ("lookup", None), ("bump", None)]
    assert rollout["rewards"]["Counter"] == 2.0 and result["tools"]["calls_per_rollout"] == 3.0
    assert "rollout 1 (Counter):" in shown and "add(a=2, b=3) -> '5'" in shown
    assert "not run (max_tool_calling_iterations)" in shown and "Counter 2.000" in shown


def tiny_adapter(folder: Path, tokenizer, modules_to_save=None, **recorded) -> Path:
    """A LoRA on the tiny Qwen2, saved as a run saves it (adapter, `tokenizer` (the session's real Qwen2.5 one, only
    saved), grpo_adapter.json naming `recorded`)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path
    from grpo_pipeline.pipeline.run.manifest import build_manifest, write_adapter_metadata

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen2.5"))
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                            modules_to_save=modules_to_save, task_type="CAUSAL_LM"))
    peft.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    cfg = tiny_qwen_config(folder.parent, **recorded)
    write_adapter_metadata(folder, build_manifest(
        cfg_dict=cfg.to_dict(), backend="plain", base_model="tiny-qwen2.5", system_prompt=cfg.data.system_prompt,
        chat_template=tokenizer.chat_template, max_prompt_length=256, max_completion_length=192,
        data_fingerprint="test", adapter_dir=folder))
    return folder


@pytest.mark.slow
def test_generate_and_eval_run_the_tools_you_name_never_the_adapters_record_alone(steered, qwen_tokenizer, tmp_path,
                                                                                   capsys):
    """The adapter's record names its tools; they run only when the command names them (a shared adapter's record
    does not decide what code runs): without the options, exit 2 naming the exact ones, and nothing imported."""
    from grpo_pipeline.pipeline.infer import generate
    from grpo_pipeline.pipeline.infer.evaluate import evaluate_saved
    from grpo_pipeline.pipeline.infer.generate import generate_answers

    lora = tiny_adapter(tmp_path / "run" / "lora", qwen_tokenizer, tools=["agent_helpers:add", "agent_helpers.lookup"],
                        environment_factory="agent_helpers:Counter", max_tool_calling_iterations=1,
                        max_seq_length=1024)
    sys.modules.pop("agent_helpers", None)
    assert generate.main(["--lora", str(lora), "--prompt", "What is 2+3?"]) == 2
    said = capsys.readouterr().err
    assert "--tools agent_helpers:add agent_helpers.lookup --environment_factory agent_helpers:Counter" in said
    assert "tools" in said and "Traceback" not in said and "agent_helpers" not in sys.modules
    with pytest.raises(ConfigError, match="A file you did not write"):
        evaluate_saved("sample", limit=2, output=str(tmp_path / "refused.json"), lora=str(lora))
    assert not (tmp_path / "refused.json").exists()
    recorded = {"tools": ["agent_helpers:add", "agent_helpers.lookup"], "environment_factory": "agent_helpers:Counter"}
    (answer,) = generate_answers(["What is 2+3?"], lora=str(lora), **recorded)
    assert [(c["name"], c["result"]) for c in answer["tool_calls"][:3]] == [
        ("add", "5"), ("lookup", "value-of-k"), ("bump", "2")]
    assert answer["environment"] == "Counter" and answer["env_reward"] == 2.0
    out = tmp_path / "answers.jsonl"  # overridden on the command line: only `add` is there
    assert generate.main(["--lora", str(lora), "--prompt", "What is 2+3?", "--tools", "agent_helpers:add",
                          "--environment_factory", "", "--output", str(out)]) == 0
    answer = json.loads(out.read_text())
    assert [c["error"] for c in answer["tool_calls"][:3]] == [None, "Tool lookup not found.", "Tool bump not found."]
    assert answer["environment"] is None and answer["env_reward"] is None
    result = evaluate_saved("sample", limit=2, output=str(tmp_path / "eval.json"), lora=str(lora), **recorded)
    assert result["tools"] == {"calls_per_rollout": 3.0, "failures_per_call": 0.0}
    assert result["rewards"]["Counter"] == 2.0 and result["samples"][0]["turns"] == 2
    assert json.loads((tmp_path / "eval.json").read_text())["tools"] == result["tools"]


def test_generate_input_rows_reach_the_environments_as_training_rows_do(steered, qwen_tokenizer, tmp_path,
                                                                        monkeypatch):
    """`grpo generate --input`: a row's other fields go to its environment's reset(**row) and an `environment`
    field picks one in the multi-environment form, as a training row does; a row naming none is refused (exit 2)
    before anything is generated."""
    from grpo_pipeline.pipeline.infer import generate

    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("AGENT_CALLS", str(calls))
    lora = tiny_adapter(tmp_path / "run" / "lora", qwen_tokenizer, tools=["agent_helpers:add"],
                        max_tool_calling_iterations=1,
                        max_seq_length=1024)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "What is 2+3?", "environment": "count", "level": 3}) + "\n"
                    + json.dumps({"question": "What is 4+4?", "environment": "notes"}) + "\n")
    out = tmp_path / "answers.jsonl"
    options = ["--lora", str(lora), "--tools", "agent_helpers:add", "--environment_factory",
               json.dumps({"count": "agent_helpers:Counter", "notes": "agent_helpers:Notes"})]
    assert generate.main([*options, "--input", str(rows), "--output", str(out)]) == 0
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["environment"] for a in answers] == ["Counter", "Notes"]
    resets = [json.loads(line) for line in calls.read_text().splitlines() if '"reset"' in line]
    assert resets[0] == {"env": "Counter", "event": "reset", "columns": ["level", "prompt"]}  # TRL keeps the name
    assert resets[1]["env"] == "Notes"
    rows.write_text(json.dumps({"prompt": "What is 2+3?"}) + "\n")  # the multi form needs a name per row
    assert generate.main([*options, "--input", str(rows), "--output", str(tmp_path / "none.jsonl")]) == 2
    assert not (tmp_path / "none.jsonl").exists()


def test_the_tool_loop_settings_are_the_recipes_trl_options_and_its_context():
    from grpo_pipeline.pipeline.config import from_mapping
    from grpo_pipeline.pipeline.infer.tool_loop import LoopSettings, loop_settings

    cfg = from_mapping({"max_seq_length": 1024, "max_tool_calling_iterations": 3,
                        "chat_template_kwargs": {"enable_thinking": False}})
    assert loop_settings(cfg.trl, cfg.model.max_seq_length) == LoopSettings(3, 1024, {"enable_thinking": False})
    assert loop_settings(from_mapping({}).trl, 512) == LoopSettings(None, 512, None)


def test_an_adapter_with_modules_trained_in_full_is_not_handed_to_vllm(qwen_tokenizer, tmp_path, capsys):
    from grpo_pipeline.pipeline.infer.session import _servable, verify_trained_dir

    lora = tiny_adapter(tmp_path / "run" / "lora", qwen_tokenizer, modules_to_save=["lm_head"])
    cfg = tiny_qwen_config(tmp_path, vllm_mode="colocate")
    assert cfg.replace(vllm_mode=_servable(cfg.model.vllm_mode,
                                           verify_trained_dir(lora))).model.vllm_mode == "none"
    said = capsys.readouterr().err
    assert "trains modules in full (lm_head)" in said and "transformers + peft, not vLLM" in said
    # the base model, or LoRA matrices alone (doctest)
    assert cfg.replace(vllm_mode=_servable(cfg.model.vllm_mode, None)).model.vllm_mode == "colocate"


def test_export_refuses_a_template_that_no_longer_renders_the_tools_it_trained_with(qwen_tokenizer, tmp_path,
                                                                                     monkeypatch):
    """`grpo export` runs this on what it wrote (tests/test_agents.py exports a tool run and it passes)."""
    from grpo_pipeline.pipeline.config import from_mapping
    from grpo_pipeline.pipeline.infer.export import check_tool_support
    from grpo_pipeline.pipeline.trainer.agents import agent_names

    broken = tmp_path / "broken"
    # the session's tokenizer, its template swapped for this test only: one that drops the tools
    monkeypatch.setattr(qwen_tokenizer, "chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    qwen_tokenizer.save_pretrained(str(broken))
    with pytest.raises(RuntimeError, match="no longer renders tools"):
        check_tool_support(broken, agent_names(from_mapping({"tools": ["agent_helpers:add"]}).grpo),
                           "merged16")
    # trained without tools: nothing to keep
    check_tool_support(broken, agent_names(from_mapping({}).grpo), "merged16")


@pytest.mark.slow
def test_grpo_trains_eval_before_and_after_answer_through_the_tool_loop(steered, tmp_path, capsys):
    """`grpo train`'s own eval (before, after) runs the run's tools, as `grpo eval` does: stats and each row's calls
    in eval_before.json and summary.json, and the calls per prompt in the printed lines."""
    from grpo_pipeline.pipeline.train import run_training

    cfg = tiny_qwen_config(tmp_path / "run", tools=["agent_helpers:add", "agent_helpers.lookup"],
                           environment_factory="agent_helpers:Counter", max_tool_calling_iterations=1,
                           reward_funcs=["train_helpers:digit_share_reward"], max_completion_length="192",
                           max_steps=1, save_steps=100, max_samples=4, num_generations=2,
                           per_device_train_batch_size=2, eval_before=True, eval_after=True, eval_limit=2,
                           eval_dataset_name="sample")
    assert run_training(cfg).status == "completed"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    before = json.loads((tmp_path / "run" / "eval_before.json").read_text())["result"]
    for result in (before, summary["eval_before"], summary["eval_after"]):
        assert result["tools"] == {"calls_per_rollout": 3.0, "failures_per_call": 0.0}
        assert result["rewards"]["Counter"] == 2.0 and len(result["tool_calls"]) == 2
        assert next(iter(result["tool_calls"].values()))[0] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    out = capsys.readouterr().out
    assert "eval before GRPO: accuracy" in out and "eval after GRPO: accuracy" in out
    assert out.count("tool calls per prompt 3.00 (failed 0%)") == 2
    # the run's last line names the tools: `grpo generate` runs an adapter's tools only when they are named
    assert "--tools agent_helpers:add agent_helpers.lookup --environment_factory agent_helpers:Counter" in out
