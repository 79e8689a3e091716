"""Every local data format x every fault a file can have, loaded through the real `datasets` / pyarrow / pandas
loaders: one message of ours (DataFileError, exit 2) naming the file, the line where it is known, and no hint that
does not fit (the UTF-8 re-save hint only for bad bytes; never `datasets`' "corresponds to no data")."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_pipeline.pipeline.data.source_spec import DataFileError, source_spec
from grpo_pipeline.pipeline.data.sources import resolve_source
from tests.data_helpers import make_cfg

UTF8_HINT = "Re-save the file as UTF-8"


def _parquet(table):
    def write(path: Path) -> None:
        pq.write_table(table, path)
    return write


def _bytes(content: bytes):
    return lambda path: path.write_bytes(content)


NO_ROWS = _parquet(pa.table({"q": pa.array([], pa.string()), "a": pa.array([], pa.string())}))
# (format, fault) -> (writer, facts the message holds). "line N" where the fault's line is known.
CASES = {
    ("jsonl", "invalid encoding"): (_bytes(b'{"q": "a", "a": "1"}\n{"q": "\xff\xfe", "a": "2"}\n'),
                                    ["line 2 is not UTF-8", UTF8_HINT]),
    ("jsonl", "surrogate escape"): (_bytes(b'{"q": "a", "a": "1"}\n{"q": "x\\ud800y", "a": "2"}\n'),
                                    ["line 2 holds a lone surrogate"]),
    ("jsonl", "surrogate bytes"): (_bytes(b'{"q": "a", "a": "1"}\n{"q": "\xed\xa0\x80", "a": "2"}\n'),
                                   ["line 2 is not UTF-8", UTF8_HINT]),
    ("jsonl", "malformed row"): (_bytes(b'{"q": "a", "a": "1"}\n{"q": "b", "a": \n'), ["line 2 is not valid JSON"]),
    ("jsonl", "not an object"): (_bytes(b'{"q": "a", "a": "1"}\n["b"]\n'), ["line 2 is a JSON list"]),
    ("jsonl", "empty"): (_bytes(b""), ["is empty (0 bytes)", "one `{"]),
    ("jsonl", "blank lines only"): (_bytes(b"\n \n"), ["holds only blank lines"]),
    ("json", "invalid encoding"): (_bytes(b'[{"q": "a", "a": "1"},\n {"q": "\xff", "a": "1"}]'),
                                   ["line 2 is not UTF-8", UTF8_HINT]),
    ("json", "surrogate escape"): (_bytes(b'[{"q": "a", "a": "1"},\n {"q": "\\udc00", "a": "1"}]'),
                                   ["line 2 holds a lone surrogate"]),
    ("json", "malformed row"): (_bytes(b'[{"q": "a", "a": "1"},\n {"q": ]'), ["line 2 is not valid JSON"]),
    ("json", "empty"): (_bytes(b""), ["is empty (0 bytes)", "a list of"]),
    ("json", "header-only"): (_bytes(b"[]"), ["is an empty JSON list"]),
    ("json", "wrong type"): (_bytes(b'[{"q": "a", "a": "1"}, 5]'), ["item 1 of the list is a JSON int"]),
    ("csv", "invalid encoding"): (_bytes(b"q,a\nx,1\n\xff\xfe,2\n"), ["line 3 is not UTF-8", UTF8_HINT]),
    ("csv", "malformed row"): (_bytes(b"q,a\nx,1\nz,3,4\n"), ["line 3: cannot be read as CSV", "Expected 2 fields"]),
    ("csv", "unclosed quote"): (_bytes(b'q,a\nx,1\n"y,2\n'), ["line 3: cannot be read as CSV", "EOF inside string"]),
    ("csv", "empty"): (_bytes(b""), ["is empty (0 bytes)", "header line"]),
    ("csv", "header-only"): (_bytes(b"q,a\n"), ["has a header (q,a) but no rows"]),
    ("csv", "blank lines only"): (_bytes(b"\n\n"), ["holds only blank lines"]),
    ("tsv", "invalid encoding"): (_bytes(b"q\ta\n\xff\t1\n"), ["line 2 is not UTF-8", UTF8_HINT]),
    ("tsv", "malformed row"): (_bytes(b"q\ta\nx\t1\ny\t2\t3\n"), ["line 3: cannot be read as CSV"]),
    ("tsv", "empty"): (_bytes(b""), ["is empty (0 bytes)", "<TAB>"]),
    ("tsv", "header-only"): (_bytes(b"q\ta\n"), ["has a header (q\ta) but no rows"]),
    ("parquet", "invalid encoding"): (_bytes(b"PAR1 not really parquet"), ["is not a readable Parquet file"]),
    ("parquet", "empty"): (_bytes(b""), ["is empty (0 bytes)", "to_parquet"]),
    ("parquet", "header-only"): (NO_ROWS, ["has columns (q, a) but no rows"]),
}


def _load(tmp_path: Path, fmt: str, write) -> None:
    path = tmp_path / f"data.{fmt}"
    write(path)
    cfg = make_cfg(tmp_path, dataset_name=str(path), question_field="q", answer_field="a")
    resolve_source(cfg, source_spec(cfg), tmp_path / "cache").load()


def test_the_table_covers_every_format_and_fault():
    from grpo_pipeline.pipeline.data.source_spec import LOCAL_FORMATS

    formats = {fmt for fmt, _ in CASES}
    assert {suffix.lstrip(".") for suffix in LOCAL_FORMATS} == formats
    for fmt in formats:
        assert {"empty", "invalid encoding"} <= {fault for f, fault in CASES if f == fmt}
    assert all((fmt, "header-only") in CASES for fmt in ("json", "csv", "tsv", "parquet"))


@pytest.mark.parametrize(("fmt", "fault"), list(CASES), ids=[f"{fmt}-{fault}" for fmt, fault in CASES])
def test_a_faulty_file_is_one_message_naming_the_file_and_line_with_only_fitting_hints(tmp_path, fmt, fault):
    write, facts = CASES[fmt, fault]
    with pytest.raises(DataFileError) as caught:
        _load(tmp_path, fmt, write)
    text = str(caught.value)
    assert str(tmp_path / f"data.{fmt}") in text, text
    for fact in facts:
        assert fact in text, (fact, text)
    if UTF8_HINT not in facts:
        assert UTF8_HINT not in text and "UTF-8, one record per line" not in text, text
    assert "corresponds to no data" not in text and "DatasetGenerationError" not in text, text


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_a_cell_of_the_wrong_type_is_a_reported_rejection_not_a_crash(tmp_path, fmt, qwen_tokenizer):
    """A question that is an object or a number (pyarrow reads it) is rejected by cleaning as non_string_field."""
    from grpo_pipeline.pipeline.data.prepare import DataError, prepare_dataset

    path = tmp_path / f"data.{fmt}"
    rows = [{"q": "What is 1+1?", "a": "2"}, {"q": {"x": 1} if fmt != "parquet" else "What is 2+2?", "a": "4"}]
    if fmt == "parquet":
        pq.write_table(pa.table({"q": [1, 2], "a": ["2", "4"]}), path)
    else:
        import json

        text = "\n".join(json.dumps(r) for r in rows) if fmt == "jsonl" else json.dumps(rows)
        path.write_text(text, encoding="utf-8")
    cfg = make_cfg(tmp_path, dataset_name=str(path), question_field="q", answer_field="a")
    with pytest.raises(DataError) as caught:  # strict: the rejection is the error, naming its reason
        prepare_dataset(cfg.replace(strict=True), qwen_tokenizer)
    assert "non_string_field" in str(caught.value) or "not text" in str(caught.value), str(caught.value)


# ---------------------------------------------------------------- tokenizer files (transformers / tokenizers)

TOKENIZER_FAULTS = {
    "tokenizer.json-not-json": ("tokenizer.json", b'{"version": broken', "tokenizer.json line 1, column 13 is not "
                                "valid JSON"),
    "tokenizer.json-not-a-tokenizer": ("tokenizer.json", b'{"version": "1.0"}', "tokenizer.json is not a tokenizer "
                                       "the tokenizers library can read (Model missing"),
    "tokenizer_config-not-json": ("tokenizer_config.json", b"{oops", "tokenizer_config.json line 1, column 2 is not "
                                  "valid JSON"),
    "tokenizer_config-not-utf8": ("tokenizer_config.json", b'{"a": "\xff"}', "tokenizer_config.json is not UTF-8"),
}


@pytest.mark.parametrize("fault", list(TOKENIZER_FAULTS))
def test_a_broken_tokenizer_file_of_a_local_model_is_named(tmp_path, fault):
    import shutil

    from grpo_pipeline.pipeline.assets import qwen_tokenizer_dir
    from grpo_pipeline.pipeline.config import ConfigError
    from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer

    folder = tmp_path / "model"
    shutil.copytree(qwen_tokenizer_dir(), folder)
    name, content, fact = TOKENIZER_FAULTS[fault]
    (folder / name).write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_tokenizer(str(folder))
    assert caught.value.field == "model_name_or_path" and str(folder / name) in str(caught.value)
    assert fact in str(caught.value), str(caught.value)
