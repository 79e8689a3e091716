"""`grpo data`: prepare the training data as `grpo train` would and print its length/rejection report.

    grpo data [--config X] [--json] [--key value ...]   (loads the tokenizer only, never a model)

The preparing is pipeline/data/prepare.py's; this module is the command around it: the same default
config as `grpo train`, the exit codes, and the report as rich tables (or JSON).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

from pipeline.bootstrap import backend_choice, defaults_for
from pipeline.config import parse_config, validate
from pipeline.config.paths import config_paths
from pipeline.data import model_check
from pipeline.data.prepare import EVAL_REPORT_NAME, DataError
from pipeline.data.run_data import prepare_run_data, without_a_held_out_set
from pipeline.data import tokenizer as tokenizers  # called through the module: tests replace load_tokenizer
from pipeline.errors import guarded


def accounting_line(report: dict[str, Any], ids_shown: int = 3) -> str:
    """Rows in, kept, dropped by reason (with the first ids), for the console of `grpo train` and `grpo data`.

    >>> accounting_line({"rows_in": 40, "rows_kept": 29, "rows_rejected_total": 11, "rows_unused_max_samples": 0,
    ...                  "rows_rejected": {"prompt_too_long": {"count": 10, "ids": ["train-3", "train-5"]},
    ...                                    "unscorable_answer": {"count": 1, "ids": ["train-9"]}}})
    '40 rows in, 29 kept, 11 dropped: prompt_too_long 10 (train-3, train-5, ...), unscorable_answer 1 (train-9)'
    """
    line = f"{report['rows_in']} rows in, {report['rows_kept']} kept, {report['rows_rejected_total']} dropped"
    reasons = [f"{reason} {info['count']} ({', '.join(info['ids'][:ids_shown])}"
               f"{', ...' if info['count'] > ids_shown else ''})" for reason, info in report["rows_rejected"].items()]
    if reasons:
        line += ": " + ", ".join(reasons)
    if report.get("rows_unused_max_samples"):
        line += f"; {report['rows_unused_max_samples']} unused (max_samples)"
    kept = (report.get("unscorable_kept") or {}).get("count")
    if kept:
        line += f"; {kept} unscorable answers kept (keep_unscorable)"
    return line


def prompt_line(report: dict[str, Any]) -> str:
    """Which prompt format the data is in and what happened to system_prompt (docs/own-data.md, "Prompts").

    >>> prompt_line({"prompt_format": {"source": "prompt", "standard": 0, "conversational": 5,
    ...              "system_prompt": {"added": 2, "own_kept": 3, "standard_as_written": 0}}, "columns": ["solution"]})
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
    columns = report.get("columns")
    return line + (f"; columns to the rewards: {', '.join(columns)}" if columns else "")


def format_report(report: dict[str, Any]) -> Any:
    """The report as a rich renderable (tables), for people; `--json` prints the dict itself."""
    from rich.console import Group
    from rich.table import Table

    source = report.get("source", {})
    where = source.get("path") or f"{source.get('name')} ({source.get('config')})"
    rows = Table(title="Rows", show_header=False, title_justify="left")
    rows.add_column("item")
    rows.add_column("value", justify="right")
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
    lengths = Table(title="Prompt tokens (chat template + generation prompt)", title_justify="left")
    for name in ("count", "min", "p50", "p90", "p99", "max", "max_kept"):
        lengths.add_column(name, justify="right")
    lengths.add_row(*(str(tokens.get(name, "-")) for name in ("count", "min", "p50", "p90", "p99", "max", "max_kept")))

    limits = report["limits"]
    settings = Table(title="Limits and cache", show_header=False, title_justify="left")
    settings.add_column("item")
    settings.add_column("value", justify="right")
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


DATA_HELP_EPILOG = """\
Any field of `grpo train --help` works as --key value and overrides the recipe. Without --config,
`grpo data` prepares what `grpo train` would: the default GPU recipe on a GPU machine, the built-in
tiny CPU demo elsewhere (offline). Names that need no network:
  --dataset_name sample | demo-arithmetic      the bundled GSM8K sample, the demo's arithmetic
  --model_name_or_path bundled:qwen2.5         the real Qwen2.5 tokenizer (bundled; no model, no download)
e.g. grpo data --config configs/qwen2.5-1.5b-gsm8k.yaml --dataset_name sample --model_name_or_path bundled:qwen2.5

Exit status: 0 ok, 1 data error (strict / overlong_policy=error / no rows), 2 config, path or data file error
(a mostly unscorable answer column, or a hub dataset that cannot be downloaded, included). Sources, eval set,
answers: docs/own-data.md."""


def data_help_parser():
    """`grpo data`'s own parser, for --help: its two options; config fields are parsed by TrlParser."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="grpo data", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=DATA_HELP_EPILOG,
        description="Prepare the training data and print its length/rejection report "
                    "(loads the tokenizer only, never a model); writes data_report.json into output_dir.")
    parser.add_argument("--config", metavar="YAML", help="a YAML recipe, as for `grpo train`")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


@guarded("data")
def main(argv: Optional[list[str]] = None) -> int:
    """`grpo data [--config X] [--json] [--key value ...]`: prepare the dataset and print its report.

    Loads only the tokenizer (never a model). Writes data_report.json into output_dir.
    Exit status: 0 ok, 1 data error (strict / overlong_policy=error / no rows), 2 config error or an unreadable
    data file (empty, not UTF-8, broken JSON).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        data_help_parser().print_help()
        return 0
    as_json = "--json" in argv
    argv = [arg for arg in argv if arg != "--json"]  # our flag, not a config field: TrlParser would reject it
    # The same defaults as `grpo train`: offline (the CPU demo) on a machine without a GPU. Bad input raises
    # (ConfigError, PathError, DataFileError): pipeline.errors prints its one message, exit 2.
    argv, base, note = defaults_for(argv, backend_choice(argv))
    if note and not as_json:
        print(f"grpo data: {note.replace('running', 'preparing the data of')}", file=sys.stderr)
    report: Optional[dict[str, Any]] = None
    eval_count: Optional[int] = None
    error: Optional[Exception] = None
    cfg, eval_note = without_a_held_out_set(parse_config(argv, base=base))  # as `grpo train` does
    if eval_note and not as_json:
        print(f"grpo data: {eval_note}", file=sys.stderr)
    validate(cfg)
    # env.path_check's table, before any work
    config_paths(cfg, "output_dir", "data_cache_dir", "dataset_name", "eval_dataset_name")
    # only the tokenizer loads, from there
    model_check.check_model(cfg.model.model_name_or_path, cfg.model.model_source)
    tokenizer = tokenizers.load_tokenizer(cfg.model.model_name_or_path, trust_remote_code=cfg.model.trust_remote_code,
                                          source=cfg.model.model_source)
    try:
        run_data = prepare_run_data(cfg, tokenizer)  # what `grpo train` prepares: train, eval set, warm-up needs
        report = run_data.train.report
        eval_count = len(run_data.eval_rows) if cfg.eval.uses_eval_set() else None
    except DataError as err:  # the data cannot be used as configured: the report says why, exit 1
        report, error = err.report, err

    if as_json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        from rich.console import Console

        Console().print(format_report(report))
        print(f"[grpo] data: {accounting_line(report)}")
        if line := prompt_line(report):
            print(f"[grpo] prompts: {line}")
        if eval_count is not None:
            print(f"[grpo] eval set: {eval_count} problems (report: {Path(report['report_path']).parent / EVAL_REPORT_NAME})")
    if error is not None:
        print(f"grpo data: {error}", file=sys.stderr)
        return 1
    return 0
