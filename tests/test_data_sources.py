"""Data sources without flags, over the class: every file format x (single file | folder with splits | save_to_disk)
x edit-after-cache, and a local path never goes to the hub. Real Qwen2.5 tokenizer, offline, small files in tmp_path."""

import json
import os

import pytest

from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.data.prepare import prepare_dataset
from tests.data_helpers import make_cfg

TRAIN = [{"q": f"What is {i} + {i}?", "a": str(2 * i)} for i in range(1, 6)]
TEST = [{"q": f"What is {i} x 3?", "a": str(3 * i)} for i in range(1, 4)]


def _write_json_lines(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _write_csv(path, rows, sep=","):
    lines = [sep.join(["q", "a"])] + [sep.join([r["q"], r["a"]]) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"q": [r["q"] for r in rows], "a": [r["a"] for r in rows]}), path)


WRITERS = {
    "jsonl": lambda p, rows: _write_json_lines(p, rows),
    "json-list": lambda p, rows: p.write_text(json.dumps(rows), encoding="utf-8"),
    "json-wrapped": lambda p, rows: p.write_text(json.dumps({"version": 1, "data": rows}), encoding="utf-8"),
    "json-lines-in-.json": lambda p, rows: _write_json_lines(p, rows),
    "csv": lambda p, rows: _write_csv(p, rows),
    "tsv": lambda p, rows: _write_csv(p, rows, sep="\t"),
    "parquet": lambda p, rows: _write_parquet(p, rows),
}
SUFFIX = {"jsonl": ".jsonl", "csv": ".csv", "tsv": ".tsv", "parquet": ".parquet"}


def write(fmt, path_without_suffix, rows):
    path = path_without_suffix.with_suffix(SUFFIX.get(fmt, ".json"))
    WRITERS[fmt](path, rows)
    return path


def cfg_for(tmp_path, name, **kw):
    return make_cfg(tmp_path, dataset_name=str(name), question_field="q", answer_field="a", **kw)


def bump_mtime(path):
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


@pytest.mark.parametrize("fmt", sorted(WRITERS))
@pytest.mark.parametrize("layout", ["file", "folder"])
def test_every_format_and_layout_loads_and_an_edit_is_never_served_stale(qwen_tokenizer, tmp_path, fmt, layout):
    if layout == "file":
        source = train_file = write(fmt, tmp_path / "mine", TRAIN)
    else:
        source = tmp_path / "folder"
        source.mkdir()
        train_file = write(fmt, source / "train", TRAIN)
        write(fmt, source / "test", TEST)
        (source / "README.md").write_text("not data", encoding="utf-8")
    # dataset_config stays at its hub default (main): a local source ignores it.
    cfg = cfg_for(tmp_path, source, eval_before=True, eval_split="test")
    first = prepare_dataset(cfg, qwen_tokenizer)
    assert first.report["source"]["kind"] == layout
    assert first.dataset["grpo_answer"] == [r["a"] for r in TRAIN] and first.dataset["grpo_id"][0] == "train-0"
    assert prepare_dataset(cfg, qwen_tokenizer).report["cache_hit"] is True
    if layout == "folder":
        test = prepare_dataset(cfg, qwen_tokenizer, role="eval")
        assert test.dataset["grpo_answer"] == [r["a"] for r in TEST] and test.dataset["grpo_id"][0] == "test-0"

    # Same size, new content, then new content with the old mtime restored: both are seen.
    edited = [dict(r, a=str(int(r["a"]) + 1 if int(r["a"]) < 9 else 1)) for r in TRAIN]
    mtime = train_file.stat().st_mtime_ns
    write(fmt, train_file.with_suffix(""), edited)
    os.utime(train_file, ns=(mtime, mtime))
    second = prepare_dataset(cfg, qwen_tokenizer)
    assert second.report["cache_hit"] is False and second.dataset["grpo_answer"] == [r["a"] for r in edited]
    # Adding rows (a new file in the folder, or more lines) is seen too.
    if layout == "folder":
        write(fmt, source / "train_2", [{"q": "What is 7 + 7?", "a": "14"}])
    else:
        write(fmt, train_file.with_suffix(""), edited + [{"q": "What is 7 + 7?", "a": "14"}])
    bump_mtime(train_file)
    third = prepare_dataset(cfg, qwen_tokenizer)
    assert third.report["cache_hit"] is False and third.report["rows_in"] == len(TRAIN) + 1


