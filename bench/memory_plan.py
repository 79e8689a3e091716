"""The memory planner (`grpo plan`) held against every published GRPO memory figure we can cite: Unsloth's per-part
table for Llama 3.1 8B at 20K context and its Qwen2.5-1.5B claims, verl's largest batch per Qwen2.5 size on one H100,
EasyR1's GRPO-LoRA hardware estimates.

    python bench/memory_plan.py

Each row: the published figure, its source, the planner's estimate for the same settings, and the error; the rows
marked `bounds` set the planner's printed uncertainty. The figures, their sources, the settings behind them (and
which we had to assume) and every GPU check report's measured peaks are tests/memory_plan_figures.py's, which
tests/test_plan.py holds within pipeline/plan/estimate.py's UNCERTAINTY; this script prints them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_pipeline.pipeline.plan.estimate import UNCERTAINTY  # noqa: E402
from tests.memory_plan_figures import comparisons, largest_bounding_error  # noqa: E402 - the tests own the figures


def _amount(value: float, unit: str) -> str:
    return f"{value:.0f} {unit}" if unit == "rows" else f"{value:.2f} {unit}"


def rows() -> list[dict[str, Any]]:
    """bench/run_all.py's protocol."""
    out = []
    for row in comparisons():
        out.append({"figure": f"plan vs published: {row['figure']}",
                    "value": f"{_amount(row['estimate'], row['unit'])} vs {_amount(row['published'], row['unit'])} "
                             f"({row['error']:+.0%})",
                    "target": f"within ±{UNCERTAINTY:.0%}" if row["bounds"] else "- (not comparable: see the bench)",
                    "holds": abs(row["error"]) <= UNCERTAINTY if row["bounds"] else None,
                    "samples": row["source"]})
    return out


def main(argv: Sequence[str] = ()) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="grpo plan's estimate against every published figure and measured peak, with sources.",
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(list(argv))
    found = comparisons()
    for row in found:
        label = row.get("label", "published")
        print(f"{row['figure']}\n  {label} {_amount(row['published'], row['unit'])}, planner "
              f"{_amount(row['estimate'], row['unit'])}, error {row['error']:+.0%}  [{row['source']}]")
        if not row["bounds"]:
            print(f"  (not used for the uncertainty: {row['why_not_bound']})")
    worst = largest_bounding_error(found)
    print(f"\nlargest error of the comparable rows: {worst:.0%}; the planner prints ±{UNCERTAINTY:.0%} "
          f"({'covers it' if UNCERTAINTY >= worst else 'TOO SMALL: raise UNCERTAINTY'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
