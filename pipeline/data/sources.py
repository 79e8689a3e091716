"""Where raw rows come from: a local file or folder, a `save_to_disk` folder, the hub, the bundled sample, the demo
(docs/own-data.md). A name that exists on disk or looks like a path never goes to the hub. A hub dataset is
downloaded once (Hugging Face or ModelScope, per `model_source`; HF_ENDPOINT and HF_HOME honoured) and kept as a
`save_to_disk` copy under the data cache. Each source has a cache identity computed without loading any rows, and a
loader. Rows get ids `<split>-<0-based row index>`, which data_report.json uses to point at rejected rows.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Optional

from huggingface_hub import constants as hub_constants

from grpo_pipeline.env.hubs import download_dataset, endpoint
from grpo_pipeline.env.paths import publish_once
from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.config.fields import DataArguments
from grpo_pipeline.pipeline.data.cache import file_sha256, local_file_identity, local_tree_identity
from grpo_pipeline.pipeline.data.clean import check_prompt, clean_column_name
from grpo_pipeline.pipeline.data.data_files import is_saved_copy, load_data_files, local_layout, local_path
from grpo_pipeline.pipeline.data.source_spec import (
    OWN_PREFIX,
    PROMPT_COLUMN,
    SAMPLE_NAME,
    SAMPLE_PATH,
    SINGLE_FILE_SPLIT,
    DataSource,
    DataSourceError,
    RawRows,
    SourceSpec,
)
from grpo_pipeline.pipeline.demo.registry import builtin_source
from grpo_pipeline.pipeline.demo.task import DemoTask


# A column of {role, content} message lists under a name other than `prompt` (a chat dataset's `messages`): the rows
# looked at, and the fix. Not taken as prompts on its own: such a column often ends with the assistant's reply, which
# in a prompt would show the model its answer.
CHAT_PROBE_ROWS = 20


def holds_chats(values: Any) -> bool:
    """True when one of the first CHAT_PROBE_ROWS values is a list of {role, content} messages.

    >>> holds_chats(["2+2?", [{"role": "user", "content": "3+3?"}]]), holds_chats(["2+2?", None, ["a", "b"]])
    (True, False)
    """
    return any(not isinstance(value, str) and check_prompt(value)[1] is None
               for value in (values[i] for i in range(min(CHAT_PROBE_ROWS, len(values)))))


def chat_column_fix(option: str) -> str:
    return ("TRL's conversational format takes them in a column named `prompt`, the messages before the assistant's "
            "reply (an assistant message left in a prompt shows the model its answer): rename that column to prompt "
            f"and leave {option} unset.")


def prompt_format_of(columns: list[str], spec: SourceSpec) -> str:
    """"prompt" for TRL's rows (a `prompt` column, question_field unset or naming it), else "question"; refused when
    the data has both and question_field was set.

    >>> from grpo_pipeline.pipeline.config import PipelineConfig
    >>> from grpo_pipeline.pipeline.data.source_spec import source_spec
    >>> spec = source_spec(PipelineConfig())
    >>> prompt_format_of(["prompt", "solution"], spec), prompt_format_of(["question", "answer"], spec)
    ('prompt', 'question')
    """
    field = spec.question_field
    if field == PROMPT_COLUMN or (PROMPT_COLUMN in columns and field == DataArguments.question_field):
        return "prompt"
    if PROMPT_COLUMN in columns and field in columns:
        raise ConfigError(spec.question_option, f"the data has TRL's `prompt` column and {spec.question_option} "
                          f"names {excerpt(field)}: prompts built from {excerpt(field)} would hide yours. Leave "
                          f"{spec.question_option} unset to train on `prompt` as TRL does, or rename the `prompt` "
                          "column.")
    return "question"


def _rows(dataset: Any, spec: SourceSpec, split: str, where: str) -> RawRows:
    """The prompt, answer and solution columns (names matched after BOM/blank stripping), every column in `table`."""
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
                          "...). Rename them.")
    prompt_format = prompt_format_of(names, spec)
    question = PROMPT_COLUMN if prompt_format == "prompt" else spec.question_field
    answer_optional = prompt_format == "prompt" and spec.answer_field == DataArguments.answer_field
    wanted = [("question", question, spec.question_option)]
    if not (answer_optional and spec.answer_field not in names):
        wanted.append(("answer", spec.answer_field, spec.answer_option))
    if spec.solution_field:
        wanted.append(("worked solution", spec.solution_field, "solution_field"))
    values = {column: field_values(dataset, names, column, option, what, where) for what, column, option in wanted}
    questions = values[question]
    if prompt_format == "question" and holds_chats(questions):
        raise ConfigError(spec.question_option, f"{spec.question_option} names {excerpt(question)} in {where}, whose "
                          f"values are chat messages, not question text. {chat_column_fix(spec.question_option)}")
    answers = values.get(spec.answer_field, [None] * len(questions))
    return RawRows(questions=questions, answers=answers, ids=[f"{split}-{i}" for i in range(len(questions))],
                   solutions=values[spec.solution_field] if spec.solution_field else None,
                   prompt_format=prompt_format, table=dataset)


def field_values(dataset: Any, names: list[str], field: str, option: str, what: str, where: str) -> list[Any]:
    """The values of `field`: a column, or a dotted path into a column of dicts (verl's `reward_model.ground_truth`);
    refused naming `option` and listing the columns and nested paths when neither exists."""
    if field in names:
        return list(dataset[field])
    head, _, rest = field.partition(".")
    if rest and head in names:
        found = [nested(value, rest) for value in dataset[head]]
        if any(value is not None for value in found):
            return found
    hint = (" A dataset in TRL's format has a `prompt` column instead (text, or a list of {role, content} messages)."
            if what == "question" else "")
    chats = [name for name in names if what == "question" and holds_chats(dataset[name])]
    if chats:
        hint = f" If your prompts are the chat messages in its column {excerpt(chats[0])}: {chat_column_fix(option)}"
    paths = nested_paths(dataset, names)
    listed = f"; nested fields, as a dotted path: {', '.join(paths)}" if paths else ""
    raise ConfigError(option, f"column {excerpt(field)} is not in {where}; its columns are {sorted(names)}{listed}. "
                      f"Set {option} to the column (or dotted path) that holds the {what}s.{hint}")


def nested(value: Any, path: str) -> Any:
    """`value["a"]["b"]` for path "a.b"; None where a key is missing or a value is not a dict.

    >>> nested({"style": "rule", "ground_truth": "72"}, "ground_truth"), nested({"x": 1}, "y.z")
    ('72', None)
    """
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def nested_paths(dataset: Any, names: list[str]) -> list[str]:
    """The dotted paths to the scalar values inside the first row's dict columns (`reward_model.ground_truth`)."""
    first = {name: dataset[name][0] for name in names} if names and len(dataset[names[0]]) else {}
    paths: list[str] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}", inner)
        elif "." in prefix:
            paths.append(prefix)

    for name, value in first.items():
        walk(name, value)
    return paths


