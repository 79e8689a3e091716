"""Evaluation on held-out problems: accuracy, format rate, completion length, garbled rate (`evaluate_rows`, for
`grpo train`'s before/after numbers and `grpo eval` on a saved adapter or the base model).

    grpo eval --lora outputs/run/lora --data configs/qwen2.5-1.5b-gsm8k.yaml --limit 200
    grpo eval --base --model unsloth/Qwen2.5-1.5B-Instruct --data test.jsonl --limit 100 --output base.json
    grpo eval --lora outputs/demo/lora --data demo-arithmetic     # a dataset name, as in dataset_name
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.locations import absolute_path, snapshot
from grpo_pipeline.env.path_check import check_command_paths
from grpo_pipeline.env.paths import atomic_write_json, shell_command
from grpo_pipeline.env.secret_fields import masked
from grpo_pipeline.pipeline.backends import Completion
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, parse_config
from grpo_pipeline.pipeline.data.cache import model_identity, tokenizer_identity
from grpo_pipeline.pipeline.data.columns import removes_unused_columns
from grpo_pipeline.pipeline.data.prepare import answer_reader_version
from grpo_pipeline.pipeline.data.run_data import load_eval_rows
from grpo_pipeline.pipeline.errors import guarded, note_command_options
from grpo_pipeline.pipeline.health import metrics
from grpo_pipeline.pipeline.health.metrics import is_garbled
from grpo_pipeline.pipeline.infer.scoring import Scorer, answer_of, build_scorer, score_with
from grpo_pipeline.pipeline.infer.session import (
    add_inference_arguments,
    data_tokenizer,
    inference_args,
    load_weights,
    resolve_inference,
)
# loop_settings: train.py calls it through this module
from grpo_pipeline.pipeline.infer.tool_loop import LoopSettings, answer, env_rewards, loop_settings, tool_stats  # noqa: F401
from grpo_pipeline.pipeline.preflight import reward_kwargs_outside_training
from grpo_pipeline.pipeline.run.decisions import EvalKey
from grpo_pipeline.pipeline.trainer.agents import Agents
from grpo_pipeline.env.kept import file_sha256, record, reusable, state_key, versions
from grpo_pipeline.rewards import check_reward_names, strict_format_reward_func
from grpo_pipeline.rewards.registry import is_builtin_reward

N_SAMPLES_KEPT = 5  # example completions stored in eval.json


def score_completions(completions: list[Completion], answers: list[Optional[str]],
                      prompts: list[Any]) -> list[dict[str, Any]]:
    """Per completion: answer (answer_of), reference, format_valid (strict XML), tokens, garbled; not correctness."""
    strict = strict_format_reward_func(prompts=None, completions=completions)
    return [
        {
            "completion": str(completion),
            "extracted_answer": answer_of(completion, prompt),
            "answer": answer,
            "format_valid": bool(s and s > 0),
            "completion_tokens": completion.tokens,
            "garbled": is_garbled(completion),
        }
        for completion, answer, prompt, s in zip(completions, answers, prompts, strict, strict=True)
    ]


def eval_scorer(cfg: PipelineConfig, tokenizer) -> Scorer:
    """The run's rewards, called as TRL calls them under `cfg`."""
    return build_scorer(list(cfg.grpo.reward_funcs), lambda columns, texts: reward_kwargs_outside_training(
        cfg.grpo.max_steps, removes_unused_columns(cfg.trl), tokenizer, columns, texts))


