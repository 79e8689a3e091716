"""A full disk while saving: recognise it however it surfaces, and say where, how much and what next."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# torch.save reports a full disk as RuntimeError("[enforce fail at inline_container.cc:...] ... file write
# failed"), safetensors and plain writes as OSError(ENOSPC); both mean the same thing to a user.
_DISK_FULL_MARKERS = ("No space left on device", "file write failed", "inline_container.cc")


def is_disk_full(err: BaseException) -> bool:
    """True for the ways a full disk surfaces while saving (also when wrapped by another exception)."""
    import errno

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(err, RuntimeError) and any(marker in str(err) for marker in _DISK_FULL_MARKERS):
            return True
        err = err.__cause__ or err.__context__
    return False


class DiskFullError(OSError):
    """The disk filled up while saving. The message says where, how much is free and roughly how much a save
    needs, and how to resume."""

    def __init__(self, where: str | os.PathLike[str], needed_bytes: int, resume_hint: str):
        folder = Path(where)
        probe = folder
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        self.where, self.needed_bytes, self.free_bytes = folder, needed_bytes, free
        super().__init__(
            f"the disk is full: could not save in {folder} ({_size(free)} free on that disk; one save needs about "
            f"{_size(needed_bytes)}, and save_total_limit checkpoints are kept). Free space there or point "
            f"output_dir at a larger disk, then {resume_hint}"
        )


def _size(n_bytes: float) -> str:
    """
    >>> _size(3 * 2**30), _size(5 * 2**20)
    ('3.0 GiB', '5.0 MiB')
    """
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"
