"""`grpo rewards`: the reward dry run. Would GRPO have anything to learn from, before a GPU-hour is spent?

    grpo rewards                                  # no GPU and no --config: the CPU demo's recipe
    grpo rewards --config configs/qwen2.5-1.5b-gsm8k.yaml --prompts 32
    grpo rewards --after-warmup                   # score the model after the recipe's SFT format warm-up

It samples `num_generations` completions for each of `--prompts` training prompts with the recipe's model and
rollout settings, scores them with its rewards, and prints per reward the mean, std, shares of 0 / None / groups
without spread, then a verdict with the fix (pipeline/health/signal.py); it writes `output_dir/reward_dry_run.json`.

Exit codes: 0 (whatever the verdict says), 2 bad config or input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any, Optional

from rich.console import Console, Group
from rich.table import Table

# prepare_dataset is called through its module, looked up at each call: tests stand in for it there.
import grpo_pipeline.pipeline.data.prepare
from grpo_pipeline.env.adapters import AdapterError
from grpo_pipeline.env.locations import absolute_path, snapshot
from grpo_pipeline.env.paths import atomic_write_json
from grpo_pipeline.env.secret_fields import masked
from grpo_pipeline.pipeline.backends import choose_backend, load_backend
from grpo_pipeline.pipeline.bootstrap import backend_choice, defaults_for
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, parse_config
from grpo_pipeline.pipeline.data.columns import ANSWER, ROW_ID, removes_unused_columns
from grpo_pipeline.pipeline.data.prepare import DataError
from grpo_pipeline.pipeline.data.prompts import completion_like
from grpo_pipeline.pipeline.data.run_data import warmup_examples
from grpo_pipeline.pipeline.data.source_spec import DataFileError
from grpo_pipeline.pipeline.errors import fit_to_command, note_command_options, note_run_folder
from grpo_pipeline.pipeline.health.signal import flat_reward_causes, is_flat, no_signal_causes
from grpo_pipeline.pipeline.infer.evaluate import score_completions
from grpo_pipeline.pipeline.preflight import reward_kwargs_outside_training, run_checks
from grpo_pipeline.pipeline.infer.tool_loop import answer, describe, env_rewards, loop_settings, tool_stats
from grpo_pipeline.pipeline.trainer.warmup import run_format_warmup
from grpo_pipeline.rewards import check_reward_weights, get_reward_funcs
from grpo_pipeline.rewards.contract import RewardFailure, call_reward
from grpo_pipeline.rewards.declared import facts_of

DRY_RUN_NAME = "reward_dry_run.json"
DEFAULT_PROMPTS = 16
N_SAMPLES_KEPT = 3


def reward_table(names: list[str], scores: list[list[Optional[float]]], weights: list[float],
                 group_size: int) -> dict[str, dict[str, Any]]:
    """Per reward (and the weighted `total`, as TRL sums it: None counted as 0, None where every reward is None): mean,
    std, zero / None shares, share of flat groups. `scores[i]`: reward i's value per completion.

    >>> table = reward_table(["a"], [[0.0, 0.0, 1.0, 0.0]], [1.0], group_size=2)
    >>> table["a"]["zero_share"], table["a"]["flat_group_share"], table["total"]["mean"]
    (0.75, 0.5, 0.25)
    """
    totals: list[Optional[float]] = []
    for values in zip(*scores):
        scored = [(w, v) for w, v in zip(weights, values) if v is not None]
        totals.append(sum(w * v for w, v in scored) if scored else None)
    table = {}
    for name, values in [*zip(names, scores), ("total", totals)]:
        known = [v for v in values if v is not None]
        groups = [[v for v in values[i:i + group_size] if v is not None] for i in range(0, len(values), group_size)]
        table[name] = {
            "mean": _mean(known),
            "std": _std(known),
            "zero_share": sum(1 for v in known if v == 0) / len(values) if values else None,
            "none_share": (len(values) - len(known)) / len(values) if values else None,
            "flat_group_share": (sum(1 for g in groups if len(g) < 2 or is_flat(_std(g))) / len(groups)
                                 if groups else None),
        }
    return table


def verdicts(table: dict[str, dict[str, Any]], g: Any, clipped_share: float, after_warmup: bool,
             threshold: float, sft_warmup_steps: int) -> list[str]:
    """A line per reward that varies, the cause and fix for flat ones, then the verdict (`g`: cfg.grpo)."""
    rewards = {name: row for name, row in table.items() if name != "total"}
    lines, flat = [], {}
    for name, row in rewards.items():
        if row["mean"] is None:
            lines.append(f"{name}: None on every completion, it judged nothing (check the dataset column it reads)")
        elif is_flat(row["std"]):
            flat[name] = row["mean"]
        elif row["flat_group_share"] >= threshold:
            lines.append(f"{name}: varies between prompts, but not within {row['flat_group_share']:.0%} of the groups")
        else:
            lines.append(f"{name}: ok, it separates completions in {1 - row['flat_group_share']:.0%} of the groups")
    share = table["total"]["flat_group_share"] or 0.0
    if share >= threshold:
        lines += no_signal_causes({n: r["mean"] for n, r in rewards.items() if r["mean"] is not None},
                                  {n: r["std"] for n, r in rewards.items()}, temperature=g.temperature,
                                  num_generations=g.num_generations, clipped_share=clipped_share)
    else:
        lines += flat_reward_causes(flat, temperature=g.temperature, clipped_share=clipped_share,
                                    completions_differ=True)  # the total differs within the groups
    if (sft_warmup_steps > 0 and not after_warmup
            and any(_judges_format(name) and mean == 0 for name, mean in flat.items())):
        lines.append(f"note: this scored the model BEFORE the format warm-up (sft_warmup_steps: "
                     f"{sft_warmup_steps}) that `grpo train` runs first, so a format reward of 0 is "
                     "expected here; rerun with --after-warmup to score the model GRPO starts from")
    if share >= threshold:
        lines.append(f"verdict: NO LEARNING SIGNAL: {share:.0%} of the groups have no spread in the total reward "
                     f"(flat_reward_threshold {threshold:g}); GRPO would learn from {1 - share:.0%} of them")
    else:
        lines.append(f"verdict: learning signal in {1 - share:.0%} of the groups (the total reward differs within "
                     "them); GRPO has something to learn from")
    return lines


def dry_run(cfg: PipelineConfig, n_prompts: int = DEFAULT_PROMPTS, after_warmup: bool = False,
            log=print) -> dict[str, Any]:
    """Sample, score and judge; returns what reward_dry_run.json holds."""
    start = time.time()
    seen = snapshot(absolute_path(cfg.grpo.output_dir) / DRY_RUN_NAME,
                    fix="Another run wrote it meanwhile; run the dry run again when it is done.")
    choice = choose_backend(cfg.model.backend, cfg.model.fast_inference)
    if cfg.model.fast_inference and not choice.fast_inference:
        cfg = cfg.replace(fast_inference=False)
    decided = run_checks(cfg, choice=choice).decisions  # `grpo train`'s pre-load checks
    backend, settings, agents = load_backend(choice.name), decided.config, decided.agents
    backend.prepare_environment(settings)
    log(f"backend: {choice.name} ({choice.reason})")
    if agents.rollout_func is not None:
        log(f"note: rollout_func {cfg.grpo.rollout_func} needs the trainer (its second argument); the dry run "
            "samples with the backend's generator instead")
    g, h = cfg.grpo, cfg.health
    funcs = get_reward_funcs(list(g.reward_funcs)) if g.reward_funcs else []  # none: get_reward is the reward
    weights = check_reward_weights(list(g.reward_funcs), g.reward_weights)
    output_dir = absolute_path(g.output_dir)
    note_run_folder(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    tokenizer = decided.tokenizer
    prepared = grpo_pipeline.pipeline.data.prepare.prepare_dataset(cfg, tokenizer, report_dir=None)
    rows = prepared.dataset.shuffle(seed=g.seed).select(range(min(n_prompts, len(prepared.dataset))))
    model, tokenizer = backend.load_for_training(settings, tokenizer)
    if after_warmup and h.sft_warmup_steps > 0:
        model = run_format_warmup(model, tokenizer, decided.config, prepared,
                                  warmup_examples(decided.data, prepared), agents.tools,
                                  backend.peft_config(settings), output_dir)
    generator, max_tokens = backend.training_generator(model, tokenizer, settings), prepared.max_completion_length
    n = g.num_generations
    log(f"sampling {len(rows)} prompts x {n} completions (temperature {g.temperature:g}, top_p {g.top_p:g}, "
        f"top_k {g.top_k}, min_p {g.min_p}, max_completion_length {max_tokens})"
        + (", the tools live" if agents.uses_tools else ""))
    from transformers import set_seed

    set_seed(g.seed)  # the same completions for the same recipe
    # one entry per completion, as TRL hands them to the rewards
    columns = {key: [row[key] for row in rows for _ in range(n)] for key in rows.column_names}
    chat_prompts = [row["prompt"] for row in rows for _ in range(n)]
    texts, rollouts = answer(generator, tokenizer, agents, loop_settings(cfg.trl, cfg.model.max_seq_length),
                             chat_prompts, [dict(row) for row in rows for _ in range(n)], max_tokens, **_sampling(g))
    # as TRL calls rewards (rewards/trl_source.py)
    kwargs = reward_kwargs_outside_training(g.max_steps, removes_unused_columns(cfg.trl), tokenizer, columns,
                                            [str(text) for text in texts])
    if rollouts and agents.environments:  # TRL hands the rewards each rollout's environment
        kwargs["environments"] = [r.instance for r in rollouts]
    completions = ([r.messages for r in rollouts] if rollouts is not None else
                   [completion_like(prompt, text) for prompt, text in zip(chat_prompts, texts, strict=True)])
    try:  # as the trainer calls them (guarded, async ones awaited)
        scores = [call_reward(func, chat_prompts, completions, kwargs, timeout=g.reward_timeout) for func in funcs]
    except RewardFailure as err:
        raise ConfigError("reward_funcs", f"{err}. It was called on the model's own completions in this dry run, "
                          "as the trainer would call it; the contract: docs/rewards.md.") from None
    extra = env_rewards(agents, rollouts or [])  # an environment's get_reward: a reward of weight 1, as in TRL
    names = [*(func.__name__ for func in funcs), *extra]
    per_reward = [*scores, *extra.values()]
    table = reward_table(names, per_reward, [*weights, *[1.0] * len(extra)], g.num_generations)
    result = _result(cfg.model.model_name_or_path, choice.name, after_warmup, rows, texts, chat_prompts, columns,
                     table, max_tokens, g, h.flat_reward_threshold)
    if rollouts is not None:  # the first completion of the first prompts, with each reward's value
        result["rollouts"] = [{**rollouts[i].record(), "lines": describe(rollouts[i]),
                               "rewards": {name: values[i] for name, values in zip(names, per_reward)}}
                              for i in range(0, len(rollouts), g.num_generations)][:N_SAMPLES_KEPT]
        result["tools"] = tool_stats(rollouts)
    result["verdicts"] = verdicts(table, g, result["clipped_share"], after_warmup, h.flat_reward_threshold,
                                  h.sft_warmup_steps)
    result["wall_time_s"] = round(time.time() - start, 1)
    result["path"] = str(atomic_write_json(seen.path, masked(result), seen=seen))  # no secret in a file
    return result


def _sampling(g: Any) -> dict[str, Any]:
    return dict(temperature=g.temperature, top_p=g.top_p, top_k=g.top_k, min_p=g.min_p)


def _judges_format(name: str) -> bool:
    """A built-in reward that only judges the format, by its logged name."""
    facts = facts_of(name, logged=True)
    return facts is not None and facts.kind == "format"


def _result(model_name: str, backend_name: str, after_warmup: bool, rows, texts, chat_prompts, columns, table,
            max_tokens: int, g: Any, flat_reward_threshold: float) -> dict[str, Any]:
    n = g.num_generations
    scored = score_completions(texts, columns[ANSWER], chat_prompts)
    lengths = [s["completion_tokens"] for s in scored]
    clipped = sum(1 for length in lengths if length >= max_tokens) / len(lengths) if lengths else 0.0
    return {
        "model": model_name, "backend": backend_name, "after_warmup": after_warmup,
        "prompts": len(rows), "num_generations": n, "completions": len(texts),
        "sampling": {**_sampling(g), "max_completion_length": max_tokens},
        "rewards": table,
        "format_hit_rate": sum(1 for s in scored if s["format_valid"]) / len(scored) if scored else 0.0,
        "answer_found_rate": sum(1 for s in scored if s["extracted_answer"]) / len(scored) if scored else 0.0,
        "mean_completion_tokens": _mean(lengths),
        "clipped_share": clipped,
        "flat_reward_threshold": flat_reward_threshold,
        "samples": [{"id": row_id, "completion": text} for row_id, text in
                    zip(columns[ROW_ID][::n], texts[::n][:N_SAMPLES_KEPT])],
    }


def format_result(result: dict[str, Any]) -> Any:
    table = Table(title=f"Rewards on {result['prompts']} prompts x {result['num_generations']} completions "
                        f"({result['model']}, {'after' if result['after_warmup'] else 'without'} the warm-up)",
                  title_justify="left")
    for column in ("reward", "mean", "std", "zero", "None", "flat groups"):
        table.add_column(column, justify="left" if column == "reward" else "right")
    for name, row in result["rewards"].items():
        table.add_row(name, _fmt(row["mean"], "{:.3f}"), _fmt(row["std"], "{:.3f}"), _fmt(row["zero_share"]),
                      _fmt(row["none_share"]), _fmt(row["flat_group_share"]))
    sampling = result["sampling"]
    lines = []
    for k, rollout in enumerate(result.get("rollouts") or [], start=1):
        lines += [f"rollout {k}" + (f" ({rollout['environment']})" if rollout["environment"] else "") + ":",
                  *(f"  {line}" for line in rollout["lines"]),
                  "  rewards: " + ", ".join(f"{name} {_fmt(value, '{:.3f}')}" for name, value in
                                            rollout["rewards"].items())]
    if result.get("tools"):
        lines.append(f"tool calls per rollout {result['tools']['calls_per_rollout']:.2f}, failed "
                     f"{result['tools']['failures_per_call']:.0%} of them")
    lines += [
        f"format hit rate (strict <reasoning>/<answer>) {result['format_hit_rate']:.0%}, an answer found "
        f"{result['answer_found_rate']:.0%}",
        f"completion tokens: mean {_fmt(result['mean_completion_tokens'], '{:.1f}')}, "
        f"{result['clipped_share']:.0%} hit max_completion_length ({sampling['max_completion_length']})",
        *result["verdicts"],
        f"wrote {result['path']}",
    ]
    return Group(table, *lines)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="grpo rewards", description=__doc__.split("\n\n")[0],
        epilog="Any field of `grpo train --help` works as --key value and overrides the recipe.")
    parser.add_argument("--config", metavar="YAML", help="a YAML recipe, as for `grpo train` (default: the same "
                                                         "as `grpo train`: the GPU recipe, or the CPU demo)")
    parser.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS,
                        help=f"training prompts to sample (default {DEFAULT_PROMPTS}); each gets num_generations")
    parser.add_argument("--after-warmup", "--after_warmup", action="store_true",  # the other options' spelling too
                        help="score after the recipe's SFT format warm-up (reuses output_dir/warmup/ when there)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    if any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        return 0
    own, rest = parser.parse_known_args(argv)
    note_command_options(parser, config_fields=True)
    if own.prompts < 1:
        print("error: --prompts must be at least 1", file=sys.stderr)
        return 2
    rest = [*(["--config", own.config] if own.config else []), *rest]
    try:
        rest, base, note = defaults_for(rest, backend_choice(rest))
        if note and not own.json:
            print(f"[grpo] {note.replace('running the built-in tiny CPU demo (a few minutes)', 'using the CPU demo')}",
                  file=sys.stderr)
        cfg = parse_config(rest, base=base)
        result = dry_run(cfg, own.prompts, own.after_warmup,
                         log=(lambda msg: print(f"[grpo] {msg}", file=sys.stderr)) if own.json else
                         (lambda msg: print(f"[grpo] {msg}", flush=True)))
    except (ConfigError, FileNotFoundError, DataError, DataFileError, AdapterError, ValueError) as err:
        print(f"error: {fit_to_command(str(err))}", file=sys.stderr)
        return 2
    if own.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        Console(width=120).print(format_result(result))
    return 0


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _std(values: list[float]) -> Optional[float]:
    """Sample std (n - 1), as TRL's nanstd logs rewards/<name>/std; 0 for a single value."""
    if len(values) < 2:
        return 0.0 if values else None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _fmt(value: Optional[float], pattern: str = "{:.0%}") -> str:
    return "-" if value is None else pattern.format(value)
