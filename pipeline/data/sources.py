"""Where raw question/answer rows come from: a local file or folder, the hub, the bundled sample, the demo.

    dataset_name / eval_dataset_name      what it is (docs/own-data.md)
    my.jsonl | my.json | my.csv | my.tsv | my.parquet      a single file: one split, `train`
    my_folder/  (train.jsonl, test.csv, ...)              data files: splits from the file names, as
                                                          `datasets` resolves them (train/test/validation)
    my_folder/  (written by save_to_disk)                 a Dataset (one split, `train`) or a DatasetDict
    openai/gsm8k                                          a hub dataset (dataset_config, dataset_revision)
    sample | demo-arithmetic                              built in, offline

A name that exists on disk, or looks like a path (starts with `/`, `.` or `~`, has a data file's extension,
or more than one `/`), is local and never goes to the hub; `dataset_config` is a hub setting and local
sources ignore it. Each source has an identity for the cache fingerprint, computed without loading any rows
(a local source's: every file's path, size, mtime and content hash, so an edit is never served stale), and a
loader that returns the raw columns. Rows get ids `<split>-<0-based row index in the split>` (files of one
split counted in name order), which data_report.json uses to point at rejected rows.

The same code reads the training data (`SourceSpec` role "train": dataset_name, dataset_split, question_field,
...) and the eval set (role "eval": eval_dataset_name or else dataset_name, eval_split, eval_question_field or
else question_field, ...); every error names the option the user set.

The hub loader keeps its own saved copy (`save_to_disk`) under the data cache and reads it
first, so the second run needs no network. Downloads go through `datasets`, which honours
HF_ENDPOINT (e.g. https://hf-mirror.com on AutoDL) and HF_HOME; we never override them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from env.path_check import DATA_SUFFIXES, local_data
from env.paths import publish_once
from env.text import excerpt, shorten
from pipeline.config import ConfigError
from pipeline.data.cache import file_sha256, local_file_identity, local_tree_identity
from pipeline.data.clean import clean_column_name
from pipeline.demo.registry import BuiltinSource, builtin_source

SAMPLE_NAME = "sample"
SAMPLE_PATH = Path(__file__).resolve().parents[1] / "assets" / "gsm8k_sample.jsonl"
# File extension -> `datasets` packaged loader.
# The `datasets` builder of each local data file suffix; the suffixes are env.path_check.DATA_SUFFIXES (the path
# checks' reading of "a local data file"), so both readings stay one.
_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}
LOCAL_FORMATS = {suffix: _BUILDERS[suffix] for suffix in DATA_SUFFIXES}
SINGLE_FILE_SPLIT = "train"
# What `save_to_disk` writes: a DatasetDict's index of its splits, and a Dataset's own files.
SAVED_DICT_INDEX = "dataset_dict.json"
SAVED_DATASET_FILES = ("state.json", "dataset_info.json")


class DataFileError(ValueError):
    """A local data source that cannot be read (empty, not UTF-8, broken JSON, no data files); the message names
    the file and line. `grpo data` and `grpo train` both report it as bad input (exit 2)."""


class DataSourceError(DataFileError, RuntimeError):
    """A hub dataset that cannot be loaded (no network, no saved copy): bad input too, with the fix."""


# TRL's prompt column (trl.GRPOTrainer trains on it; every other column goes to the rewards).
PROMPT_COLUMN = "prompt"
# The pipeline's own per-row columns begin with this (pipeline/data/prepare.py OWN_COLUMNS); a user's column
# never may, so that ours can never hide one of theirs from a reward.
OWN_PREFIX = "grpo_"


@dataclass
class RawRows:
    """Raw column values, one entry per source row, before any cleaning.

    `prompt_format` says what `questions` holds: "question", the question_field column (made into chat prompts
    later); "prompt", TRL's prompt column (strings or message lists, used as written). `answers` is None per row
    when a "prompt" source has no answer column. `table` holds every column as loaded (a datasets.Dataset, or a
    dict of lists), so that each reaches the rewards with its own values and types.
    """

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
    """Which options name one data source, for training (role "train") or evaluation (role "eval").

    Each value comes with the option it was read from, so an error names the option the user set.
    """

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
    """The training source (dataset_name, dataset_split, ...) or the eval source (eval_dataset_name else
    dataset_name, eval_split, eval_question_field else question_field, ...). `split` overrides the split.

    >>> from pipeline.config import PipelineConfig
    >>> spec = source_spec(PipelineConfig().replace(eval_dataset_name="t.csv", eval_answer_field="y"), "eval")
    >>> spec.name, spec.split_option, spec.answer_field, spec.answer_option, spec.question_option
    ('t.csv', 'eval_split', 'y', 'eval_answer_field', 'eval_question_field')
    >>> source_spec(PipelineConfig(), "eval").question_option  # no eval set of its own: dataset_name's fields
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


