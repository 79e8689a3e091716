"""The CPU agent demo (configs/cpu-agent-demo.yaml): the recipe passes the check, and its warm-up teaches Qwen2.5's
tool-call format. Whether it learns is a minutes-long claim: bench/agent_demo.py measures it (docs/agents.md)."""

import json
from pathlib import Path

from cli_helpers import run_cli
from grpo_pipeline.pipeline.config import from_mapping, read_recipe
from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer
from grpo_pipeline.pipeline.demo.calculator import CALCULATOR, calculator
from grpo_pipeline.pipeline.trainer.agents import resolve_agents
from grpo_pipeline.pipeline.trainer.warmup import with_tools

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "cpu-agent-demo.yaml"


def test_the_agent_demo_recipe_passes_the_check(tmp_path, capsys):
    code, out = run_cli(["train", "--config", str(RECIPE), "--check", "--output_dir", str(tmp_path / "run"),
                         "--max_samples", "16"], capsys)
    assert code == 0, out
    assert "tools: calculator; the chat template renders them" in out


def test_the_warmup_renders_tool_calls_through_the_chat_template_and_learns_only_the_assistants_turns(tmp_path):
    from trl.chat_template_utils import get_training_chat_template

    cfg = from_mapping({**read_recipe(str(RECIPE)), "output_dir": str(tmp_path)})
    examples, conversations = with_tools(resolve_agents(cfg.grpo).tools,
                                         CALCULATOR.warmup_examples(20, cfg.data.system_prompt, seed=0))
    assert conversations
    tokenizer = load_tokenizer(cfg.model.model_name_or_path, False, "hf")
    example = next(e for e in examples if len(e["completion"]) == 3)
    args = example["completion"][0]["tool_calls"][0]["function"]["arguments"]
    result = str(calculator(**args))
    messages = example["prompt"] + example["completion"]
    text = tokenizer.apply_chat_template(messages, tools=json.loads(example["tools"]), tokenize=False)
    call = f'<tool_call>\n{{"name": "calculator", "arguments": {json.dumps(args)}}}\n</tool_call>'
    assert '"name": "calculator"' in text.split("<|im_end|>")[0]  # the tool's schema, in the system turn
    assert call in text and f"<tool_response>\n{result}\n</tool_response>" in text
    assert text.endswith(f"<answer>{result}</answer><|im_end|>\n")
    # TRL's assistant_only_loss: the call and the answer are learnt, the tool's result is not
    rendered = tokenizer.apply_chat_template(messages, tools=json.loads(example["tools"]), tokenize=True,
                                             return_dict=True, return_assistant_tokens_mask=True,
                                             chat_template=get_training_chat_template(tokenizer))
    learnt = tokenizer.decode([t for t, m in zip(rendered["input_ids"], rendered["assistant_masks"]) if m])
    assert call in learnt and f"<answer>{result}</answer>" in learnt and "<tool_response>" not in learnt


def test_held_out_problems_are_new_and_need_the_tool():
    test = CALCULATOR.rows(100, split="test")
    assert not {p["question"] for p in test} & {p["question"] for p in CALCULATOR.rows(2000, split="train")}
    assert all(len(p["answer"]) >= 4 for p in test)
