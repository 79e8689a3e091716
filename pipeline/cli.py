"""`grpo` command line: one sub-command per stage of the pipeline.

    grpo env        check the installed versions against the known-good matrix
    grpo data       prepare the dataset and print its length/rejection report (tokenizer only)
    grpo plan       will the recipe fit this GPU (estimated peak memory, part by part), and what to change
    grpo rewards    reward dry run: sample and score a few prompts, say whether GRPO would learn (no training)
    grpo train      GRPO training (no GPU: the built-in tiny CPU demo)
    grpo generate   generate with a saved LoRA (or --base)
    grpo eval       accuracy / format / length / garbled rate on held-out problems
    grpo export     merge the LoRA (16-bit / 4-bit) or write GGUF

Start-up order, and why this module's own imports wait inside `main`: first a file of the user's that would hide
one of our packages is refused (`hidden_package`, before any module of ours imports env/ or rewards/); then
pipeline/bootstrap.py prepares the backend the command will use (Unsloth must be imported before trl,
transformers and peft); then the sub-command's module is imported, only when it runs, so `grpo --help` never
imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

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
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo",
        description="GRPO fine-tuning of Qwen2.5 on verifiable tasks (Unsloth + vLLM on GPU, plain TRL anywhere).",
        epilog="Run `grpo COMMAND --help` for a command's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        # add_help=False: the command's own parser answers `grpo COMMAND --help`.
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`grpo COMMAND ...`: the command under the one top-level handler (pipeline/errors.py): exit 2 and one
    message for bad input, 1 and one line (traceback in a log) for a bug, 130 for Ctrl-C; `--debug` anywhere
    prints tracebacks instead."""
    argv = list(sys.argv[1:] if argv is None else argv)
    problem = hidden_package()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2  # bad input (pipeline/errors.py EXIT_BAD_INPUT, not importable before this check)
    # lazy: only after the hidden-package check above (the handler imports env/ and the pipeline's packages)
    from grpo_pipeline.pipeline.errors import DEBUG_FLAG, run_command

    command_argv = [arg for arg in argv if arg != DEBUG_FLAG]
    parser = build_parser()
    if not command_argv or command_argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command = command_argv[0]
    if command not in COMMANDS:
        parser.error(f"unknown command {command!r}; choose one of {', '.join(COMMANDS)}")
    rest = argv[argv.index(command) + 1:] + ([DEBUG_FLAG] if DEBUG_FLAG in argv[:argv.index(command)] else [])
    return run_command(command, lambda args: _run(command, args), rest)


# This distribution's top-level packages besides `pipeline` (pyproject.toml packages.find).
OUR_PACKAGES = ("rewards", "env")


def hidden_package() -> str | None:
    """The message refusing a file of the user's that would hide one of our packages, or None: a `rewards.py` or
    `env.py` first on the import path (PYTHONPATH, or the working folder under `python -m grpo_pipeline.pipeline`) would be imported
    in place of ours and end the run in a traceback. Looked up without importing anything (importlib's
    find_spec). A reward module of that name in the working folder is fine under `grpo`:
    rewards/user_code.py loads it as the user's, apart from ours. A message, not an exception: the error handler
    itself imports those packages."""
    root = Path(__file__).resolve().parents[1]
    for name in OUR_PACKAGES:
        spec = importlib.util.find_spec(name)
        origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if origin is not None and root not in origin.parents:
            return (f"{origin} hides grpo-pipeline's own `{name}` package: it comes first on the import path "
                           "(PYTHONPATH, or the working folder with `python -m grpo_pipeline.pipeline`). Rename that file (or "
                           f"take its folder off PYTHONPATH); a reward module named {name}.py in the working "
                    "folder works under `grpo`, which loads it as yours.")
    return None


def _run(command: str, argv: list[str]) -> int:
    # lazy: the bootstrap imports Unsloth (on its backend) before any command module imports trl or transformers;
    # both come after the hidden-package check in `main`, as every import of env/ must
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
