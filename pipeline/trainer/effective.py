"""The algorithm that ran: every trl.GRPOConfig field as the trainer ran it, in the run folder's effective_config.json.

A recipe is not what trains: the backend adds its settings and Unsloth's UnslothGRPOConfig replaces TRL's defaults
(pipeline/backends/unsloth_config.py); `predicted_changes` gives the changed-field lines before anything loads.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from grpo_pipeline.env.paths import atomic_write_json
from grpo_pipeline.env.secret_fields import masked
from grpo_pipeline.pipeline.backends import load_backend
from grpo_pipeline.pipeline.config import PipelineConfig, trl_training_args
from grpo_pipeline.pipeline.config.trl_fields import grpo_config_class, trl_with
from grpo_pipeline.pipeline.trainer.agents import agent_names

EFFECTIVE_CONFIG_NAME = "effective_config.json"


def trl_defaults() -> dict[str, Any]:
    """TRL's own GRPOConfig defaults (the dataclass's, before its __post_init__), for every init field."""
    cls = next((c for c in grpo_config_class().__mro__  # TRL's class, also where Unsloth's subclass stands
                if c.__name__ == "GRPOConfig" and c.__module__.startswith("trl.")), grpo_config_class())
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)
            if f.init and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)}


def _plain(value: Any) -> Any:
    """A value as effective_config.json holds it (and as two values are compared): JSON, enums by their value."""
    return json.loads(json.dumps(getattr(value, "value", value), default=str))


@dataclasses.dataclass(frozen=True)
class Change:
    """A field a backend set: from `before` (the recipe's value, else TRL's default) to `after`, and why."""

    name: str
    before: Any
    after: Any
    why: str

    def line(self) -> str:
        return f"{self.name}: {self.before!r} -> {self.after!r} ({self.why})"


def backend_changes(backend_name: str, passed: dict[str, Any], backend_kwargs: dict[str, Any],
                    recipe: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Change]:
    """The fields backend `backend_name` sets, predicted: its own GRPOConfig kwargs where they differ from the
    recipe (or TRL's default), then what its config class does to all of `passed` (its `config_rewrites`)."""
    changes: dict[str, Change] = {}
    for name, value in backend_kwargs.items():
        before = recipe.get(name, defaults.get(name))
        if _plain(value) != _plain(before):
            why = f"the {backend_name} backend, from " + trl_with("backend_decided").get(
                name, "its device and vLLM settings")
            changes[name] = Change(name, _plain(before), _plain(value), why)
    for name, (value, why) in load_backend(backend_name).config_rewrites(passed, defaults).items():
        changes[name] = Change(name, _plain(passed.get(name, defaults.get(name))), _plain(value), why)
    return changes


def predicted_values(backend_name: str, passed: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """Every field as backend `backend_name`'s config class starts it from `passed` (before TRL's __post_init__)."""
    rewrites = load_backend(backend_name).config_rewrites(passed, defaults)
    return {**defaults, **passed, **{name: value for name, (value, _) in rewrites.items()}}


def effective_record(backend_name: str, cfg: PipelineConfig, args: Any,
                     passed: dict[str, Any], backend_kwargs: dict[str, Any]) -> dict[str, Any]:
    """effective_config.json's content: each field of `args` (the built trainer's) with its `value`, `recipe`,
    `trl_default`, `other_backend` (where that would run another value), `differs_from` (which of those three it
    differs from) and `changed_by` (a backend set it, and why)."""
    # secrets as TrainingArguments.to_dict shows them (`<HUB_TOKEN>`), on every side (env/secret_fields.py)
    defaults, recipe, passed = trl_defaults(), masked(trl_training_args(cfg)), masked(passed)
    changes = backend_changes(backend_name, passed, backend_kwargs, recipe, defaults)
    ours = predicted_values(backend_name, passed, defaults)
    other_name = load_backend(backend_name).COUNTERPART  # the one each backend is compared with
    # what it would pass for the same recipe: these kwargs without this backend's own, plus its own as far as they
    # are known without its model (its `predicted_config_kwargs`)
    other_passed = {**{k: v for k, v in passed.items() if k not in backend_kwargs},
                    **load_backend(other_name).predicted_config_kwargs(cfg)}
    other = predicted_values(other_name, other_passed, defaults)
    fields: dict[str, Any] = {}
    for name, raw in sorted(args.to_dict().items()):
        value = masked(_plain(raw), name)  # a nested mapping's token, a URL's password (to_dict masks *_token only)
        entry: dict[str, Any] = {"value": value, "differs_from": []}
        for side, values in (("recipe", recipe), ("trl_default", defaults)):
            if name in values:
                entry[side] = _plain(values[name])
                if entry[side] != value:
                    entry["differs_from"].append(side)
        if name in other and _plain(other[name]) != _plain(ours.get(name)):
            entry["other_backend"] = masked(_plain(other[name]), name)
            entry["differs_from"].append("other_backend")
        if name in changes:
            change = changes[name]
            entry["changed_by"] = change.why if change.after == value else \
                f"{change.why}; predicted {change.after!r}, the trainer ran {value!r}"
        fields[name] = entry
    changed = [dataclasses.replace(changes[name], after=fields[name]["value"]).line()
               for name in sorted(changes) if name in fields]
    return {"backend": backend_name, "other_backend": other_name, "changed": changed, "fields": fields}


def write_effective_config(output_dir: Path, cfg: PipelineConfig, backend, trainer,
                           passed: dict[str, Any], backend_kwargs: dict[str, Any]) -> list[str]:
    """Write output_dir/effective_config.json from the built trainer's args; returns the changed-field lines."""
    from grpo_pipeline.pipeline.health.rollback import kl_reference  # lazy: imports transformers

    record = effective_record(backend.NAME, cfg, trainer.args, passed, backend_kwargs)
    record["kl_reference"] = kl_reference(trainer)  # what kl (beta > 0) is measured against
    agents = agent_names(cfg.grpo)
    if agents:  # TRL's trainer arguments by name, and the tools the trainer offers (environments' methods too)
        record["agents"] = {**agents, "tools_offered": sorted({t.__name__ for t in getattr(trainer, "tools", [])})}
    atomic_write_json(Path(output_dir) / EFFECTIVE_CONFIG_NAME, record)
    return record["changed"]


def predicted_changes(backend_name: str, cfg: PipelineConfig, decided: dict[str, Any]) -> list[str]:
    """`grpo train --check`: the lines `grpo train` will print, from the recipe and the run's kwargs decided before
    any load (`decided`, build.py check_effective_config)."""
    backend = load_backend(backend_name)
    backend_kwargs, recipe_args = backend.predicted_config_kwargs(cfg), trl_training_args(cfg)
    passed = {**recipe_args, **decided, **backend_kwargs}
    changes = backend_changes(backend_name, passed, backend_kwargs, recipe_args, trl_defaults())
    return [changes[name].line() for name in sorted(changes)]
