"""Does the CPU agent demo learn to call its `calculator` tool? configs/cpu-agent-demo.yaml, before and after GRPO.

Runs the recipe as `grpo train --config configs/cpu-agent-demo.yaml` does (format warm-up on tool conversations,
then GRPO with the correctness reward and TRL's tool loop live), then scores the held-out split twice: the warmed-up
model before GRPO (output_dir/warmup/) and the trained adapter (output_dir/lora/). `grpo eval` answers in one turn
(its tool loop is not built yet), so this bench runs one itself: greedy, the recipe's prompts and tools through the
chat template, each reply parsed with TRL's own `parse_response`, a call run and its result appended as TRL's loop
does (`max_tool_calling_iterations` rounds), the final answer scored with the run's correctness reward.

    python bench/agent_demo.py                 # seed 0, the recipe's (4-6 minutes on 2 shared cores)
    python bench/agent_demo.py --seeds 1 2

Prints, per seed and model: accuracy, the share of rollouts that called the tool (a call TRL parsed) and that
called it right (calculator with the question's operands and `*`), and the run's wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPE = ROOT / "configs" / "cpu-agent-demo.yaml"
OPERANDS = re.compile(r"(\d{3})\D+(\d{2})\D")
BATCH = 25


def _generate(model, tokenizer, conversations, tools, max_new_tokens):
    """Greedy replies to a batch of conversations, as TRL's parse_response reads them (prefix: the prompt's ids)."""
    import torch  # lazy: a bench script, torch only once it runs
    from trl.chat_template_utils import parse_response

    prompts = [tokenizer.apply_chat_template(c, tools=tools, add_generation_prompt=True, tokenize=False)
               for c in conversations]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    replies = []
    for row, prompt in zip(out, prompts):
        ids = [i for i in row[batch["input_ids"].shape[1]:].tolist() if i != tokenizer.pad_token_id]
        replies.append(parse_response(tokenizer, ids, prefix=tokenizer(prompt, add_special_tokens=False)["input_ids"]))
    return replies


def _call_is_right(call: dict, question: str) -> bool:
    a, b = OPERANDS.search(question).groups()
    args = call["function"].get("arguments") or {}
    return (call["function"].get("name") == "calculator" and str(args.get("a")) == a and str(args.get("b")) == b
            and args.get("op") == "*")


def tool_rollouts(model, tokenizer, rows, cfg, tools) -> dict:
    """Held-out rows answered with the tool loop; accuracy, tool calls and right tool calls, as shares."""
    from pipeline.data.prompts import build_prompt
    from rewards import correctness_reward_func

    by_name = {tool.__name__: tool for tool in tools}
    rounds = int(cfg.trl.get("max_tool_calling_iterations") or 1)
    called = right = correct = 0
    for start in range(0, len(rows), BATCH):
        chunk = rows[start:start + BATCH]
        conversations = [build_prompt(cfg.data.system_prompt, r["question"]) for r in chunk]
        completions = [[] for _ in chunk]
        pending = list(range(len(chunk)))
        for round_ in range(rounds + 1):
            replies = _generate(model, tokenizer, [conversations[i] for i in pending], tools,
                                int(cfg.data.max_completion_length))
            still = []
            for i, reply in zip(pending, replies):
                completions[i].append(reply)
                calls = reply.get("tool_calls") or []
                if round_ == 0 and calls:
                    called += 1
                    right += _call_is_right(calls[0], chunk[i]["question"])
                if calls and round_ < rounds:
                    conversations[i] = conversations[i] + [reply]
                    for call in calls:
                        function = call["function"]
                        try:
                            result = str(by_name[function["name"]](**(function.get("arguments") or {})))
                        except Exception as err:  # noqa: BLE001 - TRL hands the model the error, as here
                            result = {"error": str(err)}
                        tool_message = {"role": "tool", "name": function["name"], "content": str(result)}
                        conversations[i].append(tool_message)
                        completions[i].append(tool_message)
                    still.append(i)
            pending = still
            if not pending:
                break
        rewards = correctness_reward_func(completions=completions, answer=[r["answer"] for r in chunk])
        correct += sum(1 for r in rewards if r and r > 0)
    n = len(rows)
    return {"accuracy": correct / n, "tool_calls": called / n, "right_tool_calls": right / n}


def _load(folder: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.demo.model import demo_tools_model_dir

    base = AutoModelForCausalLM.from_pretrained(demo_tools_model_dir())
    model = PeftModel.from_pretrained(base, str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(demo_tools_model_dir())
    return model, tokenizer


def one_seed(seed: int, work: Path, overrides: dict) -> dict:
    import torch
    from trl.chat_template_utils import add_response_schema

    from pipeline.config import from_mapping, read_recipe
    from pipeline.demo.registry import builtin_source
    from pipeline.train import run_training
    from pipeline.trainer.agents import resolve_agents

    run_dir = work / f"seed-{seed}"
    cfg = from_mapping({**read_recipe(str(RECIPE)), "output_dir": str(run_dir), "seed": seed, **overrides})
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        run_training(cfg)
    seconds = time.monotonic() - started
    torch.set_num_threads(1)  # the tiny model is faster on one thread (pipeline/demo/registry.py one_cpu_thread)
    source = builtin_source(cfg.data.dataset_name)
    rows = source.rows(source.split_size("test"), seed, "test")
    tools = list(resolve_agents(cfg).tools)
    figures = {"train_seconds": seconds}
    for label, folder in (("before", run_dir / "warmup"), ("after", run_dir / "lora")):
        model, tokenizer = _load(folder)
        add_response_schema(tokenizer)
        figures[label] = tool_rollouts(model, tokenizer, rows, cfg, tools)
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="recipe overrides to try (e.g. max_steps=80 learning_rate=3e-4)")
    args = parser.parse_args(argv)
    import yaml

    overrides = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.set)}
    with tempfile.TemporaryDirectory(prefix="agent-demo-") as tmp:
        for seed in args.seeds:
            f = one_seed(seed, Path(tmp), overrides)
            for label in ("before", "after"):
                m = f[label]
                print(f"seed {seed} {label:6s} GRPO: accuracy {m['accuracy']:.0%}, called the tool "
                      f"{m['tool_calls']:.0%}, right call {m['right_tool_calls']:.0%}", flush=True)
            print(f"seed {seed} grpo train: {f['train_seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
