"""What to change when a recipe does not fit: each knob is a ladder of ever-cheaper values of one setting (or a
pair that moves together), and its first rung that fits is its suggestion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, parse_limit
from grpo_pipeline.pipeline.demo.registry import builtin_model
from grpo_pipeline.pipeline.plan import cards  # cards.live_card looked up at call time (tests replace it there)
from grpo_pipeline.pipeline.plan.cards import Card, card_from_memory
from grpo_pipeline.pipeline.plan.estimate import UNCERTAINTY, Estimate, estimate, memory_path, token_budget
from grpo_pipeline.pipeline.plan.shape import count_parameters, load_shape, smaller_models


@dataclass
class Suggestion:
    changes: dict[str, Any]
    estimate: Estimate

    def describe(self) -> str:
        what = ", ".join(f"{key}: {value}" for key, value in self.changes.items())
        close = ", inside the uncertainty" if self.estimate.band_gib[1] > self.estimate.usable_gib else ""
        return f"{what}  -> {self.estimate.peak_gib:.1f} GiB (margin {self.estimate.margin_gib:+.1f} GiB{close})"


def plan(cfg: PipelineConfig, card: Card) -> Estimate:
    """The estimate of the recipe `cfg` on `card`."""
    shape = load_shape(cfg.model.model_name_or_path)
    return estimate(cfg, shape, count_parameters(shape), card)


def _generations(cfg: PipelineConfig) -> Iterator[dict[str, Any]]:
    questions = max(1, cfg.grpo.per_device_train_batch_size // cfg.grpo.num_generations)
    for n in range(cfg.grpo.num_generations - 1, 1, -1):
        yield {"num_generations": n, "per_device_train_batch_size": n * questions}


def _completion(cfg: PipelineConfig) -> Iterator[dict[str, Any]]:
    prompt, completion = token_budget(cfg)
    fixed = parse_limit(cfg.data.max_completion_length, "max_completion_length") is not None
    step = 64
    for length in range((completion - 1) // step * step, step - 1, -step):
        if fixed:
            yield {"max_completion_length": str(length)}
        else:  # auto completion = max_seq_length - prompt: shrink the budget
            yield {"max_seq_length": prompt + length}


def _batch(cfg: PipelineConfig) -> Iterator[dict[str, Any]]:
    g = cfg.grpo
    total = g.per_device_train_batch_size * g.gradient_accumulation_steps
    for rows in range(g.per_device_train_batch_size - 1, 0, -1):
        if g.per_device_train_batch_size % rows == 0:
            yield {"per_device_train_batch_size": rows, "gradient_accumulation_steps": total // rows}


def _share(cfg: PipelineConfig) -> Iterator[dict[str, Any]]:
    if memory_path(cfg) != "unsloth+vllm":
        return
    # With standby Unsloth replaces the share with its own tier, so a smaller share means standby off.
    standby_off = {} if cfg.model.vllm_standby == "false" else {"vllm_standby": "false"}
    for hundredths in range(90, 14, -5):
        yield {**standby_off, "gpu_memory_utilization": f"{hundredths / 100:.2f}"}


def _standby(cfg: PipelineConfig) -> Iterator[dict[str, Any]]:
    if memory_path(cfg) == "unsloth+vllm" and cfg.model.vllm_standby == "false":
        yield {"vllm_standby": "true"}


def _four_bit(cfg: PipelineConfig) -> Iterator[dict[str, Any]]:
    if not cfg.model.load_in_4bit:
        yield {"load_in_4bit": True}


def _model(cfg: PipelineConfig) -> Iterator[dict[str, Any]]:
    for name in smaller_models(cfg.model.model_name_or_path):
        yield {"model_name_or_path": name}


# Each knob reads the recipe and yields its rungs, each a change to the recipe (`cfg.replace(**changes)`).
KNOBS: tuple[Callable[[PipelineConfig], Iterator[dict[str, Any]]], ...] = (
    _standby, _generations, _completion, _batch, _share, _four_bit, _model,
)


def suggestions(cfg: PipelineConfig, card: Card) -> list[Suggestion]:
    """For each knob, its first rung that fits (a knob with none is left out), smallest peak first."""
    found = []
    for knob in KNOBS:
        for changes in knob(cfg):
            try:
                result = plan(cfg.replace(**changes), card)
            except ConfigError:
                continue
            if result.fits:
                found.append(Suggestion(changes, result))
                break
    return found


def fitted_recipe(base: dict[str, Any], cfg: PipelineConfig, card: Card) -> tuple[dict[str, Any], str]:
    """The recipe to write: `base`, plus the first suggestion when `cfg` does not fit (ConfigError when none)."""
    result = plan(cfg, card)
    if result.fits:
        return dict(base), f"fits {card.name} as it is"
    found = suggestions(cfg, card)
    if not found:
        raise ConfigError("gpu", f"no single change makes this recipe fit {card.describe()}; plan a larger card "
                          "or a smaller model.")
    return {**base, **found[0].changes}, f"changed to fit {card.name}: {found[0].describe()}"


REFUSE_RATIO = 1.5  # the `memory` check refuses only when the estimate is this far over: below, it warns


def memory_check(cfg: PipelineConfig) -> str:
    """The `memory` check of `grpo train --check` for gpu_memory_gb, else the visible GPU: not fitting is a warning
    naming the smallest change that fits; over REFUSE_RATIO (or vLLM unable to start) a ConfigError."""
    builtin = builtin_model(cfg.model.model_name_or_path)
    if builtin is not None and builtin.plan_config is None:
        return "not estimated: a built-in CPU model"
    card = card_from_memory(cfg.model.gpu_memory_gb) if cfg.model.gpu_memory_gb is not None else cards.live_card()
    if card is None:
        return "not estimated: no GPU visible and no gpu_memory_gb (grpo plan --gpu NAME estimates for a card)"
    try:
        result = plan(cfg, card)
    except ConfigError as err:
        return f"not estimated: {err}"
    summary = (f"estimated peak {result.peak_gib:.1f} GiB (±{UNCERTAINTY:.0%}) of {result.usable_gib:.1f} GiB usable "
               f"on {card.name}")
    if result.fits:
        return f"{summary}, margin {result.margin_gib:+.1f} GiB"
    found = suggestions(cfg, card)
    fix = (f"smallest change that fits: {found[0].describe()} (all of them: grpo plan)" if found else
           "no single change fits: a larger GPU or a smaller model (grpo plan shows the parts)")
    if result.blocker or result.ratio > REFUSE_RATIO:
        why = result.blocker or f"{result.ratio:.1f}x the usable memory"
        field = next(iter(found[0].changes)) if found else "model_name_or_path"
        raise ConfigError(field, f"{summary}: {why}, so the first step would run out of memory. {fix}. If you know "
                          "the card has more free memory, set gpu_memory_gb to it.")
    return f"warning: {summary}: does not fit by {-result.margin_gib:.1f} GiB; {fix}"
