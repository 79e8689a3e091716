"""Signals: a Ctrl-C or SIGTERM during training finishes the step, saves a checkpoint and stops (GracefulStop);
anywhere else it raises KeyboardInterrupt through the atomic saves (interrupts_raise), and the command prints
the command that continues the run (resume_command)."""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Optional

from grpo_pipeline.env.paths import shell_command
from grpo_pipeline.env.secret_fields import placeholder, secret_options
from grpo_pipeline.rewards.contract import SignalInterrupt


class GracefulStop:
    """SIGINT/SIGTERM during training: the first signal asks the trainer to finish the step, save and stop.

    A second signal restores the handlers of `interrupts_raise` (an impatient Ctrl-C still stops at once,
    as a KeyboardInterrupt). Use as a context manager around `trainer.train()`, with `callback()` registered
    on the trainer; outside training (data, warm-up, eval, saves) `interrupts_raise` applies.
    """

    def __init__(self) -> None:
        self.signal_name: Optional[str] = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 (signal handler signature)
        self.signal_name = signal.Signals(signum).name
        print(f"\n[grpo] {self.signal_name} received: finishing this step, saving a checkpoint, then stopping. "
              "Send it again to abort without saving.", flush=True)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __enter__(self) -> "GracefulStop":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. inside a notebook worker): no handler
                pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

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
    """SIGTERM as well as SIGINT raise KeyboardInterrupt inside the block (SIGTERM's default would end the
    process on the spot, skipping every cleanup). Whatever phase it lands in, the exception unwinds through
    the atomic saves (nothing half-written stays) to the command, which exits 130 with the resume command.
    A no-op outside the main thread, where Python allows no handlers."""
    previous = {}
    for sig, handler in ((signal.SIGINT, _raise_interrupt), (signal.SIGTERM, _raise_interrupt)):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def resume_command(argv: list[str]) -> str:
    """The command that continues an interrupted `grpo train` run: the user's own options, shell-quoted, with
    `--resume auto` in place of any --resume (a --resume never or a fixed checkpoint would start over or go back).
    A secret option given on the command line is shown as its placeholder (env/paths.py shell_command), and the
    line says to pass it again.

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
