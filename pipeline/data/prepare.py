"""Training data: rows -> cleaned -> chat prompts -> length-checked with the real tokenizer -> cached.

    prepare_dataset(cfg, tokenizer) -> PreparedData(dataset, report, max_prompt_length, ...)

`grpo data` (pipeline/data/report.py) runs it alone and prints the report.

The steps, and the pitfall each one is there for:

1. Load (sources.py): GSM8K from the hub via a saved copy that later runs read
   offline; local JSONL/CSV/Parquet; the bundled sample; the CPU demo's arithmetic.
2. Clean (clean.py): BOM, CRLF, NFC, trimming; rows that cannot be used are rejected
   with a reason code. GSM8K `#### 72` (and `#### 答案：72`) answers are reduced to `72`.
3. Prompts are chat messages (system + user). The chat template must reproduce the system
   prompt verbatim, newlines included, or we refuse to start (the format rewards depend on it).
4. Length (prompts.py): every prompt is rendered with the chat template and counted
   with the model's tokenizer. TRL no longer filters prompts, so over-long ones are dropped
   (and listed) or refused here; `auto` limits come from the measured lengths.
5. Report: data_report.json in the run folder says how many rows came in, how many were
   kept, and which were rejected and why (rows_in = rows_kept + rows_rejected_total +
   rows_unused_max_samples). `strict: true` turns any rejection into an error.
6. Cache (cache.py): the finished dataset is saved under a fingerprint of source,
   tokenizer and data settings; the next run loads it without tokenizing. The returned
   dataset is fully materialised, so training never maps rows (or waits on I/O) per batch.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from pipeline.config import ConfigError, check_choices, parse_limit
from pipeline.data.cache import (
    DATA_FORMAT_VERSION,
    data_cache_root,
    fingerprint,
    load_cached,
    save_cached,
    tokenizer_identity,
)
from pipeline.data.clean import clean_rows
from pipeline.data.prompts import (
    LengthBudget,
    build_prompt,
    check_system_prompt_survives,
    count_prompt_tokens,
    length_stats,
    system_prompt_tokens,
)
from pipeline.data.sources import DataSource, resolve_source

REPORT_NAME = "data_report.json"
# Rejected ids listed per reason in the report (the counts are always complete).
MAX_IDS_PER_REASON = 20


class DataError(ValueError):
    """The data cannot be used as configured (strict mode, overlong_policy=error, no rows left).

    `report` is the data report (also written to data_report.json before this is raised).
    """

    def __init__(self, message: str, report: Optional[dict[str, Any]] = None):
        super().__init__(message)
        self.report = report


@dataclass
class PreparedData:
    """A ready training set: columns prompt (chat messages), answer, id, prompt_tokens."""

    dataset: Any  # datasets.Dataset
    report: dict[str, Any]
    max_prompt_length: int
    max_completion_length: int
    fingerprint: str
    report_path: Optional[Path] = None


def report_file_name(split: Optional[str]) -> str:
    """data_report.json for the run's own data (no explicit split); data_report_<split>.json when a caller
    asks for a split (evaluation), so the training report is never overwritten.

    >>> report_file_name(None), report_file_name("test")
    ('data_report.json', 'data_report_test.json')
    """
    return REPORT_NAME if split is None else f"data_report_{split}.json"


def data_fields(cfg: Any) -> dict[str, Any]:
    """The config fields that change the prepared dataset (part of the cache fingerprint)."""
    d = cfg.data
    return {
        "system_prompt": d.system_prompt,
        "question_field": d.question_field,
        "answer_field": d.answer_field,
        "max_prompt_length": parse_limit(d.max_prompt_length, "max_prompt_length"),
        "max_completion_length": parse_limit(d.max_completion_length, "max_completion_length"),
        "overlong_policy": d.overlong_policy,
        "max_samples": d.max_samples,
        "max_seq_length": cfg.model.max_seq_length,
    }


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No `datasets` progress bars while we work (they would bury the report); restored afterwards."""
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def prepare_dataset(cfg: Any, tokenizer: Any, split: Optional[str] = None,
                    report_dir: Optional[str | Path] = None) -> PreparedData:
    """Load, clean, length-check and cache one split; write data_report.json; return the dataset and limits.

    `split` defaults to `dataset_split`; `report_dir` to `output_dir`. The report is
    data_report.json, or data_report_<split>.json when `split` is given (see report_file_name).
    Raises ConfigError for settings that cannot work (naming the field) and DataError when rows
    must not be dropped (strict, overlong_policy=error) or none are left; the report is written
    first either way. `prompt_tokens` in the report covers every cleaned row; `max_kept` only
    the rows kept.

    >>> from pipeline.config import PipelineConfig
    >>> from pipeline.assets import load_qwen_tokenizer
    >>> import tempfile
    >>> cfg = PipelineConfig().replace(dataset_name="sample", data_cache_dir=tempfile.mkdtemp())
    >>> data = prepare_dataset(cfg, load_qwen_tokenizer(), report_dir=tempfile.mkdtemp())
    >>> data.report["rows_in"], data.report["rows_kept"], data.dataset.column_names
    (50, 50, ['prompt', 'answer', 'id', 'prompt_tokens'])
    >>> data.max_prompt_length + data.max_completion_length == cfg.model.max_seq_length
    True
    """
    d = cfg.data
    report_name = report_file_name(split)
    split = split or d.dataset_split
    check_choices(d)  # overlong_policy; callers may come here without validate()
    budget = LengthBudget(
        max_seq_length=cfg.model.max_seq_length,
        fixed_prompt_limit=parse_limit(d.max_prompt_length, "max_prompt_length"),
        fixed_completion_limit=parse_limit(d.max_completion_length, "max_completion_length"),
    )
    # Cheap (one jinja render, no tokenizing), so it runs on cache hits too.
    check_system_prompt_survives(tokenizer, d.system_prompt)

    cache_root = data_cache_root(d.data_cache_dir)
    source = resolve_source(cfg, split, cache_root)
    key = fingerprint(source.identity, tokenizer_identity(tokenizer), data_fields(cfg))
    entry = cache_root / key

    error: Optional[str] = None
    with _quiet_datasets():
        cached = load_cached(entry)
        if cached is not None:
            dataset, report = cached
            report["cache_hit"] = True
        else:
            dataset, report, error = _build(cfg, tokenizer, source, budget, split)
            report.update(fingerprint=key, cache_hit=False, cache_entry=str(entry))
            if error is None:
                save_cached(entry, dataset, report)

    report["strict"] = bool(d.strict)
    if error is None and d.strict and report["rows_rejected_total"]:
        counts = ", ".join(f"{reason}: {info['count']}" for reason, info in report["rows_rejected"].items())
        error = (f"strict: true and {report['rows_rejected_total']} of {report['rows_in']} rows were rejected "
                 f"({counts}). See rows_rejected in the data report for the ids; fix the data or set strict: false "
                 "to drop them.")
    report["status"] = "error" if error else "ok"
    report["error"] = error

    report_path = Path(report_dir if report_dir is not None else cfg.grpo.output_dir) / report_name
    from env.paths import atomic_write_json

    atomic_write_json(report_path, report)
    report["report_path"] = str(report_path)
    if error:
        raise DataError(f"{error}\n(data report: {report_path})", report)
    limits = report["limits"]
    return PreparedData(dataset=dataset, report=report, max_prompt_length=limits["max_prompt_length"],
                        max_completion_length=limits["max_completion_length"], fingerprint=key,
                        report_path=report_path)