def hub_saved_copy_dir(cache_root: Path, name: str, config: Optional[str], revision: Optional[str],
                       source: str = "hf") -> Path:
    """Where the hub dataset's `save_to_disk` copy lives (a DatasetDict with all splits), per `model_source`.

    >>> hub_saved_copy_dir(Path("/c"), "openai/gsm8k", "main", None).as_posix()
    '/c/hub/openai__gsm8k__main__default'
    >>> hub_saved_copy_dir(Path("/c"), "AI-ModelScope/gsm8k", "main", None, "modelscope").as_posix()
    '/c/modelscope/AI-ModelScope__gsm8k__main__default'
    """
    slug = "__".join([name.replace("/", "__"), config or "default", revision or "default"])
    return cache_root / ("modelscope" if source == "modelscope" else "hub") / slug


def hub_endpoint() -> str:
    """The hub address `datasets` will use: $HF_ENDPOINT when set (mirrors), else huggingface.co."""
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except ImportError:  # pragma: no cover - huggingface_hub ships with datasets
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _option_default(option: str) -> Any:
    """The default of a DataArguments field (question_field, answer_field): tells "set" from "left alone"."""
    from pipeline.config.fields import DataArguments

    return {f.name: f.default for f in dataclasses.fields(DataArguments)}[option]


def prompt_format_of(columns: list[str], spec: SourceSpec) -> str:
    """"prompt" when the rows are TRL's (a `prompt` column, question_field left at its default or naming it),
    "question" for question/answer rows; a ConfigError when the data has both and question_field was set.

    >>> from pipeline.config import PipelineConfig
    >>> spec = source_spec(PipelineConfig())
    >>> prompt_format_of(["prompt", "solution"], spec), prompt_format_of(["question", "answer"], spec)
    ('prompt', 'question')
    """
    field = spec.question_field
    if field == PROMPT_COLUMN or (PROMPT_COLUMN in columns and field == _option_default("question_field")):
        return "prompt"
    if PROMPT_COLUMN in columns and field in columns:
        raise ConfigError(spec.question_option, f"the data has TRL's `prompt` column and {spec.question_option} "
                          f"names {excerpt(field)}: prompts built from {excerpt(field)} would hide yours. Leave "
                          f"{spec.question_option} unset to train on `prompt` as TRL does, or rename the `prompt` "
                          "column.")
    return "question"


