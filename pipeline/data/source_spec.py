"""What a data source is before any row is read: names, formats, errors, the raw rows a loader returns, and
`SourceSpec`, the options of one role (training data or eval set). pipeline/data/sources.py resolves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from grpo_pipeline.env.path_check import DATA_SUFFIXES

SAMPLE_NAME = "sample"
SAMPLE_PATH = Path(__file__).resolve().parents[1] / "assets" / "gsm8k_sample.jsonl"
# The `datasets` packaged loader of each local data file suffix (the path checks' DATA_SUFFIXES).
_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}
LOCAL_FORMATS = {suffix: _BUILDERS[suffix] for suffix in DATA_SUFFIXES}
SINGLE_FILE_SPLIT = "train"
# What `save_to_disk` writes: a DatasetDict's index of its splits, and a Dataset's own files.
SAVED_DICT_INDEX = "dataset_dict.json"
SAVED_DATASET_FILES = ("state.json", "dataset_info.json")


class DataFileError(ValueError):
    """A local data source that cannot be read; the message names the file and line. Bad input (exit 2)."""


class DataSourceError(DataFileError, RuntimeError):
    """A hub dataset that cannot be loaded (no network, no saved copy): bad input too, with the fix."""


# TRL's prompt column (trl.GRPOTrainer trains on it; every other column goes to the rewards).
PROMPT_COLUMN = "prompt"
# The pipeline's own per-row columns begin with this (columns.py OWN_COLUMNS); a user's column never may.
OWN_PREFIX = "grpo_"


@dataclass
class RawRows:
    """Raw column values, one entry per source row. `prompt_format`: "question" (question_field) or "prompt" (TRL's
    column). `table`: every column as loaded (a Dataset or a dict of lists), for the rewards."""

    questions: list[Any]
    answers: list[Any]
    ids: list[str]
    solutions: Optional[list[Any]] = None  # the solution_field column, when one is named
    prompt_format: str = "question"
    table: Any = None


@dataclass
class DataSource:
    """A resolved `dataset_name`: what it is, its cache identity, and how to read its rows."""

    kind: str  # hub | file | folder | saved | sample | demo
    description: dict[str, Any]  # goes into data_report.json as "source"
    identity: dict[str, Any]  # goes into the cache fingerprint
    load: Callable[[], RawRows]


@dataclass(frozen=True)
class SourceSpec:
    """The options naming one data source (train | eval), each with its option's name for the messages."""

    role: str  # train | eval
    name: str
    name_option: str
    split: str
    split_option: str
    question_field: str
    question_option: str
    answer_field: str
    answer_option: str
    solution_field: Optional[str]
    config: Optional[str]
    config_option: str
    revision: Optional[str]
    own_eval_source: bool = False  # role eval with eval_dataset_name set: a single file is the eval set

    def columns(self) -> list[str]:
        return [c for c in (self.question_field, self.answer_field, self.solution_field) if c]


def source_spec(cfg: Any, role: str = "train", split: Optional[str] = None) -> SourceSpec:
    """`cfg`'s training source, or its eval source (each eval_* option, else the training one); `split` overrides.

    >>> from grpo_pipeline.pipeline.config import PipelineConfig
    >>> spec = source_spec(PipelineConfig().replace(eval_dataset_name="t.csv", eval_answer_field="y"), "eval")
    >>> spec.name, spec.split_option, spec.answer_field, spec.answer_option, spec.question_option
    ('t.csv', 'eval_split', 'y', 'eval_answer_field', 'eval_question_field')
    >>> source_spec(PipelineConfig(), "eval").question_option  # no eval set of its own: dataset_name's
    'question_field'
    """
    d, e = cfg.data, cfg.eval
    if role == "train":
        return SourceSpec("train", str(d.dataset_name).strip(), "dataset_name", split or d.dataset_split,
                          "dataset_split", d.question_field, "question_field", d.answer_field, "answer_field",
                          d.solution_field, d.dataset_config or None, "dataset_config", d.dataset_revision)
    own = bool(e.eval_dataset_name)

    def pick(own_value: Optional[str], own_option: str, train_value: Any, train_option: str) -> tuple[Any, str]:
        # An eval set of its own is fixed through the eval_* options, even where it borrows a training value.
        return (own_value or train_value, own_option) if own_value or own else (train_value, train_option)

    name, name_option = pick(e.eval_dataset_name, "eval_dataset_name", d.dataset_name, "dataset_name")
    question, question_option = pick(e.eval_question_field, "eval_question_field", d.question_field, "question_field")
    answer, answer_option = pick(e.eval_answer_field, "eval_answer_field", d.answer_field, "answer_field")
    config, config_option = pick(e.eval_dataset_config, "eval_dataset_config", d.dataset_config, "dataset_config")
    return SourceSpec("eval", str(name).strip(), name_option, split or e.eval_split, "eval_split", question,
                      question_option, answer, answer_option, None, config or None, config_option,
                      None if own else d.dataset_revision, own_eval_source=own)
