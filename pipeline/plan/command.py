"""`grpo plan [--config X] [--gpu NAME | --gpu_memory_gb N] [--gpus N] [--nodes M] [--write FILE] [--json] [--table]
[--key value ...]`.

Prints the recipe's estimated peak GPU memory, part by part, whether it fits the card (named, given by its
memory, or the visible one read with nvidia-smi), and, when it does not, the smallest change of each knob that
makes it fit. `--write FILE` writes the fitted recipe as YAML for `grpo train --config FILE`. `--table` prints
the configs/qwen2.5-*.yaml x cards table of docs/gpu.md. `--gpus N` (per machine) and `--nodes M` add the scale-out
plan: which Accelerate config (DDP, ZeRO-2, ZeRO-3) and the memory each GPU needs under it (docs/scale-out.md).
Exit: 0 fits (or table/write done), 1 does not fit (with --gpus/--nodes: under the plan), 2 bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import yaml

from grpo_pipeline.env.locations import snapshot
from grpo_pipeline.env.paths import atomic_write_text, shell_command
from grpo_pipeline.env.secret_fields import masked, secrets_in
from grpo_pipeline.pipeline.backends import planned_backend
from grpo_pipeline.pipeline.bootstrap import DEFAULT_GPU_RECIPE
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, parse_config, parse_limit, read_recipe, validate
from grpo_pipeline.pipeline.config.parse import config_path, normalize_argv
from grpo_pipeline.pipeline.plan.cards import KNOWN_CARDS, TABLE_CARDS, Card, card_by_name, card_from_memory, live_card
from grpo_pipeline.pipeline.plan.estimate import UNCERTAINTY, Estimate, token_budget
from grpo_pipeline.pipeline.plan.fit import fitted_recipe, plan, suggestions
from grpo_pipeline.pipeline.plan.scale import render_scale, scale_dict, scale_plan
from grpo_pipeline.pipeline.plan.shape import count_parameters, load_shape

RECIPES_DIR = Path(__file__).resolve().parent.parent.parent / "configs"
PLAN_FLAGS = {"--gpu": True, "--gpus": True, "--nodes": True, "--write": True, "--json": False, "--table": False}


def split_plan_flags(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The plan's own flags (not config fields) and the rest, for parse_config.

    >>> split_plan_flags(["--gpu", "T4", "--json", "--num_generations", "4"])
    ({'gpu': 'T4', 'json': True}, ['--num_generations', '4'])
    """
    flags: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        name, _, inline = argv[i].partition("=")
        if name in PLAN_FLAGS:
            if PLAN_FLAGS[name]:
                value = inline if "=" in argv[i] else (argv[i + 1] if i + 1 < len(argv) else None)
                if value is None or value.startswith("--"):
                    example = {"--gpu": "T4", "--gpus": "8", "--nodes": "2"}.get(name, "fitted.yaml")
                    raise ConfigError(name[2:], f"{name} needs a value, e.g. {name} {example}")
                flags[name[2:]] = value
                i += 1 if "=" in argv[i] else 2
                continue
            flags[name[2:]] = True
        else:
            rest.append(argv[i])
        i += 1
    return flags, rest


def resolve_card(gpu_memory_gb: Optional[float], gpu: Optional[str]) -> Card:
    """--gpu NAME, else gpu_memory_gb, else the visible GPU; refused when none is given and none is here."""
    if gpu is not None and gpu_memory_gb is not None:
        raise ConfigError("gpu", "give either --gpu NAME or --gpu_memory_gb N, not both.")
    if gpu is not None:
        return card_by_name(gpu)
    if gpu_memory_gb is not None:
        return card_from_memory(gpu_memory_gb)
    found = live_card()
    if found is None:
        raise ConfigError("gpu", "no GPU visible (nvidia-smi found none): name the card to plan for, e.g. --gpu T4, "
                          f"or give its memory, --gpu_memory_gb 15. Known cards: {', '.join(KNOWN_CARDS)}.")
    return found


