"""Local data files and folders: which names are local, a folder's splits, and reading the files with the
`datasets` loaders, an unreadable file refused first with one DataFileError naming the file and line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Optional

import pyarrow.parquet as pq

from grpo_pipeline.env.path_check import local_data, relative_base
from grpo_pipeline.env.paths import shell_command
from grpo_pipeline.env.text import excerpt, shorten
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.data.cache import local_file_identity
from grpo_pipeline.pipeline.data.source_spec import (
    LOCAL_FORMATS,
    PROMPT_COLUMN,
    SAVED_DATASET_FILES,
    SAVED_DICT_INDEX,
    SINGLE_FILE_SPLIT,
    DataFileError,
    SourceSpec,
)


def is_saved_copy(folder: Path) -> bool:
    return (folder / SAVED_DICT_INDEX).is_file()  # DatasetDict.save_to_disk's index of the splits


def local_path(name: str) -> Optional[Path]:
    """The path `name` means when it is local (as grpo_pipeline.env.path_check.local_data reads it, `~` and `$VARS`
    expanded); None for a hub id.

    >>> [local_path(n) is not None for n in ("openai/gsm8k", "gsm8k", "./data", "/x/y", "a/b/c", "my.jsonl")]
    [False, False, True, True, True, True]
    """
    return Path(os.path.expanduser(os.path.expandvars(name))) if local_data(name) else None


def local_layout(path: Path, option: str) -> tuple[str, dict[str, list[Path]]]:
    """(kind, {split: files}): a `file`, a `saved` (save_to_disk) folder, or a `folder` split as `datasets` does."""
    if not path.exists():
        raise ConfigError(option, f"{excerpt(str(path.resolve()))} does not exist. Give the path of a data file "
                          f"({'/'.join(sorted(LOCAL_FORMATS))}), a folder of them, a `save_to_disk` folder, a hub "
                          f"dataset id (openai/gsm8k), `sample` or `demo-arithmetic`.{relative_base(path)}")
    if path.is_file():
        if path.suffix.lower() not in LOCAL_FORMATS:
            raise ConfigError(option, f"{path} has an unknown extension; use one of "
                              f"{', '.join(sorted(LOCAL_FORMATS))}, or a folder of such files.")
        return "file", {SINGLE_FILE_SPLIT: [path]}
    if is_saved_copy(path):
        index = json.loads((path / SAVED_DICT_INDEX).read_text(encoding="utf-8"))
        return "saved", {str(split): [] for split in index.get("splits", [])}
    if all((path / name).is_file() for name in SAVED_DATASET_FILES):
        return "saved", {SINGLE_FILE_SPLIT: []}
    from datasets.data_files import DataFilesDict, get_data_patterns  # lazy: datasets imports torch

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
    from datasets import load_dataset  # lazy: datasets imports torch

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
        # Every cell as written: pandas would turn "NA" into a missing value and a column with a gap into floats.
        kwargs["converters"] = {name: str for col in [*spec.columns(), PROMPT_COLUMN]
                                for name in (col, "\ufeff" + col)}
        kwargs["keep_default_na"] = False
        kwargs["encoding"] = "utf-8-sig"  # a BOM must not end up in the first column's name
        if suffix == ".tsv":
            kwargs["sep"] = "\t"
    # `datasets` keys its cache of a local file on path and mtime only (`cp -p`, a restored backup would be served
    # stale): a cache folder per content identity.
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


def library_error(files: list[Path], builder: str, err: BaseException) -> DataFileError:
    """A `datasets` / pyarrow / pandas loading error as our message: the file, the line where the library knows
    it, and the library's own words (the innermost cause: DatasetGenerationError wraps pyarrow's or pandas')."""
    cause, seen = err, {id(err)}
    while (inner := cause.__cause__ or cause.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        cause = inner
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
    """Refuse a Parquet file pyarrow cannot open or without rows (`datasets` would say "BatchSize must be > 0")."""
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
    """The first text in a parsed JSON value holding a lone surrogate (the "\\ud800" escape is valid JSON but no
    UTF-8: pyarrow refuses the file without saying where), or None."""
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
    """Refuse, naming the line (`datasets` names neither it nor, for bad bytes, the file), a text file that is not
    UTF-8 or not JSON records; return the key of a .json file's wrapped records ({"data": [...]}) for `field`."""
    suffix = path.suffix.lower()
    untouched = " No row of the file was used: fix or delete that line and run again."
    lines: list[str] = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                lines.append(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
            except UnicodeDecodeError as err:
                iconv = shell_command("iconv", "-f", "GBK", "-t", "UTF-8", "-o", path.with_name("fixed" + path.suffix),
                                      path)
                raise DataFileError(
                    f"{path} line {number} is not UTF-8 text (byte {excerpt(raw[err.start:err.start + 1])} at column "
                    f"{err.start + 1}). Re-save the file as UTF-8, e.g. `{iconv}` (use the file's real encoding "
                    f"instead of GBK).{untouched}"
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
    """The decoded JSON string literals of one line of a .json file."""
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
