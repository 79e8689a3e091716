"""`grpo generate`: answers from a saved LoRA (or the base model with --base).

    grpo generate --lora outputs/qwen2.5-gsm8k/lora --prompt "What is 12 * 7?"
    grpo generate --lora outputs/qwen2.5-gsm8k/lora --input prompts.jsonl --output answers.jsonl
    grpo generate --base --run outputs/qwen2.5-gsm8k --prompt "What is 12 * 7?"

Each output line holds the text, the extracted answer and whether the format is valid.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

from grpo_pipeline.env.locations import absolute_path, snapshot
from grpo_pipeline.env.path_check import check_command_paths
from grpo_pipeline.env.paths import atomic_write_text, shell_command
from grpo_pipeline.pipeline.data.clean import check_prompt
from grpo_pipeline.pipeline.data.prompts import as_chat
from grpo_pipeline.pipeline.data.source_spec import DataFileError
from grpo_pipeline.pipeline.errors import guarded, note_command_options
from grpo_pipeline.pipeline.infer.evaluate import score_completions
from grpo_pipeline.pipeline.infer.session import add_inference_arguments, inference_args, open_inference
from grpo_pipeline.pipeline.infer.tool_loop import answer


def read_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of --prompt or a JSONL file (one {"prompt"|"question": ...} per line), the question under "prompt"
    as a training row reaches TRL; a bad line is a DataFileError naming it."""
    if args.prompt is not None:
        return [{"prompt": args.prompt}]
    path = absolute_path(args.input)
    prompts = []
    with open(path, "rb") as handle:
        lines = handle.read().splitlines()
    for number, raw in enumerate(lines, start=1):
        def bad(what: str) -> DataFileError:
            return DataFileError(f"--input {path} line {number}: {what}. Nothing was generated, for that line "
                                 f"or the {len(lines) - 1} other(s): fix or delete it and run again.")

        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as err:
            raise bad(f"is not UTF-8 text (byte {raw[err.start:err.start + 1]!r} at column {err.start + 1}); "
                      "re-save the file as UTF-8") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise bad(f"is not valid JSON ({err.msg}, column {err.colno}); each line holds one object such as "
                      '{"prompt": "What is 2+3?"}') from None
        text = record.get("prompt", record.get("question")) if isinstance(record, dict) else None
        if isinstance(text, list):  # TRL's conversational prompt, as in the training data
            chat, reason = check_prompt(text)
            if reason:
                raise bad(f"its `prompt` is a list but not of {{\"role\": ..., \"content\": \"...\"}} messages "
                          f"with some text ({reason})")
            prompts.append({**record, "prompt": chat})
            continue
        if not isinstance(text, str) or not text.strip():
            raise bad("needs a non-empty field `prompt` or `question`: text, or a list of chat messages")
        prompts.append({**record, "prompt": text.strip()})
    if not prompts:
        raise DataFileError(f"--input {path} holds no prompts (it is empty or blank). Give one "
                            '{"prompt": "..."} object per line.')
    return prompts


def generate_answers(prompts: list[str], args: Optional[argparse.Namespace] = None,
                     rows: Optional[list[dict[str, Any]]] = None, **options) -> list[dict]:
    """One record per prompt, answered with a saved LoRA (or --base); `rows`: each prompt's other columns. From
    Python: `generate_answers(["What is 2+3?"], lora="outputs/run/lora")`."""
    setup = open_inference(args if args is not None else inference_args(**options))
    # as a training row was given: text prompts to a model trained on them ("standard"), else chats
    standard = (setup.manifest or {}).get("prompt_format") == "standard"
    messages = [p if standard and isinstance(p, str) else as_chat(setup.system_prompt, p) for p in prompts]
    columns = [{**row, "prompt": m} for m, row in zip(messages, rows or [{}] * len(messages), strict=True)]
    texts, rollouts = answer(setup.generator, setup.tokenizer, setup.agents, setup.loop, messages, columns,
                             setup.max_tokens, temperature=setup.temperature, top_p=setup.top_p)
    extra = [r.record() for r in rollouts] if rollouts is not None else [{} for _ in texts]
    scored = score_completions(texts, [None] * len(texts), messages)
    return [{"prompt": p, "text": s["completion"], "answer": s["extracted_answer"],
             "format_valid": s["format_valid"], "completion_tokens": s["completion_tokens"], **more,
             "model": setup.base_model, "adapter": str(setup.adapter.path) if setup.adapter else None}
            for p, s, more in zip(prompts, scored, extra)]


@guarded("generate")
def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="grpo generate", description=__doc__.split("\n\n")[0])
    add_inference_arguments(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="one question")
    source.add_argument("--input", help="JSONL file with a `prompt` (or `question`) field per line; with tools, "
                        "its other fields go to the environment's reset(**row), an `environment` field picks one")
    parser.add_argument("--output", help="write JSONL here instead of printing")
    args = parser.parse_args(argv)
    note_command_options(parser)
    check_command_paths("generate", vars(args))
    seen = snapshot(absolute_path(args.output), option="--output",
                    fix="Choose another --output, or run again to replace it.") if args.output else None

    rows = read_rows(args)
    records = generate_answers([row["prompt"] for row in rows], args, rows=rows)
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if seen is not None:
        out = atomic_write_text(seen.path, lines, seen=seen)
        print(f"wrote {len(records)} generations to {shell_command(out)}")
    else:
        sys.stdout.write(lines)
    return 0
