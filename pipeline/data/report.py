"""The data report for people: the accounting and prompt lines `grpo train` prints, and `grpo data`'s tables."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Column, Table

from grpo_pipeline.rewards.trl_source import reward_columns


def accounting_line(report: dict[str, Any], ids_shown: int = 3) -> str:
    """Rows in, kept, dropped by reason (with the first ids).

    >>> accounting_line({"rows_in": 40, "rows_kept": 29, "rows_rejected_total": 11, "rows_unused_max_samples": 0,
    ...                  "rows_rejected": {"prompt_too_long": {"count": 10, "ids": ["train-3", "train-5"]},
    ...                                    "unscorable_answer": {"count": 1, "ids": ["train-9"]}}})
    '40 rows in, 29 kept, 11 dropped: prompt_too_long 10 (train-3, train-5, ...), unscorable_answer 1 (train-9)'
    """
    line = f"{report['rows_in']} rows in, {report['rows_kept']} kept, {report['rows_rejected_total']} dropped"
    if report["rows_rejected"]:
        line += ": " + dropped_reasons(report, ids_shown)
    if report.get("rows_unused_max_samples"):
        line += f"; {report['rows_unused_max_samples']} unused (max_samples)"
    kept = (report.get("unscorable_kept") or {}).get("count")
    if kept:
        line += f"; {kept} unscorable answers kept (keep_unscorable)"
    return line


def dropped_reasons(report: dict[str, Any], ids_shown: int = 3) -> str:
    """Each reason rows were dropped for, with its count and first ids."""
    return ", ".join(f"{reason} {info['count']} ({', '.join(info['ids'][:ids_shown])}"
                     f"{', ...' if info['count'] > ids_shown else ''})"
                     for reason, info in report["rows_rejected"].items())


def prompt_line(report: dict[str, Any]) -> str:
    """The prompts' format, what happened to system_prompt (docs/own-data.md, "Prompts") and the columns TRL passes
    the rewards (rewards/trl_source.py).

    >>> prompt_line({"prompt_format": {"source": "prompt", "standard": 0, "conversational": 5,
    ...              "system_prompt": {"added": 2, "own_kept": 3, "standard_as_written": 0}}, "columns": ["completion", "solution"]})
    "TRL's prompt column, conversational: system_prompt added to 2, their own system message kept in 3; columns to the rewards: solution"
    """
    formats = report.get("prompt_format")
    if not formats:
        return ""
    system = formats["system_prompt"]
    if formats["source"] != "prompt":
        line = f"question_field rows made into chats (system_prompt + question) for {formats['conversational']}"
    elif formats["standard"]:
        line = (f"TRL's prompt column, standard (text, as written, no chat template; system_prompt does not apply) "
                f"for {formats['standard']}")
    else:
        line = (f"TRL's prompt column, conversational: system_prompt added to {system['added']}, their own "
                f"system message kept in {system['own_kept']}")
    columns = reward_columns(report.get("columns") or [], report.get("remove_unused_columns"))
    if report.get("remove_unused_columns"):
        return line + "; columns to the rewards: none (remove_unused_columns: true)"
    return line + (f"; columns to the rewards: {', '.join(columns)}" if columns else "")


def format_report(report: dict[str, Any]) -> Any:
    """The report as a rich renderable (tables), for people; `--json` prints the dict itself."""
    source = report.get("source", {})
    where = source.get("path") or f"{source.get('name')} ({source.get('config')})"
    rows = Table("item", Column("value", justify="right"), title="Rows", show_header=False, title_justify="left")
    rows.add_row("source", f"{where} [{report.get('split')}]")
    if source.get("endpoint"):
        rows.add_row("hub endpoint (HF_ENDPOINT)", source["endpoint"])
    if line := prompt_line(report):
        rows.add_row("prompts", line)
    rows.add_row("rows in", str(report["rows_in"]))
    rows.add_row("rows kept", str(report["rows_kept"]))
    rows.add_row("rows rejected", str(report["rows_rejected_total"]))
    for reason, info in report["rows_rejected"].items():
        more = ", ..." if info["count"] > 5 else ""
        rows.add_row(f"  {reason}", f"{info['count']}  ({', '.join(info['ids'][:5])}{more})")
    if report.get("rows_unused_max_samples"):
        rows.add_row("rows unused (max_samples)", str(report["rows_unused_max_samples"]))
    kept = report.get("unscorable_kept") or {}
    if kept.get("count"):
        rows.add_row("unscorable kept (keep_unscorable)", f"{kept['count']}  ({', '.join(kept['ids'][:5])})")

    tokens = report["prompt_tokens"]
    stats = ("count", "min", "p50", "p90", "p99", "max", "max_kept")
    lengths = Table(*(Column(name, justify="right") for name in stats),
                    title="Prompt tokens (chat template + generation prompt)", title_justify="left")
    lengths.add_row(*(str(tokens.get(name, "-")) for name in stats))

    limits = report["limits"]
    settings = Table("item", Column("value", justify="right"), title="Limits and cache", show_header=False,
                     title_justify="left")
    settings.add_row("system prompt alone", f"{report['system_prompt_tokens']} tokens")
    for name in ("max_seq_length", "max_prompt_length", "max_completion_length"):
        setting = limits.get(f"{name}_setting")
        settings.add_row(name, f"{limits[name]}" + (f"  ({setting})" if setting else ""))
    settings.add_row("overlong_policy / strict", f"{report['overlong_policy']} / {report.get('strict')}")
    settings.add_row("fingerprint", str(report.get("fingerprint", ""))[:16])
    settings.add_row("cache", "hit (no re-tokenization)" if report.get("cache_hit") else "built and saved")
    if report.get("report_path"):
        settings.add_row("report", report["report_path"])
    parts: list[Any] = [rows, lengths, settings]
    if report.get("error"):
        parts.append(f"[bold red]error:[/] {report['error']}")
    return Group(*parts)
