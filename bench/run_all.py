"""Run every bench and print one table: each figure, its target, and whether it holds.

    python bench/run_all.py                      # every bench, a few minutes on 2 CPU cores
    python bench/run_all.py --only overhead data

The protocol a bench follows to appear here: its module, bench/<name>.py, has

    def rows() -> list[dict]:   # measured at a size that runs in about a minute on 2 cores
        return [{"figure": str, "value": str | number, "target": str,
                 "holds": True | False | None,   # None: a figure without a target (e.g. a sizing fit)
                 "samples": str}]                 # what the figure rests on, e.g. "48+48 steps"

Each bench runs in its own Python process (`run_all.py --rows-of NAME` prints its rows as JSON), so
one bench's threads, caches or crash never touch another's figures; a bench without `rows()` is a
failed row, not a silent gap.

GPU figures: the newest docs/gpu-reports/*.json (written by the GPU check on a GPU machine) adds
its rows when it has a top-level "bench_rows" list of {"figure", "value", "target", "holds"}.

Exit status: 0 when every bench ran (a target that does not hold is shown as NO, not an error),
1 when a bench crashed or printed nothing usable.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCHES = ("overhead", "rollout_probe", "scaling", "data", "reward_cases", "memory_plan", "vllm_cpu")
ROWS_MARKER = "@@bench-rows@@ "  # prefixes the one JSON line a child prints


def child_rows(name: str) -> int:
    """In the child process: import bench/<name>.py and print its rows() after the marker."""
    sys.path.insert(0, str(REPO_ROOT))
    module = importlib.import_module(f"bench.{name}")
    if not hasattr(module, "rows"):
        print(f"{ROWS_MARKER}null", flush=True)  # tells the parent to run the script and read its output
        return 0
    rows = module.rows()
    print(ROWS_MARKER + json.dumps(rows, default=str), flush=True)
    return 0


def run_child(args: list[str], timeout: float) -> tuple[int, str]:
    env_path = str(REPO_ROOT)
    import os

    env = {**os.environ, "PYTHONPATH": env_path + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        return 124, out + f"\n(timed out after {timeout:.0f} s)"
    return done.returncode, done.stdout + done.stderr


def bench_rows(name: str, timeout: float) -> tuple[list[dict], str | None]:
    """Rows of one bench, or ([], why) when it failed."""
    code, output = run_child([str(Path(__file__).resolve()), "--rows-of", name], timeout)
    lines = [line for line in output.splitlines() if line.startswith(ROWS_MARKER)]
    if code != 0 or not lines:
        return [], f"exit {code}:\n" + "\n".join(output.strip().splitlines()[-15:])
    payload = json.loads(lines[-1][len(ROWS_MARKER):])
    if payload is None:
        return [], "has no rows() (see the protocol above)"
    bad = [row for row in payload if not isinstance(row, dict) or not {"figure", "value", "target"} <= set(row)]
    if bad:
        return [], f"rows() returned rows without figure/value/target: {bad[:2]}"
    return payload, None


def gpu_report_rows(folder: Path) -> tuple[list[dict], str]:
    """Rows from the newest GPU check report, and a line saying which report (or that there is none)."""
    reports = sorted(folder.glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name))
    if not reports:
        shown = folder.relative_to(REPO_ROOT) if folder.is_relative_to(REPO_ROOT) else folder
        return [], f"no GPU report ({shown}/*.json): the GPU figures come from the GPU check on a GPU machine"
    newest = reports[-1]
    try:
        data = json.loads(newest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return [], f"GPU report {newest.name} is unreadable: {err}"
    rows = data.get("bench_rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return [], f"GPU report {newest.name} has no top-level \"bench_rows\" list"
    good = [{**row, "samples": row.get("samples", "")} for row in rows
            if isinstance(row, dict) and {"figure", "value", "target", "holds"} <= set(row)]
    skipped = len(rows) - len(good)
    note = f"GPU rows from {newest.name}" + (f" ({skipped} malformed rows left out)" if skipped else "")
    return good, note


def holds_text(holds) -> str:
    return {True: "yes", False: "NO", None: "-"}.get(holds, str(holds))


def print_table(table: list[tuple[str, dict]]) -> None:
    headers = ("bench", "figure", "value", "target", "holds", "samples")
    cells = [(source, str(row["figure"]), str(row["value"]), str(row["target"]), holds_text(row.get("holds")),
              str(row.get("samples", ""))) for source, row in table]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    print(line)
    print("-" * len(line))
    for c in cells:
        print("  ".join(x.ljust(w) for x, w in zip(c, widths)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=BENCHES, help="run these benches only")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per bench before it counts as failed")
    parser.add_argument("--gpu-reports", type=Path, default=REPO_ROOT / "docs" / "gpu-reports",
                        help="folder of GPU check reports (*.json); the newest adds its bench_rows")
    parser.add_argument("--rows-of", choices=BENCHES, help=argparse.SUPPRESS)  # the child process's mode
    args = parser.parse_args(argv)
    if args.rows_of:
        return child_rows(args.rows_of)

    table: list[tuple[str, dict]] = []
    failures: list[str] = []
    start = time.perf_counter()
    for name in args.only or BENCHES:
        bench_start = time.perf_counter()
        rows, error = bench_rows(name, args.timeout)
        took = time.perf_counter() - bench_start
        print(f"{name}: {'FAILED ' if error else ''}{took:.0f} s", flush=True)
        if error:
            failures.append(f"bench/{name}.py {error}")
        table.extend((name, row) for row in rows)
    gpu_rows, gpu_note = gpu_report_rows(args.gpu_reports)
    table.extend(("gpu", row) for row in gpu_rows)

    print()
    print_table(table)
    print(gpu_note)
    missed = sum(1 for _, row in table if row.get("holds") is False)
    print(f"{len(table)} figures, {missed} targets missed, {len(failures)} benches failed; "
          f"{time.perf_counter() - start:.0f} s in all")
    for failure in failures:
        print(f"\n{failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