def pick_split(spec: SourceSpec, available: list[str], where: str) -> str:
    """The split `spec` asks for, or a ConfigError naming the option. A single file never stands in for a missing
    test split (it would evaluate on the training data), unless it is eval_dataset_name's."""
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


def _load_local_split(path: Path, kind: str, files: list[Path], spec: SourceSpec, split: str, cache_root: Path,
                      where: str) -> RawRows:
    if kind == "saved":
        # lazy: datasets imports torch
        from datasets import DatasetDict, load_from_disk

        loaded = load_from_disk(str(path))
        dataset = loaded[split] if isinstance(loaded, DatasetDict) else loaded
    else:
        dataset = load_data_files(files, spec, cache_root)
    return _rows(dataset, spec, split, where)


def resolve_source(cfg: Any, spec: SourceSpec, cache_root: Path) -> DataSource:
    """`spec` as a DataSource; reads no rows yet (a hub split is checked once it is loaded)."""
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
                      "code_sha256": [file_sha256(f) if f.is_file() else None for f in builtin.code_files]},
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


def hub_saved_copy_dir(cache_root: Path, name: str, dataset_config: Optional[str], revision: Optional[str],
                       source: str = "hf") -> Path:
    """Where a hub dataset's `save_to_disk` copy (all splits) lives.

    >>> hub_saved_copy_dir(Path("/c"), "openai/gsm8k", "main", None).as_posix()
    '/c/hub/openai__gsm8k__main__default'
    >>> hub_saved_copy_dir(Path("/c"), "AI-ModelScope/gsm8k", "main", None, "modelscope").as_posix()
    '/c/modelscope/AI-ModelScope__gsm8k__main__default'
    """
    slug = "__".join([name.replace("/", "__"), dataset_config or "default", revision or "default"])
    return cache_root / ("modelscope" if source == "modelscope" else "hub") / slug


