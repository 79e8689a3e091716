"""One `grpo train` per run folder: a lock on output_dir, and who holds it when a second run is refused.

Two runs writing into one folder interleave `metrics.jsonl` and overwrite each other's checkpoints and
adapter, and both report success. The lock is `filelock.FileLock` (a dependency of torch, transformers
and huggingface_hub, so always installed): on Linux and macOS it is an `fcntl.flock` on
`output_dir/.grpo-run.lock`, which the kernel drops when the holding process dies, however it dies. So a lock
left by a crashed or killed run never blocks the next one, with no pid guessing. Who holds it (pid, host, start
time) is written beside it in `.grpo-run.lock.json`, only to name the other run in the refusal; a leftover of
that file from a dead run is simply overwritten.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from grpo_pipeline.env.paths import atomic_write_json
from grpo_pipeline.pipeline.config import ConfigError

LOCK_NAME = ".grpo-run.lock"
HOLDER_NAME = ".grpo-run.lock.json"


class RunLocked(ConfigError):
    """Another live run holds output_dir."""

    def __init__(self, output_dir: Path, holder: dict) -> None:
        who = (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {holder.get('started', '?')}"
               if holder else "a process that has not written its details yet")
        super().__init__("output_dir", f"{output_dir} is in use by another `grpo train` run ({who}). Two runs in one "
                                       "folder would mix their metrics, checkpoints and adapter. Wait for it to "
                                       "finish, stop it, or pass a different --output_dir.")
        self.holder = holder


def read_holder(output_dir: Path) -> dict:
    try:
        holder = json.loads((output_dir / HOLDER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


@contextlib.contextmanager
def run_lock(output_dir: Path) -> Iterator[None]:
    """Hold output_dir for this process; raise RunLocked at once (no waiting) when a live run holds it."""
    output_dir.mkdir(parents=True, exist_ok=True)
    # thread_local=False: a notebook's training thread may release what its main thread took.
    lock = FileLock(str(output_dir / LOCK_NAME), timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        raise RunLocked(output_dir, read_holder(output_dir)) from None
    except NotImplementedError as err:  # older filelock on a file system without flock (some network mounts)
        print(f"[grpo] warning: cannot lock {output_dir} ({err}); make sure no other run writes into it", flush=True)
        yield
        return
    try:
        atomic_write_json(output_dir / HOLDER_NAME, {"pid": os.getpid(), "host": socket.gethostname(),
                                                     "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
        yield
    finally:
        with contextlib.suppress(OSError):
            (output_dir / HOLDER_NAME).unlink()
        lock.release()