def verdict(result: Estimate) -> str:
    if result.blocker:
        return f"DOES NOT FIT on {result.card.name}: {result.blocker}"
    word = "FITS" if result.fits else "DOES NOT FIT"
    text = (f"{word} on {result.card.name}: peak {result.peak_gib:.1f} GiB of {result.usable_gib:.1f} GiB usable, "
            f"margin {result.margin_gib:+.1f} GiB")
    if result.fits and result.band_gib[1] > result.usable_gib:
        text += " (inside the uncertainty: it may not fit)"
    return text


def render(cfg: PipelineConfig, result: Estimate, source: str) -> str:
    shape = load_shape(cfg.model.model_name_or_path)
    counts = count_parameters(shape)
    prompt, completion = token_budget(cfg)
    auto = parse_limit(cfg.data.max_prompt_length, "max_prompt_length") is None
    assumed = f" (max_prompt_length auto: {prompt} assumed; `grpo data` measures it)" if auto else ""
    lines = [
        f"grpo plan: {source} on {result.card.describe()}",
        f"model: {cfg.model.model_name_or_path} ({shape.source}): {counts.total / 1e9:.2f}B parameters, "
        f"{shape.num_hidden_layers} layers, hidden {shape.hidden_size}, vocab {shape.vocab_size}, "
        f"{'tied' if shape.tie_word_embeddings else 'untied'} embeddings",
        f"path: {result.backend}; {cfg.grpo.per_device_train_batch_size} completions per micro-batch of {prompt} "
        f"prompt + {completion} completion tokens{assumed}",
    ]
    for part in result.parts:
        lines.append(f"  {part.name:<12} {part.gib:7.2f} GiB  {part.how}")
    low, high = result.band_gib
    fixed = f"; the {result.reserved_gib:.1f} GiB vLLM reservation is exact" if result.reserved_gib else ""
    lines.append(f"peak {result.peak_gib:.1f} GiB ±{UNCERTAINTY:.0%} on the estimated part (the error against "
                 f"published figures and measured peaks, bench/memory_plan.py{fixed}): {low:.1f}-{high:.1f} GiB")
    lines.append(f"  = {result.peak_how}")
    lines += [f"note: {note}" for note in result.notes]
    lines.append(verdict(result))
    return "\n".join(lines)


def as_dict(result: Estimate) -> dict[str, Any]:
    return {
        "card": result.card.name, "total_gib": round(result.card.total_gib, 2),
        "usable_gib": round(result.usable_gib, 2), "backend": result.backend,
        "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
        "parts_gib": {p.name: round(p.gib, 3) for p in result.parts}, "peak_gib": round(result.peak_gib, 2),
        "uncertainty": UNCERTAINTY, "fits": result.fits, "margin_gib": round(result.margin_gib, 2),
        "blocker": result.blocker, "notes": result.notes,
    }


