"""Signals: a Ctrl-C or SIGTERM during training finishes the step, saves and stops (GracefulStop); anywhere else it
raises KeyboardInterrupt through the atomic saves (interrupts_raise)."""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Optional

from grpo_pipeline.env.paths import shell_command
from grpo_pipeline.env.secret_fields import placeholder, secret_options
from grpo_pipeline.rewards.contract import SignalInterrupt


def _install(handler) -> dict[int, Any]:
    """SIGINT and SIGTERM handled by `handler`; returns the handlers replaced (none outside the main thread, where
    Python allows no handlers)."""
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread (e.g. inside a notebook worker)
            pass
    return previous


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


class GracefulStop:
    """SIGINT/SIGTERM during training (a context manager around `trainer.train()`, with `callback()` registered):
    the first signal asks the trainer to finish the step, save and stop; a second one raises at once, as
    `interrupts_raise` (which applies outside training) does."""

    def __init__(self) -> None:
        self.signal_name: Optional[str] = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 (signal handler signature)
        self.signal_name = signal.Signals(signum).name
        print(f"\n[grpo] {self.signal_name} received: finishing this step, saving a checkpoint, then stopping. "
              "Send it again to abort without saving.", flush=True)
        _restore(self._previous)

    def __enter__(self) -> "GracefulStop":
        self._previous = _install(self._handle)
        return self

    def __exit__(self, *exc) -> None:
        _restore(self._previous)
        self._previous = {}

    def callback(self):
        """A TrainerCallback that turns a received signal into save + stop at the end of the step."""
        from transformers import TrainerCallback  # lazy: transformers imports torch

        stopper = self

        class _StopOnSignal(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if stopper.signal_name is not None:
                    control.should_save = True
                    control.should_training_stop = True
                return control

        return _StopOnSignal()


def _raise_interrupt(signum, frame) -> None:  # (the signal handler signature)
    # A SignalInterrupt, not a bare KeyboardInterrupt: the reward boundary (rewards/contract.py) lets a real signal
    # through and turns a KeyboardInterrupt that user code raised into a named reward failure.
    raise SignalInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def interrupts_raise():
    """SIGTERM as well as SIGINT raise KeyboardInterrupt inside the block (SIGTERM's default would end the process
    on the spot, skipping every cleanup): it unwinds through the atomic saves to the command, which exits 130 with
    the resume command."""
    previous = _install(_raise_interrupt)
    try:
        yield
    finally:
        _restore(previous)


def resume_command(argv: list[str]) -> str:
    """The command that continues an interrupted `grpo train` run: the user's own options, shell-quoted, with
    `--resume auto` in place of any --resume; a secret option shown as its placeholder, to pass again.

    >>> resume_command(["--config", "my recipe.yaml", "--resume", "never"])
    "grpo train --config 'my recipe.yaml' --resume auto"
    >>> resume_command(["--hub_token", "hf_x"])
    "grpo train --hub_token '<HUB_TOKEN>' --resume auto (pass your hub_token again in place of <HUB_TOKEN>)"
    """
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True
        elif not arg.startswith("--resume="):
            kept.append(arg)
    again = "".join(f" (pass your {name} again in place of {placeholder(name)})" for name in secret_options(kept))
    return shell_command("grpo", "train", *kept, "--resume", "auto") + again