def _rows(dataset: Any, spec: SourceSpec, split: str, where: str) -> RawRows:
    """The prompt (question_field, or TRL's `prompt`), answer and solution columns, matching names after
    BOM/blank stripping, with every column kept in `table` for the rewards."""
    renames = {name: clean_column_name(name) for name in dataset.column_names if clean_column_name(name) != name}
    if renames and hasattr(dataset, "rename_columns"):
        dataset = dataset.rename_columns(renames)
    elif renames:
        dataset = {renames.get(name, name): values for name, values in dataset.items()}
    names = list(dataset.column_names) if hasattr(dataset, "column_names") else list(dataset)
    own = [name for name in names if name.startswith(OWN_PREFIX)]
    if own:
        raise ConfigError(spec.name_option, f"{where} has column(s) {', '.join(map(repr, own))}; names beginning "
                          f"with {excerpt(OWN_PREFIX)} are the pipeline's own per-row fields (grpo_answer, grpo_id, "
                          "...). "
                          "Rename them.")
    prompt_format = prompt_format_of(names, spec)
    question = PROMPT_COLUMN if prompt_format == "prompt" else spec.question_field
    answer_optional = prompt_format == "prompt" and spec.answer_field == _option_default("answer_field")
    wanted = [("question", question, spec.question_option)]
    if not (answer_optional and spec.answer_field not in names):
        wanted.append(("answer", spec.answer_field, spec.answer_option))
    if spec.solution_field:
        wanted.append(("worked solution", spec.solution_field, "solution_field"))
    for what, column, option in wanted:
        if column not in names:
            hint = (" A dataset in TRL's format has a `prompt` column instead (text, or a list of "
                    "{role, content} messages)." if what == "question" else "")
            raise ConfigError(option, f"column {excerpt(column)} is not in {where}; its columns are "
                              f"{sorted(names)}. Set {option} to the column that holds the {what}s.{hint}")
    questions = list(dataset[question])
    answers = list(dataset[spec.answer_field]) if spec.answer_field in names else [None] * len(questions)
    return RawRows(questions=questions, answers=answers, ids=[f"{split}-{i}" for i in range(len(questions))],
                   solutions=list(dataset[spec.solution_field]) if spec.solution_field else None,
                   prompt_format=prompt_format, table=dataset)


def pick_split(spec: SourceSpec, available: list[str], where: str) -> str:
    """The split of `where` that `spec` asks for, or a ConfigError naming the option to change.

    A single file (one split, `train`) never stands in for a missing test split: that would evaluate on the
    training data. Only an eval source of its own (eval_dataset_name) is used whole, whatever eval_split says.
    """
    if spec.split in available:
        return spec.split
    if spec.own_eval_source and len(available) == 1:
        return available[0]
    listed = ", ".join(excerpt(s) for s in available)
    if spec.role == "eval" and not spec.own_eval_source:
        if len(available) == 1:
            raise ConfigError(
                "eval_dataset_name",
                f"evaluation (eval_before / eval_after / `grpo eval --config`) reads split {excerpt(spec.split)} "
                f"(eval_split) of dataset_name, but {where} has one split, {listed}: the training data. Set "
                "eval_dataset_name to a file or folder of held-out problems (e.g. --eval_dataset_name test.jsonl), "
                "make dataset_name a folder holding train.jsonl and test.jsonl, or turn evaluation off "
                "(--eval_before false --eval_after false).")
        raise ConfigError("eval_split", f"{where} has splits {listed}; eval_split is {excerpt(spec.split)}. Set "
                          "eval_split to the held-out one, or eval_dataset_name to a source of held-out problems.")
    one = " (a single file or saved Dataset is one split, 'train')" if available == [SINGLE_FILE_SPLIT] else ""
    plural = "splits" if len(available) > 1 else "one split,"
    raise ConfigError(spec.split_option, f"{where} has {plural} {listed}{one}; {spec.split_option} is "
                      f"{excerpt(spec.split)}. Set {spec.split_option} to one of them.")


# ------------------------------------------------------------------------------------------------ hub


def load_hub_splits(spec: SourceSpec, cache_root: Path, source: str = "hf") -> Any:
    """All splits of a hub dataset (a DatasetDict): from our saved copy when there is one, else downloaded
    (from ModelScope when `model_source: modelscope`)."""
    from datasets import load_from_disk

    saved = hub_saved_copy_dir(cache_root, spec.name, spec.config, spec.revision, source)
    if not _is_saved_copy(saved):
        if source == "modelscope":
            _download_from_modelscope_and_save(spec.name, spec.config, spec.revision, saved)
        else:
            _download_and_save(spec, saved)
    return load_from_disk(str(saved))


def _is_saved_copy(folder: Path) -> bool:
    return (folder / SAVED_DICT_INDEX).is_file()  # DatasetDict.save_to_disk's index of the splits


