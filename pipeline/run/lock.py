"""One `grpo train` per run folder: a lock on output_dir, and who holds it when a second run is refused.

Two runs in one folder interleave metrics.jsonl and overwrite each other's checkpoints. The lock is filelock's
`fcntl.flock` on `output_dir/.grpo-run.lock`, which the kernel drops when the holder dies, however it dies: a
crashed run never blocks the next. Who holds it is written beside it (`.grpo-run.lock.json`) to name it in a refusal.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from grpo_pipeline.env.kept import read_record
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


@contextlib.contextmanager
def run_lock(output_dir: Path) -> Iterator[None]:
    """Hold output_dir for this process; raise RunLocked at once (no waiting) when a live run holds it."""
    output_dir.mkdir(parents=True, exist_ok=True)
    # thread_local=False: a notebook's training thread may release what its main thread took.
    lock = FileLock(str(output_dir / LOCK_NAME), timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        raise RunLocked(output_dir, read_record(output_dir / HOLDER_NAME) or {}) from None
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