def evaluate_rows(generator, tokenizer, rows: list[dict[str, Any]], scorer: Scorer, max_tokens: int,
                  temperature: float = 0.0, top_p: float = 1.0, agents: Optional[Agents] = None,
                  loop: Optional[LoopSettings] = None) -> dict[str, Any]:  # as EVAL_SAMPLING
    """Generate for every row (greedy by default, so runs compare) and aggregate: accuracy by the run's correctness,
    the rewards' means; with tools, through the tool loop, with TRL's tool metrics and each row's calls."""
    completions, rollouts = answer(generator, tokenizer, agents, loop, [row["prompt"] for row in rows],
                                   [{**row.get("columns", {}), "prompt": row["prompt"]} for row in rows], max_tokens,
                                   temperature=temperature, top_p=top_p)
    scored = score_completions(completions, [row["answer"] for row in rows], [row["prompt"] for row in rows])
    verdicts, reward_means = score_with(scorer, rows, completions)
    for name, values in env_rewards(agents, rollouts).items() if rollouts else ():
        known = [v for v in values if v is not None]
        reward_means[name] = sum(known) / len(known) if known else None
    for one, rollout in zip(scored, rollouts or []):
        one.update(rollout.record())
    for one, verdict in zip(scored, verdicts, strict=True):
        one.update(verdict)
    n = len(scored)

    def rate(key: str) -> float:
        return sum(1 for s in scored if s[key]) / n if n else 0.0

    return {
        "n": n,
        "accuracy": rate("correct"),
        "format_rate": rate("format_valid"),
        "mean_completion_length": sum(s["completion_tokens"] for s in scored) / n if n else 0.0,
        "garbled_rate": rate("garbled"),
        "scorer": scorer.name,
        "rewards": reward_means,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "samples": [{"id": row["id"], **s} for row, s in zip(rows[:N_SAMPLES_KEPT], scored[:N_SAMPLES_KEPT])],
        **({"tools": tool_stats(rollouts),
            "tool_calls": {row["id"]: [{"name": c.name, "arguments": c.arguments} for c in rollout.calls]
                           for row, rollout in zip(rows, rollouts)}} if rollouts is not None else {}),
    }


EVAL_BEFORE_NAME = "eval_before.json"
# evaluate_rows' sampling for the before/after/periodic numbers: part of every eval key
EVAL_SAMPLING = {"temperature": 0.0, "top_p": 1.0}


def eval_inputs(key: EvalKey, backend_name: str, tokenizer, rows: list[dict[str, Any]],
                max_tokens: int) -> dict[str, Any]:
    """What an evaluation's numbers depend on besides the weights measured (env/kept.py)."""
    inputs = key.inputs
    return {
        **inputs,
        "model": model_identity(**inputs["model"]),
        "loading": {"backend": backend_name, **inputs["loading"]},
        "tokenizer": tokenizer_identity(tokenizer),
        "eval_rows": {"n": len(rows), "sha256": state_key({"rows": rows})},
        "generation": {"max_tokens": max_tokens, **EVAL_SAMPLING},
        "scoring": {**inputs["scoring"], "rewards_code": answer_reader_version(),
                    "metrics_code": file_sha256(Path(metrics.__file__)), "evaluate_code": file_sha256(Path(__file__))},
        "versions": versions("torch", "transformers", "peft", "trl", "vllm", "unsloth"),
    }