def training_columns(conversations: list[Any], rows: list[Any], prompt_tokens: list[int]) -> dict[str, list[Any]]:
    """The training set's columns. TRL passes every column but `prompt` to each reward function as a keyword
    argument (one entry per completion), so this is also what the pre-load reward probe passes (preflight)."""
    return {"prompt": conversations, "answer": [row.answer for row in rows], "id": [row.id for row in rows],
            "prompt_tokens": list(prompt_tokens)}


def _build(cfg: Any, tokenizer: Any, source: DataSource, budget: LengthBudget,
           split: str) -> tuple[Any, dict[str, Any], Optional[str]]:
    """Load, clean and measure; return (dataset or None, report, error message or None)."""
    from datasets import Dataset

    from rewards import extract_hash_answer  # lazy: the rewards package is only needed once rows exist

    d = cfg.data
    started = time.perf_counter()
    # Fail before reading any rows when the limit cannot even hold the system prompt.
    floor = system_prompt_tokens(tokenizer, d.system_prompt)
    budget.check_room_for_system_prompt(floor)

    raw = source.load()
    loaded = time.perf_counter()
    rows, rejected = clean_rows(raw.questions, raw.answers, raw.ids, extract_hash_answer)
    cleaned = time.perf_counter()
    conversations = [build_prompt(d.system_prompt, row.question) for row in rows]
    lengths = count_prompt_tokens(tokenizer, conversations)

    limit = budget.filter_limit
    overlong = [(row.id, n) for row, n in zip(rows, lengths.counts, strict=True) if n > limit]
    for row_id, _ in overlong:
        rejected.add("prompt_too_long", row_id)
    keep = [i for i, n in enumerate(lengths.counts) if n <= limit]
    unused = 0
    if d.max_samples is not None and len(keep) > d.max_samples:
        unused = len(keep) - d.max_samples
        keep = keep[: d.max_samples]
    kept_counts = [lengths.counts[i] for i in keep]

    error: Optional[str] = None
    if overlong and d.overlong_policy == "error":
        worst = ", ".join(f"{row_id} ({n} tokens)" for row_id, n in overlong[:MAX_IDS_PER_REASON])
        error = (f"{len(overlong)} prompt(s) are longer than the prompt limit of {limit} tokens and "
                 f"overlong_policy is `error`: {worst}. Raise max_prompt_length (or max_seq_length), shorten "
                 "those questions, or set overlong_policy: drop.")
    prompt_limit = completion_limit = None
    if not keep and error is None:
        error = (f"no rows left: {len(raw.ids)} rows came in, {rejected.total} were rejected "
                 f"({', '.join(f'{k}: {len(v)}' for k, v in rejected.ids_by_reason.items())}).")
    if error is None:
        prompt_limit, completion_limit = budget.final_limits(max(kept_counts))

    report: dict[str, Any] = {
        "format_version": DATA_FORMAT_VERSION,
        "source": source.description,
        "split": split,
        "rows_in": len(raw.ids),
        "rows_kept": len(keep),
        "rows_rejected_total": rejected.total,
        "rows_rejected": rejected.summary(MAX_IDS_PER_REASON),
        "rows_unused_max_samples": unused,
        "prompt_tokens": {**length_stats(lengths.counts), "max_kept": max(kept_counts, default=None)},
        "system_prompt_tokens": floor,
        "limits": {
            "max_seq_length": budget.max_seq_length,
            "max_prompt_length": prompt_limit,
            "max_completion_length": completion_limit,
            "max_prompt_length_setting": str(d.max_prompt_length),
            "max_completion_length_setting": str(d.max_completion_length),
            "overlong_limit": limit,
        },
        "overlong_policy": d.overlong_policy,
        "max_samples": d.max_samples,
        "tokenizer": str(getattr(tokenizer, "name_or_path", "")),
        "timing_s": {
            "load": round(loaded - started, 3),
            "clean": round(cleaned - loaded, 3),
            "render": round(lengths.render_s, 3),
            "tokenize": round(lengths.tokenize_s, 3),
        },
    }
    if error is not None:  # the counts are what the run would have kept; status says it did not
        return None, report, error

    dataset = Dataset.from_dict(training_columns([conversations[i] for i in keep], [rows[i] for i in keep],
                                                 kept_counts))
    report["timing_s"]["total"] = round(time.perf_counter() - started, 3)
    return dataset, report, None
