"""The one top-level handler of every `grpo` command (`run_command`; `guarded` wraps each command's `main` too, so a
Python call behaves as `grpo COMMAND`; the inner one answers). A user error (`user_errors()`), a storage failure
anywhere (env/disk.py, by errno) and a fault of the environment (env/faults.py) print one message, exit 2; Ctrl-C
outside training exits 130 with one line; anything else is a bug: one line, exit 1, its traceback in
`<run folder>/logs/` (`note_run_folder`), else `<cache root>/logs/`, or printed with `--debug` (GRPO_DEBUG=1).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from grpo_pipeline.env.adapters import AdapterError
from grpo_pipeline.env.disk import StorageError, storage_failure
from grpo_pipeline.env.faults import environment_fault
from grpo_pipeline.env.imports import mismatched_torch_companion
from grpo_pipeline.env.locations import PathChangedError, cache_root
from grpo_pipeline.env.matrix import MatrixError
from grpo_pipeline.env.path_check import PathError
from grpo_pipeline.env.paths import atomic_write_text, shell_command
from grpo_pipeline.env.secret_fields import remember_argv
from grpo_pipeline.env.text import printable, say, shorten
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.config.fields import field_names
from grpo_pipeline.pipeline.config.trl_fields import trl_option_names
from grpo_pipeline.pipeline.data.prepare import DataError
from grpo_pipeline.pipeline.data.source_spec import DataFileError
from grpo_pipeline.pipeline.run.manifest import ManifestError
from grpo_pipeline.rewards.contract import RewardFailure

EXIT_BAD_INPUT, EXIT_BUG, EXIT_INTERRUPTED = 2, 1, 130
DEBUG_FLAG = "--debug"
MAX_MESSAGE_CHARS = 4000  # the longest user-error message printed; the fix at its end is kept

_run_folder: Optional[Path] = None
# The --options of the command now running (note_command_options), and whether it takes the config's fields too.
_options: Optional[tuple[frozenset[str], bool]] = None
_OPTION = re.compile(r"(?<![\w-])--([A-Za-z][\w-]*)(?: ([^\s,;)]+?))?(?=[.:]?(?:\s|$|[,;)]))")
_PROSE = frozenset({"and", "or", "to", "the", "a", "is", "with", "instead", "for", "in", "on", "as", "if", "then",
                    "when", "which", "that", "it", "yourself", "first", "again"})
_debug = False  # set while a command given --debug runs, so the handler of a nested command main sees it
_depth = 0  # handlers now running: the outermost one starts with no run folder known


def user_errors() -> tuple[type[BaseException], ...]:
    """Every exception that means "your input cannot work" (exit 2), in one place."""
    return (ConfigError, PathError, DataFileError, AdapterError, ManifestError, StorageError, MatrixError,
            PathChangedError, DataError, RewardFailure)  # a reward's or agent code's (trainer/agent_boundary.py)


def note_command_options(parser: Any, config_fields: bool = False) -> None:
    """The options of the command now running (and with `config_fields` every config field), which the messages it
    prints suggest (`fit_to_command`)."""
    global _options
    _options = (frozenset(o for action in parser._actions for o in action.option_strings), config_fields)


def fit_to_command(message: str, options: Optional[tuple[frozenset[str], bool]] = None) -> str:
    """`message` with every `--name` the command does not take said as the recipe field (`name: value`): a shared
    layer's message must not send `grpo eval` users to an option only `grpo train` has.

    >>> fit_to_command("Set it (e.g. --eval_answer_field answer) or pass --limit 5.",
    ...                (frozenset({"--limit", "--config"}), False))
    'Set it (e.g. `eval_answer_field: answer`) or pass --limit 5. (This command takes the fields in `backquotes` \
from the recipe you pass as --config.)'
    """
    options = options if options is not None else _options
    if options is None:
        return message
    own, config_fields = options

    def said(match: re.Match) -> str:
        name, value = match[1], match[2]
        # a field of `grpo train`'s config: ours, or trl.GRPOConfig's (looked up only for a name that is not ours)
        if f"--{name}" in own or (config_fields and (name in field_names() or name in trl_option_names())):
            return match[0]
        if value and value.lower() not in _PROSE:
            return f"`{name}: {value}`"
        return f"`{name}`" + (f" {value}" if value else "")

    fitted = _OPTION.sub(said, message)
    if fitted == message:
        return message
    where = "the recipe you pass as --config" if "--config" in own else "the training recipe"
    return f"{fitted} (This command takes the fields in `backquotes` from {where}.)"


def note_run_folder(folder: Optional[Path]) -> None:
    """The run folder of the command now running: a crash log goes to its logs/."""
    global _run_folder
    _run_folder = Path(folder) if folder is not None else None


def _crash_log(command: str, argv: list[str], err: BaseException) -> Optional[Path]:
    """Write the traceback to a log file, secrets masked (env/text.py printable); None when no place takes it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    text = (f"command: {shell_command('grpo', command, *argv)}\ncwd: {printable(os.getcwd())}\ntime: {stamp}\n"
            f"python: {sys.version.split()[0]}\n\n" + _traceback_text(err))
    for folder in ([_run_folder / "logs"] if _run_folder is not None else []) + [cache_root() / "logs"]:
        try:
            # atomically: a full disk leaves no half log; it goes to the next place
            return atomic_write_text(folder / f"grpo-{command}-{stamp}-{os.getpid()}.log", printable(text))
        except Exception:  # noqa: BLE001 - any place that does not take it (full, read-only, a file): the next one
            continue
    return None


