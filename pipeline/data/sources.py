"""Where raw question/answer rows come from: the hub (GSM8K), a local file, the bundled sample, the demo.

Each source has an identity (for the cache fingerprint, computed without loading any rows)
and a loader that returns the raw columns. Rows get ids `<split>-<0-based row index in the
source>`, which data_report.json uses to point at rejected rows.

The hub loader keeps its own saved copy (`save_to_disk`) under the data cache and reads it
first, so the second run needs no network. Downloads go through `datasets`, which honours
HF_ENDPOINT (e.g. https://hf-mirror.com on AutoDL) and HF_HOME; we never override them.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from env.paths import publish_once
from pipeline.config import ConfigError
from pipeline.data.cache import file_sha256, local_file_identity
from pipeline.data.clean import clean_column_name
from pipeline.demo.registry import BuiltinSource, builtin_source

SAMPLE_NAME = "sample"
SAMPLE_PATH = Path(__file__).resolve().parents[1] / "assets" / "gsm8k_sample.jsonl"
# File extension -> `datasets` packaged loader.
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}
SINGLE_FILE_SPLIT = "train"


class DataFileError(ValueError):
    """A local data file that cannot be read (empty, not UTF-8, broken JSON); the message names the file and
    line. `grpo data` and `grpo train` both report it as bad input (exit 2)."""


@dataclass
class RawRows:
    """Raw column values, one entry per source row, before any cleaning."""

    questions: list[Any]
    answers: list[Any]
    ids: list[str]


@dataclass
class DataSource:
    """A resolved `dataset_name`: what it is, its cache identity, and how to read its rows."""

    kind: str  # hub | file | sample | demo
    description: dict[str, Any]  # goes into data_report.json as "source"
    identity: dict[str, Any]  # goes into the cache fingerprint
    load: Callable[[], RawRows]


def hub_saved_copy_dir(cache_root: Path, name: str, config: Optional[str], revision: Optional[str]) -> Path:
    """Where the hub dataset's `save_to_disk` copy lives (a DatasetDict with all splits).

    >>> hub_saved_copy_dir(Path("/c"), "openai/gsm8k", "main", None).as_posix()
    '/c/hub/openai__gsm8k__main__default'
    """
    slug = "__".join([name.replace("/", "__"), config or "default", revision or "default"])
    return cache_root / "hub" / slug


def hub_endpoint() -> str:
    """The hub address `datasets` will use: $HF_ENDPOINT when set (mirrors), else huggingface.co."""
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except ImportError:  # pragma: no cover - huggingface_hub ships with datasets
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _columns_of(dataset: Any, question_field: str, answer_field: str, where: str) -> tuple[list, list]:
    """The question and answer columns, matching names after BOM/blank stripping."""
    by_clean_name = {clean_column_name(name): name for name in dataset.column_names}
    for field_name, wanted in (("question_field", question_field), ("answer_field", answer_field)):
        if wanted not in by_clean_name:
            raise ConfigError(
                field_name,
                f"column {wanted!r} is not in {where}; its columns are {sorted(by_clean_name)}. Set "
                f"{field_name} to the column that holds the {field_name.split('_')[0]}s.",
            )
    return dataset[by_clean_name[question_field]], dataset[by_clean_name[answer_field]]


def _rows(dataset: Any, question_field: str, answer_field: str, split: str, where: str) -> RawRows:
    questions, answers = _columns_of(dataset, question_field, answer_field, where)
    ids = [f"{split}-{i}" for i in range(len(questions))]
    return RawRows(questions=list(questions), answers=list(answers), ids=ids)


def load_hub_dataset(name: str, config: Optional[str], split: str, revision: Optional[str], cache_root: Path) -> Any:
    """One split of a hub dataset: from our saved copy when there is one, else downloaded and saved."""
    from datasets import load_from_disk

    saved = hub_saved_copy_dir(cache_root, name, config, revision)
    if not _is_saved_copy(saved):
        _download_and_save(name, config, revision, saved)
    splits = load_from_disk(str(saved))
    if split not in splits:
        raise ConfigError("dataset_split", f"{name} ({config}) has splits {sorted(splits)}; got {split!r}.")
    return splits[split]


def _is_saved_copy(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file()  # DatasetDict.save_to_disk's index of the splits


def _download_and_save(name: str, config: Optional[str], revision: Optional[str], saved: Path) -> None:
    from datasets import load_dataset

    endpoint = hub_endpoint()
    hf_home = os.environ.get("HF_HOME", "~/.cache/huggingface (default)")
    print(f"[grpo data] downloading {name} ({config}) from {endpoint} (HF_ENDPOINT); HF cache: {hf_home}",
          file=sys.stderr)
    try:
        splits = load_dataset(name, config, revision=revision)
    except Exception as err:
        raise ConfigError(
            "dataset_name",
            f"could not load dataset {name!r} (config {config!r}) from {endpoint}: {type(err).__name__}: {err}\n"
            f"No saved copy at {saved}. Fixes: check the network; in mainland China set "
            "HF_ENDPOINT=https://hf-mirror.com; offline, copy a `save_to_disk` folder of the dataset to that path."
        ) from err
    publish_once(saved, lambda staging: splits.save_to_disk(str(staging)), is_complete=_is_saved_copy)
    print(f"[grpo data] saved a copy at {saved}; later runs read it offline", file=sys.stderr)


def load_local_file(path: Path, question_field: str, answer_field: str, cache_root: Path) -> Any:
    """A JSONL/JSON/CSV/TSV/Parquet file through the `datasets` packaged loaders."""
    from datasets import load_dataset

    builder = LOCAL_FORMATS[path.suffix.lower()]
    if path.stat().st_size == 0:
        raise DataFileError(f"{path} is empty: there are no rows to train on. Give a file with one "
                            "`{\"question\": ..., \"answer\": ...}` record per line (JSONL) or a CSV with a header.")
    if builder != "parquet":
        check_text_file(path)
    kwargs: dict[str, Any] = {}
    if builder == "csv":
        # Keep every question/answer cell as the text written in the file: by default pandas
        # turns "NA" into a missing value and a numeric column with one gap into floats (42.0).
        text_columns = [question_field, answer_field]
        kwargs["converters"] = {name: str for col in text_columns for name in (col, "\ufeff" + col)}
        kwargs["keep_default_na"] = False
        kwargs["encoding"] = "utf-8-sig"  # a BOM must not end up in the first column's name
        if path.suffix.lower() == ".tsv":
            kwargs["sep"] = "\t"
    try:
        return load_dataset(builder, data_files=str(path), split="train", cache_dir=str(cache_root / "hf-datasets"),
                            **kwargs)
    except Exception as err:
        raise DataFileError(
            f"could not read {path} as {builder.upper()} ({type(err).__name__}: {err}). Check that the file is "
            "UTF-8, one record per line for JSONL, and that each column holds one kind of value."
        ) from err


def check_text_file(path: Path) -> None:
    """Name the first line that is not UTF-8 (or, in a .jsonl file, not one JSON object).

    Hand-written because `datasets`' loaders report neither the line nor, for bad bytes, which
    file; one pass over the lines costs far less than the tokenizing that follows.
    """
    from env.paths import shell_command

    jsonl = path.suffix.lower() == ".jsonl"
    untouched = " No row of the file was used: fix or delete that line and run again."
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise DataFileError(
                    f"{path} line {number} is not UTF-8 text (byte {raw[err.start:err.start + 1]!r} at column "
                    f"{err.start + 1}). Re-save the file as UTF-8, e.g. "
                    f"`{shell_command('iconv', '-f', 'GBK', '-t', 'UTF-8', '-o', path.with_name('fixed' + path.suffix), path)}`"
                    f" (use the file's real encoding instead of GBK).{untouched}"
                ) from None
            if jsonl and text.strip():
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


def resolve_source(cfg: Any, split: str, cache_root: Path) -> DataSource:
    """Turn `dataset_name` (+ config/split/fields) into a DataSource; reads no rows yet."""
    d = cfg.data
    name = str(d.dataset_name).strip()
    question_field, answer_field = d.question_field, d.answer_field

    if name == SAMPLE_NAME:
        _require_single_split(split, f"the bundled sample ({SAMPLE_PATH.name})")
        return DataSource(
            kind="sample",
            description={"kind": "sample", "path": str(SAMPLE_PATH), "split": split},
            identity={"kind": "sample", "sha256": file_sha256(SAMPLE_PATH), "split": split},
            # The sample's fields are always question/answer, whatever the config names.
            load=lambda: _rows(load_local_file(SAMPLE_PATH, "question", "answer", cache_root), "question", "answer",
                               split, SAMPLE_PATH.name),
        )

    builtin = builtin_source(name)
    if builtin is not None:
        # The whole split, or max_samples of it: max_samples is an upper bound, as for every source.
        try:
            size = builtin.split_size(split)
        except ValueError as err:
            raise ConfigError("dataset_split", f"{builtin.name}: {err}") from err
        n = min(d.max_samples, size) if d.max_samples else size
        seed = cfg.grpo.seed
        return DataSource(
            kind="demo",
            description={"kind": "demo", "name": builtin.name, "split": split, "n": n, "seed": seed},
            identity={"kind": "demo", "split": split, "n": n, "seed": seed,
                      "code_sha256": file_sha256(builtin.code_file) if builtin.code_file.is_file() else None},
            load=lambda: _builtin_rows(builtin, n, seed, split),
        )

    path = Path(name).expanduser()
    if path.suffix.lower() in LOCAL_FORMATS or path.is_file():
        if not path.is_file():
            raise ConfigError("dataset_name", f"file {str(path.resolve())!r} does not exist. Give the path of a "
                              ".jsonl/.csv/.parquet file, a hub dataset id (openai/gsm8k), `sample` or "
                              "`demo-arithmetic`.")
        if path.suffix.lower() not in LOCAL_FORMATS:
            raise ConfigError("dataset_name", f"{path} has an unknown extension; use one of "
                              f"{', '.join(sorted(LOCAL_FORMATS))}.")
        _require_single_split(split, str(path))
        path = path.resolve()
        return DataSource(
            kind="file",
            description={"kind": "file", "path": str(path), "split": split},
            identity={"kind": "file", **local_file_identity(path), "split": split,
                      "fields": [question_field, answer_field]},
            load=lambda: _rows(load_local_file(path, question_field, answer_field, cache_root), question_field,
                               answer_field, split, str(path)),
        )

    config = d.dataset_config or None
    revision = d.dataset_revision
    return DataSource(
        kind="hub",
        description={"kind": "hub", "name": name, "config": config, "split": split, "revision": revision,
                     "saved_copy": str(hub_saved_copy_dir(cache_root, name, config, revision)),
                     "endpoint": hub_endpoint()},
        identity={"kind": "hub", "name": name, "config": config, "split": split, "revision": revision},
        load=lambda: _rows(load_hub_dataset(name, config, split, revision, cache_root), question_field, answer_field,
                           split, f"{name} ({config}, {split})"),
    )


def _require_single_split(split: str, what: str) -> None:
    # A single file has one split. Serving it for "test" too would evaluate on training data.
    if split != SINGLE_FILE_SPLIT:
        raise ConfigError(
            "dataset_split",
            f"{what} is a single file, which is one split named {SINGLE_FILE_SPLIT!r}; got split {split!r}. "
            "Use a separate file (as dataset_name) for held-out evaluation.",
        )


def _builtin_rows(builtin: BuiltinSource, n: int, seed: int, split: str) -> RawRows:
    problems = builtin.rows(n, seed, split)
    return RawRows(
        questions=[p.get("question") for p in problems],
        answers=[p.get("answer") for p in problems],
        ids=[f"{split}-{i}" for i in range(len(problems))],
    )