def _download_and_save(spec: SourceSpec, saved: Path) -> None:
    from datasets import load_dataset

    name, config = spec.name, spec.config
    endpoint = hub_endpoint()
    hf_home = os.environ.get("HF_HOME", "~/.cache/huggingface (default)")
    print(f"[grpo data] downloading {name} ({config}) from {endpoint} (HF_ENDPOINT); HF cache: {hf_home}",
          file=sys.stderr)
    try:
        splits = load_dataset(name, config, revision=spec.revision)
    except Exception as err:
        if "BuilderConfig" in str(err) or "config name" in str(err).lower():
            raise ConfigError(spec.config_option, f"hub dataset {excerpt(name)} ({spec.name_option}) has no config "
                              f"{excerpt(config)}: {err}. Set {spec.config_option} to one of its configs, or to null "
                              "for a dataset with one.") from None
        raise ConfigError(
            spec.name_option,
            f"could not load dataset {excerpt(name)} (config {excerpt(config)}) from {endpoint}: "
            f"{type(err).__name__}: {err}\nNo saved copy at {saved}, and no local file or folder {excerpt(name)} "
            "either. "
            "Fixes: check the network; in mainland China set HF_ENDPOINT=https://hf-mirror.com; offline, copy a "
            f"`save_to_disk` folder of the dataset to that path, or give {spec.name_option} a local path."
        ) from err
    publish_once(saved, lambda staging: splits.save_to_disk(str(staging)), is_complete=_is_saved_copy,
                 option="data_cache_dir")
    print(f"[grpo data] saved a copy at {saved}; later runs read it offline", file=sys.stderr)