@pytest.mark.parametrize("kind", ["Dataset", "DatasetDict"])
def test_a_save_to_disk_folder_is_read_locally(qwen_tokenizer, tmp_path, kind):
    from datasets import Dataset, DatasetDict

    folder = tmp_path / "saved"
    train = Dataset.from_list(TRAIN)
    (train if kind == "Dataset" else DatasetDict({"train": train, "test": Dataset.from_list(TEST)})).save_to_disk(
        str(folder))
    cfg = cfg_for(tmp_path, folder)
    data = prepare_dataset(cfg, qwen_tokenizer)
    assert data.report["source"]["kind"] == "saved" and data.dataset["grpo_answer"] == [r["a"] for r in TRAIN]
    if kind == "DatasetDict":
        assert prepare_dataset(cfg.replace(eval_split="test"), qwen_tokenizer, role="eval").report["rows_in"] == 3
    else:
        with pytest.raises(ConfigError, match="one split") as err:
            prepare_dataset(cfg, qwen_tokenizer, role="eval")
        assert err.value.field == "eval_dataset_name"


@pytest.mark.parametrize("name", ["./no-such-folder", "no/such/folder", "~/no-such-file.jsonl", "missing.csv",
                                  "/abs/no-such-dir"])
def test_a_local_path_never_goes_to_the_hub(qwen_tokenizer, tmp_path, monkeypatch, name):
    import datasets

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked for a local path")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    with pytest.raises(ConfigError, match="does not exist") as err:
        prepare_dataset(cfg_for(tmp_path, name), qwen_tokenizer)
    assert err.value.field == "dataset_name"