def _traceback_text(err: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(type(err), err, err.__traceback__))
    except Exception:  # noqa: BLE001 - an exception whose own rendering fails still gets its type named
        return f"{type(err).__name__} (its traceback could not be rendered)\n"


def report_bug(command: str, argv: list[str], err: BaseException, debug: bool) -> int:
    try:
        where = None if debug else _crash_log(command, argv, err)
    except Exception:  # noqa: BLE001 - the handler itself never fails: the traceback is printed instead
        where = None
    if where is None:
        say(_traceback_text(err))
    summary = shorten(printable(f"{type(err).__name__}: {printable(err)}").splitlines()[0], 300)
    place = (f"The traceback is in {shell_command(where)}; rerun with {DEBUG_FLAG} to print it" if where else
             "The traceback is above")
    say(f"error: `grpo {command}` stopped on an internal error, a bug in grpo-pipeline, not in your input "
        f"({summary}). {place}. Please report it with that traceback.")
    return EXIT_BUG


def run_command(command: str, call: Callable[[list[str]], Optional[int]], argv: list[str]) -> int:
    """Run `call(argv)` (a command's main) under the one handler; returns the exit status."""
    global _debug, _depth, _options
    # what the streams' encoding cannot take (a non-UTF-8 file name, text under an ASCII locale) as escapes, not raising
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # not a text stream of io's (a notebook's), or closed
            continue
    remember_argv(argv)  # a secret option's value, masked in whatever this command prints or logs
    outer, debug = _debug, _debug or DEBUG_FLAG in argv or os.environ.get("GRPO_DEBUG", "").strip().lower() in (
        "1", "true", "yes", "on")
    argv = [arg for arg in argv if arg != DEBUG_FLAG]
    if _depth == 0:
        note_run_folder(None)  # a previous command's (in the same Python process) is not this one's
        _options = None
    _debug, _depth = debug, _depth + 1
    try:
        return int(call(argv) or 0)
    except SystemExit:
        raise  # argparse's --help (0) and usage errors (2), already printed
    except KeyboardInterrupt as stop:  # SIGTERM too (grpo_pipeline.pipeline.run.stop.interrupts_raise)
        print(f"\ninterrupted: `grpo {command}` stopped ({stop or 'SIGINT'}); nothing half-written was kept.",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except user_errors() as err:
        if debug:
            say(_traceback_text(err))
        if isinstance(err, StorageError):  # a writer's: in the run folder, the setting to change is output_dir
            err = storage_failure(err, _run_folder)
        # bounded whatever a message embeds (each quotes values through env/text.py excerpt; this is the backstop)
        say(f"error: {shorten(fit_to_command(printable(err)), MAX_MESSAGE_CHARS)}")
        return EXIT_BAD_INPUT
    except Exception as err:  # noqa: BLE001 - the last guard: a bug gets one line and a log, not a traceback
        # a full / read-only place, an install to fix, a fault of the machine or another process: not a bug of ours
        try:
            problem = storage_failure(err, _run_folder) or mismatched_torch_companion(err) or environment_fault(err)
        except Exception:  # noqa: BLE001 - an exception the classifiers cannot read is reported as a bug, not raised
            problem = None
        if problem is None:
            return report_bug(command, argv, err, debug)
        if debug:
            say(_traceback_text(err))
        say(f"error: {problem}")
        return EXIT_BAD_INPUT
    finally:
        _debug, _depth = outer, _depth - 1


def guarded(command: str) -> Callable[[Callable[[list[str]], Optional[int]]], Callable[..., int]]:
    """Decorate a command's `main(argv)` with `run_command`, so a Python caller gets the same exit statuses."""

    def wrap(main: Callable[[list[str]], Optional[int]]) -> Callable[..., int]:
        @functools.wraps(main)
        def wrapper(argv: Optional[list[str]] = None) -> int:
            return run_command(command, main, list(sys.argv[1:] if argv is None else argv))

        return wrapper

    return wrap