def _download_from_modelscope_and_save(name: str, config: Optional[str], revision: Optional[str], saved: Path) -> None:
    """`model_source: modelscope`: the dataset repository's files from ModelScope (env.hubs, the network
    boundary), read by `datasets` as a local folder (its data files and README configs), saved like a hub copy."""
    from datasets import load_dataset

    from env.hubs import download_dataset, endpoint

    print(f"[grpo data] downloading {name} ({config}) from ModelScope ({endpoint('modelscope')}); "
          f"cache: {os.environ.get('MODELSCOPE_CACHE', '~/.cache/modelscope (default)')} (MODELSCOPE_CACHE)",
          file=sys.stderr)
    folder = download_dataset(name, revision)
    try:
        splits = load_dataset(str(folder), config)
    except Exception as err:
        raise DataSourceError(f"could not read ModelScope dataset {excerpt(name)} (config {excerpt(config)}) "
                              f"downloaded to {folder}: {type(err).__name__}: {err}\nCheck dataset_config (None for "
                              "a single one) and that the repository holds .jsonl/.csv/.parquet data files.") from err
    publish_once(saved, lambda staging: splits.save_to_disk(str(staging)), is_complete=_is_saved_copy,
                 option="data_cache_dir")
    print(f"[grpo data] saved a copy at {saved}; later runs read it offline", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ local


def local_path(name: str) -> Optional[Path]:
    """The path `name` means when it is local (env.path_check.local_data, the path checks' own reading), with
    `~` and `$VARS` expanded as the checks expanded them; None for a hub id.

    >>> [local_path(n) is not None for n in ("openai/gsm8k", "gsm8k", "./data", "/x/y", "a/b/c", "my.jsonl")]
    [False, False, True, True, True, True]
    """
    if not local_data(name):
        return None
    return Path(os.path.expanduser(os.path.expandvars(name)))


def local_layout(path: Path, option: str) -> tuple[str, dict[str, list[Path]]]:
    """(kind, {split: files}) of a local source: `file`, `saved` (save_to_disk; files empty) or `folder`.

    A folder's data files are assigned to splits by `datasets`' own file-name patterns (train/test/validation,
    dev, eval, ...); a folder whose names match none is one split, `train`.
    """
    if not path.exists():
        raise ConfigError(option, f"{excerpt(str(path.resolve()))} does not exist. Give the path of a data file "
                          f"({'/'.join(sorted(LOCAL_FORMATS))}), a folder of them, a `save_to_disk` folder, a hub "
                          "dataset id (openai/gsm8k), `sample` or `demo-arithmetic`.")
    if path.is_file():
        if path.suffix.lower() not in LOCAL_FORMATS:
            raise ConfigError(option, f"{path} has an unknown extension; use one of "
                              f"{', '.join(sorted(LOCAL_FORMATS))}, or a folder of such files.")
        return "file", {SINGLE_FILE_SPLIT: [path]}
    if _is_saved_copy(path):
        index = json.loads((path / SAVED_DICT_INDEX).read_text(encoding="utf-8"))
        return "saved", {str(split): [] for split in index.get("splits", [])}
    if all((path / name).is_file() for name in SAVED_DATASET_FILES):
        return "saved", {SINGLE_FILE_SPLIT: []}
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        patterns = get_data_patterns(str(path))
        resolved = DataFilesDict.from_patterns(patterns, base_path=str(path))
    except Exception:  # datasets raises EmptyDatasetError / FileNotFoundError for a folder with no files
        resolved = {}
    splits = {str(split): sorted(Path(f) for f in files if Path(f).suffix.lower() in LOCAL_FORMATS)
              for split, files in resolved.items()}
    splits = {split: files for split, files in splits.items() if files}
    if not splits:
        raise DataFileError(f"{path} ({option}) holds no data files ({', '.join(sorted(LOCAL_FORMATS))}) and is "
                            "not a `save_to_disk` folder. Put train.jsonl (and test.jsonl) in it, or give a file.")
    return "folder", splits


# What an empty file of each format needs, for its message.
EMPTY_FIX = {".jsonl": "Write one `{\"question\": ..., \"answer\": ...}` object per line.",
             ".json": "Write a list of `{\"question\": ..., \"answer\": ...}` objects.",
             ".csv": "Write a header line (question,answer), then one row per problem.",
             ".tsv": "Write a header line (question<TAB>answer), then one row per problem.",
             ".parquet": "Write it with pandas' to_parquet or pyarrow.parquet.write_table."}


def load_data_files(files: list[Path], spec: SourceSpec, cache_root: Path) -> Any:
    """One split's data files (one format) through the `datasets` packaged loaders, as one Dataset."""
    from datasets import load_dataset

    suffixes = {f.suffix.lower() for f in files}
    if len(suffixes) > 1:
        raise DataFileError(f"one split mixes file formats ({', '.join(str(f) for f in files)}); keep each "
                            "split's files in one format.")
    suffix = suffixes.pop()
    builder = LOCAL_FORMATS[suffix]
    kwargs: dict[str, Any] = {}
    for path in files:
        if path.stat().st_size == 0:
            raise DataFileError(f"{path} is empty (0 bytes): there are no rows to train on. {EMPTY_FIX[suffix]}")
        if builder == "parquet":
            check_parquet_file(path)
        else:
            json_field = check_text_file(path)
            if json_field:
                kwargs["field"] = json_field
    if builder == "csv":
        # Keep every question/answer cell as the text written in the file: by default pandas
        # turns "NA" into a missing value and a numeric column with one gap into floats (42.0).
        kwargs["converters"] = {name: str for col in [*spec.columns(), PROMPT_COLUMN]
                                for name in (col, "\ufeff" + col)}
        kwargs["keep_default_na"] = False
        kwargs["encoding"] = "utf-8-sig"  # a BOM must not end up in the first column's name
        if suffix == ".tsv":
            kwargs["sep"] = "\t"
    # `datasets` keys its own cache of a local file on path and mtime only: an edit that keeps both (a copy
    # with `cp -p`, a restored backup, a second edit within the clock's tick) would be served stale. A cache
    # folder per content identity closes that.
    content = hashlib.sha256(json.dumps([local_file_identity(f) for f in files], sort_keys=True).encode()).hexdigest()
    # `datasets` logs its own "Failed to read file ..." line before raising: the message below says it once.
    library_logger = logging.getLogger("datasets")
    level = library_logger.level
    library_logger.setLevel(logging.CRITICAL)
    try:
        return load_dataset(builder, data_files=[str(f) for f in files], split="train",
                            cache_dir=str(cache_root / "hf-datasets" / content[:16]), **kwargs)
    except Exception as err:  # noqa: BLE001 - translated below into our message, naming the file and the line
        raise library_error(files, builder, err) from err
    finally:
        library_logger.setLevel(level)


def _root_cause(err: BaseException) -> BaseException:
    """The library's own error under `datasets`' wrappers (DatasetGenerationError "An error occurred while
    generating the dataset" carries the pyarrow / pandas one as its cause)."""
    seen = {id(err)}
    while True:
        inner = err.__cause__ or err.__context__
        if inner is None or id(inner) in seen:
            return err
        seen.add(id(inner))
        err = inner


def library_error(files: list[Path], builder: str, err: BaseException) -> DataFileError:
    """A `datasets` / pyarrow / pandas error while loading local files, as our message: the file, the line
    where the library knows it, and the library's own words; no hint that the error does not call for (the
    checks before loading, check_text_file and check_parquet_file, already name the common faults with theirs)."""
    cause = _root_cause(err)
    text = " ".join(str(cause).split()) or type(cause).__name__
    where = str(files[0]) if len(files) == 1 else f"{files[0].parent} ({', '.join(f.name for f in files)})"
    found = re.search(r"\b(line|row) (\d+)", text)
    if found and len(files) == 1:
        # pandas says "line N" from 1 and "row N" from 0, the header included; pyarrow's JSON reader "row N"
        # from 0 over the records
        number = int(found.group(2)) + (found.group(1) == "row")
        where += f" line {number}" if builder == "csv" else f" record {number}"
    return DataFileError(f"{where}: cannot be read as {builder.upper()} ({type(cause).__name__}: "
                         f"{shorten(text, 300)}). No row of the file was used.")


def check_parquet_file(path: Path) -> None:
    """A Parquet file that pyarrow cannot open, or that has columns but no rows, named before `datasets` reads
    it (it would say "BatchSize must be greater than 0" or "corresponds to no data")."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.ParquetFile(path).metadata
    except Exception as err:  # noqa: BLE001 - pyarrow's ArrowInvalid / OSError: not a Parquet file
        raise DataFileError(f"{path} is not a readable Parquet file ({type(err).__name__}: "
                            f"{shorten(' '.join(str(err).split()), 300)}). Write it again with pandas' to_parquet "
                            "or pyarrow.parquet.write_table.") from None
    if metadata.num_rows == 0:
        columns = ", ".join(metadata.schema.names)
        raise DataFileError(f"{path} has columns ({shorten(columns, 200)}) but no rows: there is nothing to "
                            "train on. Write the problems into it, one row each.")


def _lone_surrogate(value: Any) -> Optional[str]:
    """The first text inside a parsed JSON value that holds a lone surrogate (JSON's "\\ud800" escape is valid
    JSON, but no UTF-8 text: pyarrow refuses the file without saying where), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value
        return None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((bad for bad in map(_lone_surrogate, items) if bad is not None), None)


def _surrogate_error(path: Path, where: str, text: str, untouched: str) -> DataFileError:
    return DataFileError(f"{path} {where} holds a lone surrogate, an escape such as \\ud800 that is half of a "
                         f"character, so no UTF-8 text ({excerpt(text, 80)}). Fix or remove that escape.{untouched}")


def check_text_file(path: Path) -> Optional[str]:
    """Name the first line that is not UTF-8 (or, in a .jsonl file, not one JSON object); return the key of a
    .json file's list of records when it is wrapped in an object ({"data": [...]}), for `datasets`' `field`.

    Hand-written because `datasets`' loaders report neither the line nor, for bad bytes, which
    file; one pass over the lines costs far less than the tokenizing that follows.
    """
    from env.paths import shell_command

    def iconv(path: Path) -> str:
        return shell_command("iconv", "-f", "GBK", "-t", "UTF-8", "-o", path.with_name("fixed" + path.suffix), path)

    suffix = path.suffix.lower()
    untouched = " No row of the file was used: fix or delete that line and run again."
    lines: list[str] = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                lines.append(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
            except UnicodeDecodeError as err:
                raise DataFileError(
                    f"{path} line {number} is not UTF-8 text (byte {excerpt(raw[err.start:err.start + 1])} at column "
                    f"{err.start + 1}). Re-save the file as UTF-8, e.g. "
                    f"`{iconv(path)}`"
                    f" (use the file's real encoding instead of GBK).{untouched}"
                ) from None
    filled = [number for number, text in enumerate(lines, start=1) if text.strip()]
    if not filled:
        raise DataFileError(f"{path} holds only blank lines: there are no rows to train on.")
    if suffix in (".csv", ".tsv") and len(filled) == 1:
        header = lines[filled[0] - 1].strip().lstrip("\ufeff")
        raise DataFileError(f"{path} has a header ({shorten(header, 200)}) but no rows: there is nothing to train "
                            "on. Add one row per problem under the header.")
    if suffix == ".json":
        try:
            document = json.loads("".join(lines))
        except json.JSONDecodeError as err:
            if err.msg != "Extra data":  # "Extra data": JSON Lines in a .json file, read per line below
                raise DataFileError(f"{path} line {err.lineno} is not valid JSON ({err.msg}, column {err.colno})."
                                    " A .json file holds a list of objects, or {\"data\": [...]}."
                                    + untouched) from None
        else:
            bad = _lone_surrogate(document)
            if bad is not None:
                line = next((n for n, text in enumerate(lines, start=1) if _lone_surrogate(_json_strings(text))),
                            None)
                raise _surrogate_error(path, f"line {line}" if line else "", bad, untouched)
            return _json_records_field(document, path)
    if suffix in (".jsonl", ".json"):
        for number, text in enumerate(lines, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as err:
                raise DataFileError(
                    f"{path} line {number} is not valid JSON ({err.msg}, column {err.colno}). A .jsonl "
                    f"file holds one complete JSON object per line.{untouched}"
                ) from None
            if not isinstance(record, dict):
                raise DataFileError(f"{path} line {number} is a JSON {type(record).__name__}, not an object "
                                    "such as {\"question\": ..., \"answer\": ...}." + untouched)
            bad = _lone_surrogate(record)
            if bad is not None:
                raise _surrogate_error(path, f"line {number}", bad, untouched)
    return None


def _json_strings(line: str) -> list[str]:
    """The JSON string literals of one line of a .json file, decoded (a line need not be JSON by itself)."""
    found = []
    for literal in re.findall(r'"(?:[^"\\]|\\.)*"', line):
        try:
            found.append(json.loads(literal))
        except json.JSONDecodeError:
            continue
    return found


def _json_records_field(document: Any, path: Path) -> Optional[str]:
    """None for a list of objects (or one object: one row); the key of the one list of objects in a wrapper."""
    if isinstance(document, list):
        bad = next((i for i, item in enumerate(document) if not isinstance(item, dict)), None)
        if bad is not None:
            raise DataFileError(f"{path}: item {bad} of the list is a JSON {type(document[bad]).__name__}, not an "
                                "object such as {\"question\": ..., \"answer\": ...}.")
        if not document:
            raise DataFileError(f"{path} is an empty JSON list: there are no rows to train on.")
        return None
    if isinstance(document, dict):
        lists = [key for key, value in document.items()
                 if isinstance(value, list) and value and all(isinstance(v, dict) for v in value)]
        if len(lists) == 1:
            return lists[0]
        if not any(isinstance(value, (list, dict)) for value in document.values()):
            return None  # one record
        raise DataFileError(f"{path} is a JSON object with {len(lists)} lists of records "
                            f"({', '.join(lists) or 'none'}); give a list of objects, or {{\"data\": [...]}}.")
    raise DataFileError(f"{path} is a JSON {type(document).__name__}; give a list of objects, or {{\"data\": [...]}}.")


def _load_local_split(path: Path, kind: str, files: list[Path], spec: SourceSpec, split: str, cache_root: Path,
                      where: str) -> RawRows:
    if kind == "saved":
        from datasets import DatasetDict, load_from_disk

        loaded = load_from_disk(str(path))
        dataset = loaded[split] if isinstance(loaded, DatasetDict) else loaded
    else:
        dataset = load_data_files(files, spec, cache_root)
    return _rows(dataset, spec, split, where)


# ------------------------------------------------------------------------------------------------ resolve


def resolve_source(cfg: Any, spec: SourceSpec, cache_root: Path) -> DataSource:
    """Turn a SourceSpec into a DataSource; reads no rows yet (a hub split is checked once it is loaded)."""
    name, split = spec.name, spec.split
    if name == SAMPLE_NAME:
        split = pick_split(spec, [SINGLE_FILE_SPLIT], f"the bundled sample ({SAMPLE_PATH.name})")
        sample_spec = dataclasses.replace(spec, question_field="question", answer_field="answer",
                                          solution_field=None)
        return DataSource(
            kind="sample",
            description={"kind": "sample", "path": str(SAMPLE_PATH), "split": split},
            identity={"kind": "sample", "sha256": file_sha256(SAMPLE_PATH), "split": split},
            # The sample's fields are always question/answer, whatever the config names.
            load=lambda: _rows(load_data_files([SAMPLE_PATH], sample_spec, cache_root), sample_spec, split,
                               SAMPLE_PATH.name),
        )

    builtin = builtin_source(name)
    if builtin is not None:
        # The whole split, or max_samples of it: max_samples is an upper bound, as for every source.
        try:
            size = builtin.split_size(split)
        except ValueError as err:
            raise ConfigError(spec.split_option, f"{builtin.name}: {err}") from err
        n = min(cfg.data.max_samples, size) if cfg.data.max_samples else size
        seed = cfg.grpo.seed
        return DataSource(
            kind="demo",
            description={"kind": "demo", "name": builtin.name, "split": split, "n": n, "seed": seed},
            identity={"kind": "demo", "split": split, "n": n, "seed": seed,
                      "code_sha256": file_sha256(builtin.code_file) if builtin.code_file.is_file() else None},
            load=lambda: _builtin_rows(builtin, n, seed, split),
        )

    path = local_path(name)
    if path is not None:
        kind, splits = local_layout(path, spec.name_option)
        path = path.resolve()
        where = f"{path} ({spec.name_option})"
        split = pick_split(spec, sorted(splits), where)
        files = splits[split]
        identity = local_file_identity(path) if kind == "file" else local_tree_identity(path)
        return DataSource(
            kind=kind,
            description={"kind": kind, "path": str(path), "split": split,
                         **({"files": [str(f) for f in files]} if kind == "folder" else {})},
            identity={"kind": kind, **identity, "split": split, "fields": spec.columns()},
            load=lambda: _load_local_split(path, kind, files, spec, split, cache_root, where),
        )

    source = cfg.model.model_source  # hf | modelscope: where the hub id is downloaded from
    from env.hubs import endpoint

    def load_hub() -> RawRows:
        splits = load_hub_splits(spec, cache_root, source)
        where = f"{name} ({spec.config}; {spec.name_option})"
        chosen = pick_split(spec, sorted(splits), where)
        return _rows(splits[chosen], spec, chosen, where)

    return DataSource(
        kind="hub",
        description={"kind": "hub", "name": name, "config": spec.config, "split": split, "revision": spec.revision,
                     "saved_copy": str(hub_saved_copy_dir(cache_root, name, spec.config, spec.revision, source)),
                     "source": source, "endpoint": hub_endpoint() if source == "hf" else endpoint(source)},
        identity={"kind": "hub", "name": name, "config": spec.config, "split": split, "revision": spec.revision,
                  "fields": spec.columns(), **({"source": source} if source != "hf" else {})},
        load=load_hub,
    )


def _builtin_rows(builtin: BuiltinSource, n: int, seed: int, split: str) -> RawRows:
    problems = builtin.rows(n, seed, split)
    questions, answers = [p.get("question") for p in problems], [p.get("answer") for p in problems]
    return RawRows(questions=questions, answers=answers, ids=[f"{split}-{i}" for i in range(len(problems))],
                   table={"question": questions, "answer": answers})
