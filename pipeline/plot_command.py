"""`grpo plot --run OUTPUT_DIR`: draw a run's plots/*.png from its metrics.jsonl, as the run itself draws them when it
ends: for a run trained with `plots: false`, one still training (what it has logged so far), or one copied from
another machine. The health thresholds and reward weights are the run's own, as its summary.json recorded them
(`plot_settings`); a run that has not written one yet is drawn with the defaults, and the command says so.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from grpo_pipeline.env.kept import read_record
from grpo_pipeline.env.path_check import PathError, check_command_paths
from grpo_pipeline.env.paths import shell_command
from grpo_pipeline.pipeline.errors import guarded, note_command_options
from grpo_pipeline.pipeline.run.plots import METRICS_FILE, PLOTS_DIR, plot_run, recorded_plot_settings


@guarded("plot")
def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="grpo plot", description="Draw a run's plots (OUTPUT_DIR/plots/*.png) from its metrics.jsonl, with the "
                                      "thresholds and reward weights its summary.json recorded.")
    parser.add_argument("--run", metavar="OUTPUT_DIR", required=True,
                        help="the run folder (the output_dir of `grpo train`)")
    note_command_options(parser)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    run = check_command_paths("plot", {"run": args.run})["run"]
    if not (run / METRICS_FILE).is_file():
        raise PathError("--run", f"{run} holds no {METRICS_FILE}: it is not a run folder, or its run has not logged a "
                               "step yet. Give the output_dir of a `grpo train` run.")
    settings = recorded_plot_settings((read_record(run / "summary.json") or {}).get("plot_settings"))
    if not settings:
        print("[grpo] plot: no plot settings in summary.json (a run still training, or one from an older version): "
              "the default health thresholds are drawn", file=sys.stderr)
    written = plot_run(run, **settings)
    print(f"[grpo] plot: {len(written)} plots in {shell_command(run / PLOTS_DIR)}" if written else
          f"[grpo] plot: nothing to draw: {run / METRICS_FILE} logs none of the plotted metrics yet")
    return 0