def eval_before_inputs(key: EvalKey, backend_name: str, tokenizer, rows: list[dict[str, Any]],
                       max_tokens: int, warmup: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """`eval_inputs` plus what the measured weights start from, the format warm-up's key included."""
    return {**eval_inputs(key, backend_name, tokenizer, rows, max_tokens), "start": {**key.start, "warmup": warmup}}


def load_eval_before(output_dir: Path, inputs: dict[str, Any], log=print) -> Optional[dict[str, Any]]:
    """The run's saved eval-before result when it was measured from these `inputs`, else None (said why)."""
    saved = reusable(output_dir / EVAL_BEFORE_NAME, inputs, "eval before GRPO", log=log)
    result = saved.get("result") if saved else None
    return result if isinstance(result, dict) else None


def save_eval_before(output_dir: Path, inputs: dict[str, Any], result: dict[str, Any], seen=None) -> None:
    atomic_write_json(output_dir / EVAL_BEFORE_NAME, record(inputs, result=result), seen=seen)


def headline(result: dict[str, Any]) -> str:
    """One line of an eval's numbers, as `grpo train` prints them; with tools, their use.

    >>> headline({"accuracy": 0.5, "format_rate": 1.0, "tools": {"calls_per_rollout": 1.0, "failures_per_call": 0}})
    'accuracy 50.0%, format 100.0%, tool calls per prompt 1.00 (failed 0%)'
    """
    line = f"accuracy {result['accuracy']:.1%}, format {result['format_rate']:.1%}"
    return line + (f", tool calls per prompt {_tool_use(result['tools'])}" if result.get("tools") else "")


def _tool_use(tools: dict[str, float]) -> str:
    return f"{tools['calls_per_rollout']:.2f} (failed {tools['failures_per_call']:.0%})"


def format_table(result: dict[str, Any], title: str) -> str:
    lines = [title, "-" * len(title)]
    for label, key, fmt in (("problems", "n", "{:d}"), ("accuracy", "accuracy", "{:.1%}"),
                            ("format rate", "format_rate", "{:.1%}"),
                            ("mean completion tokens", "mean_completion_length", "{:.1f}"),
                            ("garbled rate", "garbled_rate", "{:.1%}")):
        lines.append(f"{label:<24}{fmt.format(result[key])}")
    if result.get("scorer"):
        lines.append(f"{'accuracy scored by':<24}{result['scorer']} (the run's correctness)")
    if result.get("tools"):
        lines.append(f"{'tool calls per prompt':<24}{_tool_use(result['tools'])}")
    for name, mean in (result.get("rewards") or {}).items():
        shown = ("-" if mean is None else f"not scored: {mean['error'][:80]}" if isinstance(mean, dict)
                 else f"{mean:.3f}")
        lines.append(f"{'mean ' + name:<23} {shown}")  # a long reward name still gets a space before its mean
    return "\n".join(lines)


def evaluate_saved(data: Optional[str] = None, limit: Optional[int] = None, split: Optional[str] = None,
                   output: Optional[str] = None, args: Optional[argparse.Namespace] = None,
                   reward_funcs: Optional[list[str]] = None, **options: Any) -> dict[str, Any]:
    """Evaluate a saved LoRA (lora=DIR) or the base model (base=True, model=... or run=...) with `grpo eval`'s
    options and write eval.json; returns the result. Bad input raises before anything loads."""
    args = args if args is not None else inference_args(**options)
    if limit is not None and limit < 1:
        raise ConfigError("limit", f"--limit {limit}: use a positive number of problems (default: the recipe's "
                          "eval_limit)")
    data = data or args.config
    if not data:
        raise ConfigError("data", "pass --data (a recipe, a .jsonl/.csv/.parquet file or a dataset name) or "
                          "--config RECIPE.yaml")
    if args.base and not (output or args.run):
        raise ConfigError("output", "--base without --run: pass --output FILE for the results (or --run RUN_DIR "
                          "to keep them in that run folder as eval_base.json)")
    if reward_funcs is not None:
        try:
            check_reward_names(reward_funcs)
        except ValueError as err:
            raise ConfigError("reward_funcs", f"--reward_funcs: {err}") from None
    setup = resolve_inference(args)  # no weights yet: the eval set is checked first, as `grpo train` does
    out = _eval_json_path(setup, output, args.run)
    seen = snapshot(out, option="--output" if output else "", fix="Choose another --output, or run again to "
                    "replace it.")
    data_path = absolute_path(data)
    is_recipe = data_path.suffix in (".yaml", ".yml")
    if is_recipe:
        cfg = parse_config(["--config", str(data_path)])
    else:  # a file or folder, or a dataset name as in dataset_name: demo-arithmetic, sample, a hub id
        if not data_path.exists():
            data_path = Path(data)
        cfg = setup.config.replace(eval_dataset_name=str(data_path))
    eval_split = split or cfg.eval.eval_split
    trained = (setup.manifest or {}).get("config") or {}
    if reward_funcs or trained.get("reward_funcs"):  # the rewards it trained with, not a recipe's defaults
        other = args.config and absolute_path(args.config) != data_path  # --config's recipe, unless it is --data's
        yours = [*(cfg.grpo.reward_funcs if is_recipe else ()),
                 *(parse_config(["--config", str(args.config)]).grpo.reward_funcs if other else ())]
        cfg = cfg.replace(reward_funcs=eval_reward_names(trained.get("reward_funcs") or [], yours, reward_funcs),
                          reward_weights=None)
    cfg = cfg.replace(system_prompt=setup.system_prompt, model_name_or_path=setup.base_model, eval_split=eval_split)
    # the data report goes beside the results, never to the recipe's output_dir
    try:
        rows = load_eval_rows(cfg, data_tokenizer(setup), limit=limit, report_dir=out.parent,
                              other_fix="or evaluate other --data")
    except ConfigError as err:
        if err.field in DATA_OPTIONS:
            raise
        # a field of the data (eval_answer_field, eval_question_field, ...): the one place that says where grpo eval,
        # which has no flag of that name, takes it from
        raise ConfigError(err.field, f"{err.message} For grpo eval, put `{err.field}: ...` in a recipe (YAML) and "
                          "pass it as --config (or as --data).") from None
    setup = load_weights(setup)
    result = evaluate_rows(setup.generator, setup.tokenizer, rows, eval_scorer(cfg, setup.tokenizer),
                           setup.max_tokens, temperature=setup.temperature, top_p=setup.top_p, agents=setup.agents,
                           loop=setup.loop)
    result.update(model=setup.base_model, adapter=str(setup.adapter.path) if setup.adapter else None,
                  data=str(data_path), split=eval_split, eval_json=str(out), eval_set=rows.line())
    result = masked(result)  # no secret in the file or on the screen (a --data URL's password)
    atomic_write_json(out, result, seen=seen)
    return result


# The eval set's options that grpo eval's own flags set: --data names the data; the rest only a recipe sets.
DATA_OPTIONS = ("eval_dataset_name", "dataset_name")


def eval_reward_names(recorded: list[str], yours: list[str], given: Optional[list[str]]) -> list[str]:
    """What `grpo eval` scores with: `given`; else the `recorded` rewards, a custom one only when your own recipe
    names it too (`yours`, docs/security.md), what is left out said; with none left, the built-in correctness.

    >>> eval_reward_names(["correctness", "mine:score"], ["mine:score"], None)
    ['correctness', 'mine:score']
    >>> eval_reward_names(["correctness"], [], ["correctness", "mine:score"])
    ['correctness', 'mine:score']
    """
    if given is not None:
        return list(given)
    left_out = [name for name in recorded if not is_builtin_reward(name) and name not in yours]
    kept = [name for name in recorded if name not in left_out] or ["correctness"]
    if left_out:
        print(f"note: the adapter's record names rewards that are someone's code ({', '.join(left_out)}); a file you "
              f"did not write does not decide what code runs, so they are left out and eval scores with "
              f"{', '.join(kept)}. To score with them, pass `{shell_command('--reward_funcs', *recorded)}`.",
              file=sys.stderr)
    return kept


def _eval_json_path(setup, output: Optional[str], run: Optional[str]) -> Path:
    """--output; else the run folder: eval.json beside the adapter, eval_base.json for --base --run."""
    if output:
        return absolute_path(output)
    if setup.trained_dir is not None:
        return setup.trained_dir.parent / "eval.json"
    run_dir = absolute_path(run)
    return (run_dir.parent if run_dir.name == "lora" else run_dir) / "eval_base.json"


@guarded("eval")
def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="grpo eval", description=__doc__.split("\n\n")[0])
    add_inference_arguments(parser)
    parser.add_argument("--data", default=None,
                        help="a YAML recipe (its eval set: eval_dataset_name, else eval_split of dataset_name), a "
                             "data file or folder (a single file is used whole), or a dataset name as in "
                             "dataset_name (demo-arithmetic and sample work offline); default: --config")
    parser.add_argument("--limit", type=int, default=None,
                        help="number of held-out problems (default: the recipe's eval_limit, 100)")
    parser.add_argument("--split", default=None, help="split to evaluate (default: the recipe's eval_split)")
    parser.add_argument("--output", default=None,
                        help="where to write the results (default: eval.json in the adapter's run folder; "
                             "eval_base.json in --run's folder for --base)")
    parser.add_argument("--reward_funcs", nargs="+", default=None, metavar="NAME",
                        help="the rewards to score with: built-in names and your own module:function (default: "
                             "those the adapter trained with; a module:function its record names is imported only "
                             "when you name it here or in your --config / --data recipe)")
    args = parser.parse_args(argv)
    note_command_options(parser)
    check_command_paths("eval", vars(args))
    result = evaluate_saved(args.data, args.limit, args.split, args.output, args=args,
                            reward_funcs=args.reward_funcs)
    title = f"eval: {'LoRA ' + result['adapter'] if result['adapter'] else 'base model ' + result['model']}"
    print(result["eval_set"])
    print(format_table(result, title))
    print(f"wrote {shell_command(result['eval_json'])}")
    return 0