def recipe_table(cards: tuple[str, ...] = TABLE_CARDS) -> str:
    """The markdown table of docs/gpu.md: each configs/qwen2.5-*.yaml on each card."""
    recipes = sorted(RECIPES_DIR.glob("qwen2.5-*.yaml"), key=lambda p: float(p.name.split("-")[1].rstrip("b")))
    header = "| recipe | " + " | ".join(cards) + " |"
    lines = [header, "|" + "---|" * (len(cards) + 1)]
    for recipe in recipes:
        cfg = parse_config(["--config", str(recipe)])
        cells = []
        for name in cards:
            result = plan(cfg, card_by_name(name))
            word = ("fits?" if result.band_gib[1] > result.usable_gib else "fits") if result.fits else "no"
            cells.append(f"{word} ({result.margin_gib:+.1f} GiB)")
        lines.append(f"| `configs/{recipe.name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_recipe(path: str, recipe: dict[str, Any], how: str) -> Path:
    """Write the fitted recipe with its secrets as placeholders (a placeholder read back is unset: read_recipe)."""
    shown = masked(recipe)
    placeholders = sorted({shown for _, shown in secrets_in(recipe)})
    again = (f"# Secrets are shown as placeholders ({', '.join(placeholders)}): pass them "
             "again on the command line, or keep them in the environment (HF_TOKEN).\n" if shown != recipe else "")
    text = (f"# Written by `grpo plan --write`: {how}.\n" + again
            + yaml.safe_dump(shown, sort_keys=False, allow_unicode=True))
    try:
        # a full or read-only place is a StorageError naming --write (exit 2 at the command line); other failures:
        return atomic_write_text(path, text, seen=snapshot(path, option="--write"))
    except OSError as err:
        raise ConfigError("write", f"cannot write {Path(path).resolve()}: {err.strerror or err}. Choose a writable "
                          "path, e.g. --write fitted.yaml") from None


def base_mapping(rest: list[str], flat: dict[str, Any]) -> dict[str, Any]:
    """The recipe's own keys plus the command line's overrides (their parsed values from `flat`), for --write."""
    argv = normalize_argv(rest)
    path = config_path(argv)
    mapping = read_recipe(path) if path else {}
    for arg in argv:
        if arg.startswith("--") and arg != "--config":
            name = arg[2:].split("=", 1)[0].replace("-", "_").removeprefix("no_")
            if name in flat:
                mapping[name] = flat[name]
    return mapping


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    try:
        flags, rest = split_plan_flags(argv)
        if flags.get("table"):
            print(recipe_table())
            return 0
        if config_path(normalize_argv(rest)) is None:
            rest = ["--config", str(DEFAULT_GPU_RECIPE), *rest]
        source = config_path(normalize_argv(rest))
        cfg = parse_config(rest)
        counts = gpu_counts(flags)
        if counts is None:
            validate(cfg, backend=planned_backend(cfg.model.backend).NAME, run_user_code=False)
        card = resolve_card(cfg.model.gpu_memory_gb, flags.get("gpu"))
        result = plan(cfg, card)
        scale = scale_plan(cfg, card, *counts) if counts else None  # validates for its number of processes
        if flags.get("json"):
            out = as_dict(result)
            out["suggestions"] = [] if result.fits else [
                {"changes": s.changes, "peak_gib": round(s.estimate.peak_gib, 2),
                 "margin_gib": round(s.estimate.margin_gib, 2)} for s in suggestions(cfg, card)]
            if scale is not None:
                out["scale"] = scale_dict(scale)
            print(json.dumps(out, indent=2))
        else:
            print(render(cfg, result, str(source)))
            if scale is not None:
                print(render_scale(scale, card))
            elif not result.fits:
                found = suggestions(cfg, card)
                print("smallest changes that fit (each on its own):" if found else
                      "no single change fits: plan a larger card or a smaller model.")
                for s in found:
                    print(f"  {s.describe()}")
        if flags.get("write"):
            recipe, how = fitted_recipe(base_mapping(rest, cfg.to_dict()), cfg, card)
            written = write_recipe(flags["write"], recipe, how)
            train_it = shell_command("grpo", "train", "--config", written)  # pastes back as printed
            print(f"wrote {shell_command(written)} ({how}); train it with: {train_it}", file=sys.stderr)
            return 0
    except ConfigError as err:
        print(f"grpo plan: {err}", file=sys.stderr)
        return 2
    return 0 if (scale.fits if scale is not None else result.fits) else 1


def gpu_counts(flags: dict[str, Any]) -> Optional[tuple[int, int]]:
    """(--gpus, --nodes) when either is given (the other defaults to 1), else None.

    >>> gpu_counts({"gpus": "8"}), gpu_counts({})
    ((8, 1), None)
    """
    if "gpus" not in flags and "nodes" not in flags:
        return None
    counts = []
    for name in ("gpus", "nodes"):
        value = flags.get(name, "1")
        if not str(value).isdigit() or int(value) < 1:
            raise ConfigError(name, f"--{name} {value}: give a whole number of at least 1, e.g. --{name} 2.")
        counts.append(int(value))
    return counts[0], counts[1]
