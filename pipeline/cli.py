"""`grpo` command line: one sub-command per stage of the pipeline (`COMMANDS`). Its imports wait inside `main`:
pipeline/bootstrap.py prepares the backend first (Unsloth before trl, transformers and peft), then the
sub-command's module is imported, so `grpo --help` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, help). Every module exposes `main(argv: list[str]) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "env": ("grpo_pipeline.env.doctor", "report Python/GPU/package versions vs the known-good matrix, and the pip fix"),
    "data": ("grpo_pipeline.pipeline.data_command", "prepare the dataset and print its report (loads only the tokenizer)"),
    "plan": ("grpo_pipeline.pipeline.plan.command", "estimate a recipe's peak GPU memory: fits this card? what to change?"),
    "rewards": ("grpo_pipeline.pipeline.infer.dry_run", "reward dry run: sample and score a few training prompts with the "
                                          "recipe's model and rewards, and say whether GRPO would have a signal"),
    "train": ("grpo_pipeline.pipeline.train", "run GRPO training (no GPU and no config: the built-in tiny CPU demo)"),
    "generate": ("grpo_pipeline.pipeline.infer.generate", "generate with a saved LoRA adapter (or --base for the base model)"),
    "eval": ("grpo_pipeline.pipeline.infer.evaluate", "evaluate a LoRA or the base model on held-out problems"),
    "export": ("grpo_pipeline.pipeline.infer.export", "export a LoRA as a merged 16-bit / 4-bit model or GGUF"),
    "plot": ("grpo_pipeline.pipeline.plot_command", "draw a run's plots from its metrics.jsonl (plots: false, or a run "
                                                   "still training)"),
}


def main(argv: list[str] | None = None) -> int:
    """`grpo COMMAND ...` under the one top-level handler (pipeline/errors.py); `--debug` prints tracebacks."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from grpo_pipeline.pipeline.errors import DEBUG_FLAG, run_command  # lazy: `grpo --help` stays fast

    command_argv = [arg for arg in argv if arg != DEBUG_FLAG]
    parser = argparse.ArgumentParser(
        prog="grpo",
        description="GRPO fine-tuning of Qwen2.5 on verifiable tasks (Unsloth + vLLM on GPU, plain TRL anywhere).",
        epilog="Run `grpo COMMAND --help` for a command's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        # add_help=False: the command's own parser answers `grpo COMMAND --help`.
        sub.add_parser(name, help=help_text, add_help=False)
    if not command_argv or command_argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command = command_argv[0]
    if command not in COMMANDS:
        parser.error(f"unknown command {command!r}; choose one of {', '.join(COMMANDS)}")
    rest = argv[argv.index(command) + 1:] + ([DEBUG_FLAG] if DEBUG_FLAG in argv[:argv.index(command)] else [])
    return run_command(command, lambda args: _run(command, args), rest)


def _run(command: str, argv: list[str]) -> int:
    # lazy: the bootstrap imports Unsloth (on its backend) before any command module imports trl or transformers;
    from grpo_pipeline.pipeline.bootstrap import bootstrap
    from grpo_pipeline.pipeline.run.nodes import leave_process_group
    from grpo_pipeline.pipeline.run.stop import interrupts_raise

    bootstrap(command, argv)  # a ConfigError here (e.g. VLLM_SLEEP_MODE with standby) is bad input: exit 2
    module_name, _ = COMMANDS[command]
    with interrupts_raise():  # SIGTERM as Ctrl-C: exit 130, no traceback (`grpo train` adds its resume command)
        module = importlib.import_module(module_name)
        try:
            return int(module.main(argv) or 0)
        finally:
            leave_process_group()  # a launched rank exits without aborting in gloo's threads


if __name__ == "__main__":
    raise SystemExit(main())
