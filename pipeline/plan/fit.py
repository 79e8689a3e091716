"""What to change when a recipe does not fit: the smallest change of each knob that makes it fit.

Each knob is a ladder of ever-cheaper values of one setting (or of a pair that must move together, such as
num_generations with the batch that holds one question's group); the first rung that fits is its suggestion.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from pipeline.config import ConfigError
from pipeline.demo.registry import builtin_model
from pipeline.plan import cards  # cards.live_card looked up at call time (tests replace it there)
from pipeline.plan.bundled import smaller_models
from pipeline.plan.cards import Card, card_from_memory
from pipeline.plan.estimate import UNCERTAINTY, Estimate, Workload, estimate_workload
from pipeline.plan.shape import count_parameters, load_shape


@dataclass
class Suggestion:
    changes: dict[str, Any]
    estimate: Estimate

    def describe(self) -> str:
        what = ", ".join(f"{key}: {value}" for key, value in self.changes.items())
        close = ", inside the uncertainty" if self.estimate.band_gib[1] > self.estimate.usable_gib else ""
        return f"{what}  -> {self.estimate.peak_gib:.1f} GiB (margin {self.estimate.margin_gib:+.1f} GiB{close})"


def plan(work: Workload, card: Card) -> Estimate:
    """The estimate of the recipe `work` was read from (estimate.workload) on `card`."""
    shape = load_shape(work.model)
    return estimate_workload(work, shape, count_parameters(shape), card)


def _generations(work: Workload) -> Iterator[dict[str, Any]]:
    questions = max(1, work.rows // work.num_generations)
    for n in range(work.num_generations - 1, 1, -1):
        yield {"num_generations": n, "per_device_train_batch_size": n * questions}


def _completion(work: Workload) -> Iterator[dict[str, Any]]:
    prompt, completion, fixed = work.prompt_tokens, work.completion_tokens, work.completion_fixed
    step = 64
    for length in range((completion - 1) // step * step, step - 1, -step):
        if fixed:
            yield {"max_completion_length": str(length)}
        else:  # auto completion = max_seq_length - prompt: shrink the budget
            yield {"max_seq_length": prompt + length}


def _batch(work: Workload) -> Iterator[dict[str, Any]]:
    total = work.rows * work.accumulation
    for rows in range(work.rows - 1, 0, -1):
        if work.rows % rows == 0:
            yield {"per_device_train_batch_size": rows, "gradient_accumulation_steps": total // rows}


def _share(work: Workload) -> Iterator[dict[str, Any]]:
    if work.path != "unsloth+vllm":
        return
    # With standby Unsloth replaces the share with its own tier, so a smaller share means standby off.
    standby_off = {} if work.vllm_standby == "false" else {"vllm_standby": "false"}
    for hundredths in range(90, 14, -5):
        yield {**standby_off, "gpu_memory_utilization": f"{hundredths / 100:.2f}"}


def _standby(work: Workload) -> Iterator[dict[str, Any]]:
    if work.path == "unsloth+vllm" and work.vllm_standby == "false":
        yield {"vllm_standby": "true"}


def _four_bit(work: Workload) -> Iterator[dict[str, Any]]:
    if not work.load_in_4bit:
        yield {"load_in_4bit": True}


def _model(work: Workload) -> Iterator[dict[str, Any]]:
    for name in smaller_models(work.model):
        yield {"model_name_or_path": name}


# Each knob reads the recipe's numbers (estimate.Workload) and yields its rungs, each a change to the recipe.
KNOBS: tuple[Callable[[Workload], Iterator[dict[str, Any]]], ...] = (
    _standby, _generations, _completion, _batch, _share, _four_bit, _model,
)


# A rung's recipe field and the Workload's, where their names differ.
WORKLOAD_NAMES = {"per_device_train_batch_size": "rows", "gradient_accumulation_steps": "accumulation",
                  "model_name_or_path": "model"}


def changed(work: Workload, changes: dict[str, Any]) -> Workload:
    """`work` as the recipe with a rung's `changes` reads. The knobs set vllm_standby only on the unsloth+vllm path,
    where `true` and `false` are standby on and off (gpu_settings.standby_enabled).

    >>> from pipeline.config import PipelineConfig
    >>> from pipeline.plan.estimate import workload
    >>> work = changed(workload(PipelineConfig()), {"per_device_train_batch_size": 4, "vllm_standby": "false"})
    >>> work.rows, work.vllm_standby, work.standby
    (4, 'false', False)
    """
    fields = {WORKLOAD_NAMES.get(name, name): value for name, value in changes.items()}
    if "vllm_standby" in changes:
        fields["standby"] = str(changes["vllm_standby"]) == "true"
    return dataclasses.replace(work, **fields)


def suggestions(work: Workload, card: Card) -> list[Suggestion]:
    """For each knob, its first rung that fits (a knob with none is left out), smallest peak first."""
    found = []
    for knob in KNOBS:
        for changes in knob(work):
            try:
                result = plan(changed(work, changes), card)
            except ConfigError:
                continue
            if result.fits:
                found.append(Suggestion(changes, result))
                break
    return found


def fitted_recipe(base: dict[str, Any], work: Workload, card: Card) -> tuple[dict[str, Any], str]:
    """The recipe to write: `base` (the YAML's keys and the command line's overrides), plus the first suggestion
    when the recipe (read as `work`) does not fit. Raises ConfigError when nothing single fits."""
    result = plan(work, card)
    if result.fits:
        return dict(base), f"fits {card.name} as it is"
    found = suggestions(work, card)
    if not found:
        raise ConfigError("gpu", f"no single change makes this recipe fit {card.describe()}; plan a larger card "
                          "or a smaller model.")
    return {**base, **found[0].changes}, f"changed to fit {card.name}: {found[0].describe()}"


REFUSE_RATIO = 1.5  # the `memory` check refuses only when the estimate is this far over: below, it warns


def memory_check(work: Workload) -> str:
    """The `memory` check of `grpo train --check` (pipeline/preflight.py).

    Plans for gpu_memory_gb, else the visible GPU (nvidia-smi, no torch); with neither, or a model whose config
    cannot be read offline, it says so and passes. Estimated not to fit: a warning naming the smallest change
    that fits; estimated over REFUSE_RATIO x the usable memory (or vLLM unable to start): a ConfigError.
    """
    builtin = builtin_model(work.model)
    if builtin is not None and builtin.plan_config is None:
        return "not estimated: a built-in CPU model"
    card = card_from_memory(work.gpu_memory_gb) if work.gpu_memory_gb is not None else cards.live_card()
    if card is None:
        return "not estimated: no GPU visible and no gpu_memory_gb (grpo plan --gpu NAME estimates for a card)"
    try:
        result = plan(work, card)
    except ConfigError as err:
        return f"not estimated: {err}"
    summary = (f"estimated peak {result.peak_gib:.1f} GiB (±{UNCERTAINTY:.0%}) of {result.usable_gib:.1f} GiB usable "
               f"on {card.name}")
    if result.fits:
        return f"{summary}, margin {result.margin_gib:+.1f} GiB"
    found = suggestions(work, card)
    fix = (f"smallest change that fits: {found[0].describe()} (all of them: grpo plan)" if found else
           "no single change fits: a larger GPU or a smaller model (grpo plan shows the parts)")
    if result.blocker or result.ratio > REFUSE_RATIO:
        why = result.blocker or f"{result.ratio:.1f}x the usable memory"
        field = next(iter(found[0].changes)) if found else "model_name_or_path"
        raise ConfigError(field, f"{summary}: {why}, so the first step would run out of memory. {fix}. If you know "
                          "the card has more free memory, set gpu_memory_gb to it.")
    return f"warning: {summary}: does not fit by {-result.margin_gib:.1f} GiB; {fix}"
