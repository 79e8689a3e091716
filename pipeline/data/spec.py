"""What the data path reads of the recipe, read once: `DataSpec`, built by `data_spec(cfg)`, the one place the data
path looks at the recipe. Its helpers (source_spec, resolve_source, prepare_split, run_data's steps) and the check's
data steps take it, not the recipe. Imports no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Optional

from env.path_check import PATH_OPTIONS
from pipeline.config import PipelineConfig, given, role_values
from pipeline.data.columns import removes_unused_columns


@dataclass(frozen=True)
class DataSpec:
    """The recipe's values the data path reads, under the options' own names, and four read from it once:
    `evaluates` (the run reads the held-out set), `remove_unused_columns` (as TRL will run it: the columns the
    rewards get), `key_values` (the options declaring the role data_key: part of the prepared data's cache key) and
    `paths` (the path options, env.path_check's table, checked before any data is read)."""

    # the sources: the training data and the eval set (pipeline/data/source_spec.py source_spec)
    dataset_name: Any
    dataset_config: Optional[str]
    dataset_revision: Optional[str]
    dataset_split: str
    question_field: str
    answer_field: str
    solution_field: Optional[str]
    eval_dataset_name: Optional[str]
    eval_dataset_config: Optional[str]
    eval_question_field: Optional[str]
    eval_answer_field: Optional[str]
    eval_split: str
    eval_limit: Optional[int]
    # the rows: cleaning, prompts, limits, cache (pipeline/data/prepare.py)
    keep_unscorable: bool
    system_prompt: Optional[str]
    max_prompt_length: Any
    max_completion_length: Any
    max_seq_length: int
    overlong_policy: str
    strict: bool
    max_samples: Optional[int]
    data_cache_dir: Any
    # the run around the data: the report's folder, the demo's seed, where models and datasets come from, the
    # tokenizer, the warm-up, the rewards the check calls on the prepared rows, a resume on other data
    output_dir: Any
    seed: int
    model_source: str
    model_name_or_path: str
    trust_remote_code: bool
    sft_warmup_steps: int
    reward_funcs: tuple[Any, ...]
    reward_timeout: Any
    max_steps: int
    resume: str
    resume_other_data: bool
    # read from the recipe once
    evaluates: bool
    remove_unused_columns: bool
    key_values: Mapping[str, Any]
    paths: Mapping[str, Any]

    def for_eval(self, limit: Optional[int] = None) -> "DataSpec":
        """The eval set's preparing: its first `limit` (else eval_limit) usable rows, never strict (a dropped eval
        row is reported, not refused); the cache key follows."""
        changes = {"max_samples": given(limit, self.eval_limit), "strict": False}
        key = {**self.key_values, **{name: value for name, value in changes.items() if name in self.key_values}}
        return dataclasses.replace(self, **changes, key_values=MappingProxyType(key))


# DataSpec's fields read from the recipe by a rule, not as an option's value (remove_unused_columns is also TRL's option).
READ_ONCE = ("evaluates", "remove_unused_columns", "key_values", "paths")


def data_spec(cfg: PipelineConfig) -> DataSpec:
    """The data path's values of `cfg`, read once.

    >>> spec = data_spec(PipelineConfig().replace(dataset_name="sample", eval_steps=5, max_samples=8))
    >>> spec.dataset_name, spec.evaluates, spec.key_values["max_samples"], spec.for_eval(3).key_values["max_samples"]
    ('sample', True, 8, 3)
    """
    flat = cfg.to_dict()
    read = {name: flat[name] for name in DataSpec.__dataclass_fields__ if name in flat and name not in READ_ONCE}
    return DataSpec(**{**read, "reward_funcs": tuple(flat["reward_funcs"])}, evaluates=cfg.eval.uses_eval_set(),
                    remove_unused_columns=removes_unused_columns(cfg.trl),
                    key_values=MappingProxyType(role_values(cfg, "data_key")),
                    paths=MappingProxyType({name: flat.get(name) for name in PATH_OPTIONS["train"]}))