def hub_endpoint() -> str:
    """The hub address `datasets` will use: $HF_ENDPOINT when set (mirrors), else huggingface.co."""
    return hub_constants.ENDPOINT  # huggingface_hub reads $HF_ENDPOINT into it when it is first imported


def load_hub_splits(spec: SourceSpec, cache_root: Path, source: str = "hf") -> Any:
    """All splits of a hub dataset: our saved copy, made by downloading when there is none."""
    from datasets import load_from_disk  # lazy: datasets imports torch

    saved = hub_saved_copy_dir(cache_root, spec.name, spec.config, spec.revision, source)
    if not is_saved_copy(saved):
        splits = _download(spec, saved, source)
        publish_once(saved, lambda staging: splits.save_to_disk(str(staging)), is_complete=is_saved_copy,
                     option="data_cache_dir")
        print(f"[grpo data] saved a copy at {saved}; later runs read it offline", file=sys.stderr)
    return load_from_disk(str(saved))


def _download(spec: SourceSpec, saved: Path, source: str) -> Any:
    """The dataset's splits from the hub, or ModelScope's repository files (env.hubs) read as a local folder."""
    from datasets import load_dataset  # lazy: datasets imports torch

    name, config = spec.name, spec.config
    if source == "modelscope":
        print(f"[grpo data] downloading {name} ({config}) from ModelScope ({endpoint('modelscope')}); cache: "
              f"{os.environ.get('MODELSCOPE_CACHE', '~/.cache/modelscope (default)')} (MODELSCOPE_CACHE)",
              file=sys.stderr)
        folder = download_dataset(name, spec.revision)
        try:
            return load_dataset(str(folder), config)
        except Exception as err:
            raise DataSourceError(f"could not read ModelScope dataset {excerpt(name)} (config {excerpt(config)}) "
                                  f"downloaded to {folder}: {type(err).__name__}: {err}\nCheck dataset_config (None "
                                  "for a single one) and that the repository holds .jsonl/.csv/.parquet data files."
                                  ) from err
    address = hub_endpoint()
    hf_home = os.environ.get("HF_HOME", "~/.cache/huggingface (default)")
    print(f"[grpo data] downloading {name} ({config}) from {address} (HF_ENDPOINT); HF cache: {hf_home}",
          file=sys.stderr)
    try:
        return load_dataset(name, config, revision=spec.revision)
    except Exception as err:
        if "BuilderConfig" in str(err) or "config name" in str(err).lower():
            raise ConfigError(spec.config_option, f"hub dataset {excerpt(name)} ({spec.name_option}) has no config "
                              f"{excerpt(config)}: {err}. Set {spec.config_option} to one of its configs, or to null "
                              "for a dataset with one.") from None
        raise ConfigError(
            spec.name_option,
            f"could not load dataset {excerpt(name)} (config {excerpt(config)}) from {address}: "
            f"{type(err).__name__}: {err}\nNo saved copy at {saved}, and no local file or folder {excerpt(name)} "
            "either. Fixes: check the network; in mainland China set HF_ENDPOINT=https://hf-mirror.com; offline, "
            f"copy a `save_to_disk` folder of the dataset to that path, or give {spec.name_option} a local path."
        ) from err


def _builtin_rows(builtin: DemoTask, n: int, seed: int, split: str) -> RawRows:
    problems = builtin.rows(n, seed, split)
    questions, answers = [p.get("question") for p in problems], [p.get("answer") for p in problems]
    return RawRows(questions=questions, answers=answers, ids=[f"{split}-{i}" for i in range(len(problems))],
                   table={"question": questions, "answer": answers})
