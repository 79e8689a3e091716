"""`grpo data [--config X] [--json] [--key value ...]`: prepare the training data as `grpo train` would (the
tokenizer only, never a model: pipeline/data/run_data.py) and print its length/rejection report as rich tables or
JSON, with `grpo train`'s default config and DATA_HELP_EPILOG's exit codes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from rich.console import Console

from grpo_pipeline.env.secret_fields import masked
from grpo_pipeline.pipeline.bootstrap import backend_choice, defaults_for
from grpo_pipeline.pipeline.config import parse_config, validate
from grpo_pipeline.pipeline.config.paths import config_paths
from grpo_pipeline.pipeline.data import model_check
from grpo_pipeline.pipeline.data import tokenizer as tokenizers  # called through the module: tests replace load_tokenizer
from grpo_pipeline.pipeline.data.prepare import EVAL_REPORT_NAME, DataError
from grpo_pipeline.pipeline.data.report import accounting_line, format_report, prompt_line
from grpo_pipeline.pipeline.data.run_data import prepare_run_data, without_a_held_out_set
from grpo_pipeline.pipeline.errors import EXIT_BAD_INPUT, guarded

DATA_HELP_EPILOG = """\
Any field of `grpo train --help` works as --key value and overrides the recipe. Without --config,
`grpo data` prepares what `grpo train` would: the default GPU recipe on a GPU machine, the built-in
tiny CPU demo elsewhere (offline). Names that need no network:
  --dataset_name sample | demo-arithmetic      the bundled GSM8K sample, the demo's arithmetic
  --model_name_or_path bundled:qwen2.5         the real Qwen2.5 tokenizer (bundled; no model, no download)
e.g. grpo data --config configs/qwen2.5-1.5b-gsm8k.yaml --dataset_name sample --model_name_or_path bundled:qwen2.5

Exit status: 0 ok; 2 the data cannot be used as configured (strict / overlong_policy=error / no rows left: the
report is printed first), a config, path or data file error (a mostly unscorable answer column, or a hub dataset
that cannot be downloaded, included), as `grpo train` exits on the same data; 1 only for a bug. Sources, eval set,
answers: docs/own-data.md."""


@guarded("data")
def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):  # its two options; config fields are parsed by TrlParser
        parser = argparse.ArgumentParser(
            prog="grpo data", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=DATA_HELP_EPILOG,
            description="Prepare the training data and print its length/rejection report "
                        "(loads the tokenizer only, never a model); writes data_report.json into output_dir.")
        parser.add_argument("--config", metavar="YAML", help="a YAML recipe, as for `grpo train`")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.print_help()
        return 0
    as_json = "--json" in argv
    argv = [arg for arg in argv if arg != "--json"]  # our flag, not a config field: TrlParser would reject it
    argv, base, note = defaults_for(argv, backend_choice(argv))
    if note and not as_json:
        print(f"grpo data: {note.replace('running', 'preparing the data of')}", file=sys.stderr)
    cfg = parse_config(argv, base=base)
    eval_off, eval_note = without_a_held_out_set(cfg)  # as `grpo train` does
    cfg = cfg.replace(**eval_off) if eval_off else cfg
    if eval_note and not as_json:
        print(f"grpo data: {eval_note}", file=sys.stderr)
    validate(cfg, run_user_code=False)  # `grpo data` calls no reward: none is imported
    config_paths(cfg.to_dict(), "output_dir", "data_cache_dir", "dataset_name", "eval_dataset_name")
    model_check.check_model(cfg.model.model_name_or_path, cfg.model.model_source)
    tokenizer = tokenizers.load_tokenizer(cfg.model.model_name_or_path, trust_remote_code=cfg.model.trust_remote_code,
                                          source=cfg.model.model_source)
    try:
        run_data = prepare_run_data(cfg, tokenizer)  # what `grpo train` prepares: train, eval set, warm-up needs
        report, error = run_data.train.report, None
        eval_line = run_data.eval_rows.line() if cfg.eval.uses_eval_set() else None
    except DataError as err:  # the data cannot be used as configured: the report says why, exit 2 (bad input)
        report, error, eval_line = err.report, err, None

    if as_json:
        print(json.dumps(masked(report), indent=2, ensure_ascii=False))  # no secret printed (a URL's password)
    else:
        Console().print(format_report(report))
        print(f"[grpo] data: {accounting_line(report)}")
        if line := prompt_line(report):
            print(f"[grpo] prompts: {line}")
        if eval_line is not None:
            eval_report = Path(report["report_path"]).parent / EVAL_REPORT_NAME
            print(f"[grpo] {eval_line} (report: {eval_report})")
    if error is not None:
        print(f"grpo data: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0
