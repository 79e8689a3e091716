"""`grpo train --help`: every option by section (ours, then TRL's own), with --config and --check listed and
the defaults that apply on this machine shown (the recipe over the built-in model's defaults)."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from grpo_pipeline.pipeline.bootstrap import backend_choice, defaults_for
from grpo_pipeline.pipeline.config import SECTIONS, ConfigError
from grpo_pipeline.pipeline.config.trl_fields import trl_section

DESCRIPTION = "`grpo train`: the one training script."  # pipeline/train.py's first line


def print_help(argv: list[str]) -> int:
    """`grpo train --help`, with --config listed and the defaults that apply on this machine shown."""
    from trl import TrlParser  # lazy: trl imports torch; the help lists the installed trl's own fields

    try:
        choice = backend_choice(argv)
        argv, base, _ = defaults_for([a for a in argv if a not in ("-h", "--help")], choice)
    except ConfigError:
        base, argv = None, []
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        recipe = Path(argv[argv.index("--config") + 1])
        source = f"the recipe {recipe}"
        try:  # the recipe over the defaults the run puts below it (a built-in model's own)
            base = {**(base or {}), **(yaml.safe_load(recipe.read_text(encoding="utf-8")) or {})}
        except (OSError, yaml.YAMLError):
            base, source = None, "the built-in field defaults (the recipe could not be read)"
    else:
        source = "the built-in tiny CPU demo (no GPU here and no --config)"
    # Ours by section, then every field of TRL's GRPOConfig/TrainingArguments no section of ours owns (derived
    # from the installed trl, pipeline/config/trl_fields.py), under TRL's names, types and defaults.
    parser = TrlParser((*SECTIONS, trl_section()), prog="grpo train", description=DESCRIPTION,
                       epilog=f"Defaults shown: {source}. Each option overrides the recipe's value.")
    parser.add_argument("--config", metavar="YAML",
                        help="a YAML recipe whose keys are the options below (e.g. configs/qwen2.5-3b-gsm8k.yaml); "
                             "without it: configs/qwen2.5-1.5b-gsm8k.yaml on a GPU, the tiny CPU demo elsewhere")
    parser.add_argument("--check", action="store_true",
                        help="run every check a run makes before loading the model (config, trl, output_dir, "
                             "packages, gpu, model, data, resume, rewards, lora), print them as JSON and stop: exit 0 "
                             "when all pass, 2 otherwise")
    for action in parser._actions:  # HfArgumentParser's --no_X flags would show their own store_false default
        if any(option.startswith("--no_") for option in action.option_strings):
            action.help, action.default = f"set {action.dest} to false", argparse.SUPPRESS
    if isinstance(base, dict):
        parser.set_defaults_with_config(**base)
    print(f"defaults shown below: {source}\n")
    parser.print_help()
    return 0
