"""Training data: rows -> cleaned -> chat prompts -> length-checked with the real tokenizer -> cached.

Every answer is read by the correctness reward's own reader (clean.py): an unreadable one gives its prompt no
learning signal and is rejected, and a dataset of mostly such answers is refused naming answer_field. TRL no longer
filters prompts, so over-long ones are dropped or refused here (prompts.py). The report (data_report.json) holds
rows_in = rows_kept + rows_rejected_total + rows_unused_max_samples; the cache (cache.py) holds the materialised
dataset, so the next run tokenizes nothing.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from grpo_pipeline.env.locations import absolute_path, snapshot
from grpo_pipeline.env.paths import atomic_write_json
from grpo_pipeline.env.secret_fields import masked
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, check_choice, parse_limit, role_values
from grpo_pipeline.pipeline.data.cache import (
    DATA_FORMAT_VERSION,
    data_cache_root,
    fingerprint,
    load_cached,
    save_cached,
    tokenizer_identity,
)
from grpo_pipeline.pipeline.data.clean import clean_rows
from grpo_pipeline.pipeline.data.columns import prompt_formats, training_columns
from grpo_pipeline.pipeline.data.prompts import (
    LengthBudget,
    check_system_prompt_survives,
    count_prompt_tokens,
    with_system_prompt,
    length_stats,
    system_prompt_tokens,
)
from grpo_pipeline.pipeline.data.source_spec import DataSource, source_spec
from grpo_pipeline.pipeline.data.sources import resolve_source
from grpo_pipeline.env.kept import code_hash
from grpo_pipeline import rewards
from grpo_pipeline.rewards import extract_hash_answer, reference_is_scorable
from grpo_pipeline.rewards.completions import build_prompt

REPORT_NAME = "data_report.json"
EVAL_REPORT_NAME = "data_report_eval.json"
# Rejected ids listed per reason in the report (the counts are always complete).
MAX_IDS_PER_REASON = 20
# Above this share of unscorable answers the answer column is most likely the wrong one (or not numeric):
# refused, naming answer_field, instead of training on the few rows left.
MAX_UNSCORABLE_SHARE = 0.5


class DataError(ValueError):
    """The data cannot be used as configured; `report`: the data report, written before this is raised."""

    def __init__(self, message: str, report: Optional[dict[str, Any]] = None):
        super().__init__(message)
        self.report = report


class UnscorableDataError(ConfigError):
    """Most answers cannot be read by the correctness reward: the answer column is wrong (exit 2, naming it)."""

    def __init__(self, field_name: str, message: str, report: dict[str, Any]):
        super().__init__(field_name, message)
        self.report = report


@dataclass
class PreparedData:
    """A ready training set: `prompt`, the source's own columns, and OWN_COLUMNS (grpo_answer, grpo_id, ...)."""

    dataset: Any  # datasets.Dataset
    report: dict[str, Any]
    max_prompt_length: int
    max_completion_length: int
    fingerprint: str
    report_path: Optional[Path] = None


def data_fields(cfg: PipelineConfig) -> dict[str, Any]:
    """The config's part of the cache fingerprint: the data_key fields (limits as numbers) and the answer reader."""
    fields = role_values(cfg, "data_key")
    for name in ("max_prompt_length", "max_completion_length"):  # `auto` and `AUTO` prepare the same rows
        fields[name] = parse_limit(fields[name], name)
    return {**fields, "answer_reader": answer_reader_version()}