def test_folder_with_unmatched_names_is_one_train_split_and_mixed_formats_are_named(qwen_tokenizer, tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    _write_json_lines(folder / "part-a.jsonl", TRAIN[:2])
    _write_json_lines(folder / "part-b.jsonl", TRAIN[2:])
    data = prepare_dataset(cfg_for(tmp_path, folder), qwen_tokenizer)
    assert data.dataset["grpo_answer"] == [r["a"] for r in TRAIN]
    _write_csv(folder / "part-c.csv", TRAIN[:1])
    with pytest.raises(ValueError, match="mixes file formats"):
        prepare_dataset(cfg_for(tmp_path, folder), qwen_tokenizer)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no data files"):
        prepare_dataset(cfg_for(tmp_path, empty), qwen_tokenizer)


def test_a_folder_without_the_asked_split_names_the_split_option(qwen_tokenizer, tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    _write_json_lines(folder / "train.jsonl", TRAIN)
    _write_json_lines(folder / "validation.jsonl", TEST)
    with pytest.raises(ConfigError, match="'train', 'validation'") as err:
        prepare_dataset(cfg_for(tmp_path, folder, dataset_split="dev"), qwen_tokenizer)
    assert err.value.field == "dataset_split"
    with pytest.raises(ConfigError, match="eval_split is 'test'") as err:
        prepare_dataset(cfg_for(tmp_path, folder), qwen_tokenizer, role="eval")
    assert err.value.field == "eval_split"
    assert prepare_dataset(cfg_for(tmp_path, folder, eval_split="validation"), qwen_tokenizer,
                           role="eval").report["rows_in"] == len(TEST)


@pytest.mark.parametrize("name, local", [
    ("openai/gsm8k", False), ("swulling/gsm8k_chinese", False), ("gsm8k", False),
    ("./data", True), ("../data.jsonl", True), ("/abs/x", True), ("~/x.csv", True), ("$GRPO_TEST_DATA/x", True),
    ("a/b/c", True), ("data\\train.jsonl", True), ("my.jsonl", True), ("MY.JSON", True), ("t.tsv", True),
    ("p.parquet", True), ("recipe.yaml", True),
])
def test_the_path_checks_and_the_data_loader_read_a_dataset_name_alike(name, local):
    """One reading of "dataset_name is a local path": what the path checks check is what the loader reads."""
    from grpo_pipeline.env.path_check import PATH_OPTIONS
    from grpo_pipeline.pipeline.data.data_files import local_path

    for option in ("dataset_name", "eval_dataset_name"):
        assert PATH_OPTIONS["train"][option].applies(name) is local, option
    assert (local_path(name) is not None) is local


def test_a_dataset_path_through_an_environment_variable_is_read_from_where_it_points(qwen_tokenizer, tmp_path,
                                                                                      monkeypatch):
    _write_json_lines(tmp_path / "mine.jsonl", TRAIN)
    monkeypatch.setenv("GRPO_TEST_DATA", str(tmp_path))
    data = prepare_dataset(cfg_for(tmp_path, "$GRPO_TEST_DATA/mine.jsonl"), qwen_tokenizer)
    assert data.report["source"]["path"] == str(tmp_path / "mine.jsonl")
    assert data.dataset["grpo_answer"] == [r["a"] for r in TRAIN]


# A chat dataset's own column of {role, content} lists (`messages`, `conversation`), in each format that holds lists:
# never taken as question text row by row (every row rejected as non_string_field), never as prompts on its own (it
# may end with the assistant's reply), but refused once, naming the option and the column, with TRL's `prompt` as the fix.
CHAT_ROWS = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}], "a": str(2 * i)} for i in range(1, 4)]
LIST_FORMATS = {"jsonl": lambda p, rows: _write_json_lines(p, rows),
                "json-list": lambda p, rows: p.write_text(json.dumps(rows), encoding="utf-8"),
                "parquet": lambda p, rows: __import__("pandas").DataFrame(rows).to_parquet(p)}


@pytest.mark.parametrize("fmt", sorted(LIST_FORMATS))
@pytest.mark.parametrize("split,option", [("train", "question_field"), ("eval", "eval_question_field")])
@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
def test_a_column_of_chat_messages_under_another_name_is_refused_naming_prompt(qwen_tokenizer, tmp_path, fmt, split,
                                                                             option, named):
    path = tmp_path / f"chats.{'parquet' if fmt == 'parquet' else 'jsonl' if fmt == 'jsonl' else 'json'}"
    LIST_FORMATS[fmt](path, CHAT_ROWS)
    fields = {"answer_field": "a", **({"question_field": "messages"} if named else {})}
    if split == "train":
        cfg = make_cfg(tmp_path, dataset_name=str(path), **fields)
    else:
        cfg = make_cfg(tmp_path, eval_dataset_name=str(path), eval_before=True,
                       **{f"eval_{key}": value for key, value in fields.items()})
    with pytest.raises(ConfigError) as refused:
        prepare_dataset(cfg, qwen_tokenizer, role=split)
    said = str(refused.value)
    assert refused.value.field == option and "'messages'" in said and "chat messages" in said
    assert "column named `prompt`" in said and f"leave {option} unset" in said
    # the fix, followed: the same rows with the column renamed are TRL's conversational prompts
    LIST_FORMATS[fmt](path, [{"prompt": row["messages"], "a": row["a"]} for row in CHAT_ROWS])
    renamed = {key: value for key, value in fields.items() if key != "question_field"}
    cfg = (make_cfg(tmp_path, dataset_name=str(path), **renamed) if split == "train" else
           make_cfg(tmp_path, eval_dataset_name=str(path), eval_before=True,
                    **{f"eval_{key}": value for key, value in renamed.items()}))
    prepared = prepare_dataset(cfg, qwen_tokenizer, role=split)
    assert len(prepared.dataset) == len(CHAT_ROWS)