def answer_reader_version() -> str:
    """sha256 of the rewards package's code: it decides which answers are scorable, so a change re-prepares."""
    return code_hash(rewards)


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No `datasets` progress bars while we work (they would bury the report)."""
    import datasets  # lazy: datasets imports torch

    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def prepare_dataset(cfg: PipelineConfig, tokenizer: Any, split: Optional[str] = None,
                    report_dir: Optional[str | Path] = None, role: str = "train",
                    write_report: bool = True) -> PreparedData:
    """Load, clean, length-check and cache one split of `role` (train | eval); write its report (in `report_dir`,
    else output_dir) unless `write_report` is false. Raises ConfigError, or DataError (strict, overlong_policy=error,
    no rows left) after writing the report.

    >>> from grpo_pipeline.pipeline.config import PipelineConfig
    >>> from grpo_pipeline.pipeline.assets import load_qwen_tokenizer
    >>> import tempfile
    >>> cfg = PipelineConfig().replace(dataset_name="sample", data_cache_dir=tempfile.mkdtemp())
    >>> data = prepare_dataset(cfg, load_qwen_tokenizer(), report_dir=tempfile.mkdtemp())
    >>> data.report["rows_in"], data.report["rows_kept"], data.dataset.column_names
    (50, 50, ['question', 'answer', 'prompt', 'grpo_answer', 'grpo_id', 'grpo_prompt_tokens', 'grpo_solution'])
    >>> data.max_prompt_length + data.max_completion_length == cfg.model.max_seq_length
    True
    """
    d = cfg.data
    report_name = EVAL_REPORT_NAME if role == "eval" else REPORT_NAME if split is None else f"data_report_{split}.json"
    spec = source_spec(cfg, role, split)
    check_choice("overlong_policy", d.overlong_policy)  # callers may come here without validate()
    budget = LengthBudget(
        max_seq_length=cfg.model.max_seq_length,
        fixed_prompt_limit=parse_limit(d.max_prompt_length, "max_prompt_length"),
        fixed_completion_limit=parse_limit(d.max_completion_length, "max_completion_length"),
    )
    # Cheap (one jinja render, no tokenizing), so it runs on cache hits too.
    check_system_prompt_survives(tokenizer, d.system_prompt)

    cache_root = data_cache_root(d.data_cache_dir)
    source = resolve_source(cfg, spec, cache_root)
    key = fingerprint(source.identity, tokenizer_identity(tokenizer), data_fields(cfg))
    entry = cache_root / key
    # What was there before the build is all the writes may replace (grpo_pipeline.env.paths.publish).
    entry_seen = snapshot(entry, option="data_cache_dir")
    report_folder = report_dir if report_dir is not None else cfg.grpo.output_dir
    report_seen = snapshot(absolute_path(report_folder) / report_name) if write_report else None

    with _quiet_datasets():
        cached = load_cached(entry)
        if cached is not None:
            (dataset, report), error = cached, None
            report["cache_hit"] = True
        else:
            dataset, report, error = _build(d, tokenizer, source, budget, spec.split, spec.name_option)
            report.update(fingerprint=key, cache_hit=False, cache_entry=str(entry))
            if error is None:
                save_cached(entry, dataset, report, seen=entry_seen)
    # First: when most answers are unreadable, the answer column is what to fix (even if no rows are left).
    unscorable = _unscorable_error(report, spec.answer_option)
    error = unscorable or error or _strict_error(report, d.strict)
    report.update(strict=bool(d.strict), status="error" if error else "ok", error=error)

    report_path: Optional[Path] = None
    if write_report:
        report_path = report_seen.path
        atomic_write_json(report_path, masked(report), seen=report_seen)  # a dataset URL's password masked
        report["report_path"] = str(report_path)
    where = f"\n(data report: {report_path})" if report_path else ""
    if unscorable:
        raise UnscorableDataError(spec.answer_option, f"{error}{where}", report)
    if error:
        raise DataError(f"{error}{where}", report)
    limits = report["limits"]
    return PreparedData(dataset=dataset, report=report, max_prompt_length=limits["max_prompt_length"],
                        max_completion_length=limits["max_completion_length"], fingerprint=key,
                        report_path=report_path)


def _strict_error(report: dict[str, Any], strict: bool) -> Optional[str]:
    """`strict: true` refuses any rejected row."""
    if not strict or not report["rows_rejected_total"]:
        return None
    counts = ", ".join(f"{reason}: {info['count']}" for reason, info in report["rows_rejected"].items())
    return (f"strict: true and {report['rows_rejected_total']} of {report['rows_in']} rows were rejected "
            f"({counts}). See rows_rejected in the data report for the ids; fix the data or set strict: false "
            "to drop them.")


def _unscorable_error(report: dict[str, Any], answer_option: str) -> Optional[str]:
    """The refusal of a mostly-unscorable dataset (the answer column is most likely the wrong one)."""
    info = report["rows_rejected"].get("unscorable_answer")
    checked = report.get("answers_checked") or 0
    if not info or not checked or info["count"] / checked <= MAX_UNSCORABLE_SHARE:
        return None
    examples = ", ".join(info["ids"][:5])
    return (f"{info['count']} of {checked} answers ({info['count'] / checked:.0%}) cannot be read by the "
            f"correctness reward as one final answer (unscorable_answer: {examples}, ...), so those rows would "
            f"teach (or, held out, measure) nothing. Check {answer_option}: it must name the column of final "
            "answers (a number such as 18, 1,234, $18, 3/4, 答案：18, or GSM8K's `... #### 18`). If a reward of your "
            "own reads these answers, set keep_unscorable: true.")


def _build(d: Any, tokenizer: Any, source: DataSource, budget: LengthBudget,
           split: str, source_option: str = "dataset_name") -> tuple[Any, dict[str, Any], Optional[str]]:
    """Load, clean and measure; return (dataset or None, report, error or None)."""
    started = time.perf_counter()
    # Fail before reading any rows when the limit cannot even hold the system prompt.
    floor = system_prompt_tokens(tokenizer, d.system_prompt)
    budget.check_room_for_system_prompt(floor)

    raw = source.load()
    loaded = time.perf_counter()
    rows, rejected = clean_rows(raw.questions, raw.answers, raw.ids, extract_hash_answer, solutions=raw.solutions,
                                is_scorable=reference_is_scorable, keep_unscorable=d.keep_unscorable,
                                trl_prompts=raw.prompt_format == "prompt")
    cleaned = time.perf_counter()
    if raw.prompt_format == "prompt":  # TRL's prompt, as written; ours only where a chat has no system message
        conversations = [with_system_prompt(d.system_prompt, row.prompt) for row in rows]
    else:
        conversations = [build_prompt(d.system_prompt, row.question) for row in rows]
    formats = prompt_formats(raw.prompt_format, [row.prompt for row in rows], d.system_prompt)
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

    error = _build_error(d.overlong_policy, overlong, keep, limit, source, source_option, len(raw.ids), rejected)
    prompt_limit = completion_limit = None
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
        # Unscorable share among the answers read (refused above MAX_UNSCORABLE_SHARE); kept ones are listed.
        "answers_checked": rejected.answers_checked,
        "unscorable_kept": {"count": len(rejected.unscorable_kept),
                            "ids": rejected.unscorable_kept[:MAX_IDS_PER_REASON]},
        "rows_with_solution": sum(1 for i in keep if rows[i].solution),
        "prompt_format": formats,
        "columns": sorted(set(getattr(raw.table, "column_names", raw.table)) - {"prompt"}),
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

    dataset = training_columns(raw.table, [conversations[i] for i in keep], [rows[i] for i in keep], kept_counts)
    report["timing_s"]["total"] = round(time.perf_counter() - started, 3)
    return dataset, report, None


def _build_error(overlong_policy: str, overlong: list[tuple[str, int]], keep: list[int], limit: int,
                 source: DataSource, source_option: str, rows_in: int, rejected: Any) -> Optional[str]:
    """Why the built split cannot be used (overlong_policy: error met an overlong prompt, or no row is left)."""
    if overlong and overlong_policy == "error":
        worst = ", ".join(f"{row_id} ({n} tokens)" for row_id, n in overlong[:MAX_IDS_PER_REASON])
        return (f"{len(overlong)} prompt(s) are longer than the prompt limit of {limit} tokens and "
                f"overlong_policy is `error`: {worst}. Raise max_prompt_length (or max_seq_length), shorten "
                "those questions, or set overlong_policy: drop.")
    if not keep:
        hint = (f" The prompts are over the limit of {limit} tokens: raise max_seq_length (or max_prompt_length), "
                "or use a model whose tokenizer needs fewer tokens for this text." if overlong else "")
        return (f"no rows left in {source.description.get('path') or source.description.get('name')} "
                f"({source_option}): {rows_in} rows came in, {rejected.total} were rejected "
                f"({', '.join(f'{k}: {len(v)}' for k, v in rejected.ids_by_reason.items())}).{hint}")
    return None

