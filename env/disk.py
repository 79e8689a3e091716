"""A storage failure while saving: recognise it by what it is, however it surfaces, and say where, why and
what next.

The same full disk reaches us in many shapes: `OSError(ENOSPC)` from a plain write, torch.save's
`RuntimeError("[enforce fail at inline_container.cc:...] PytorchStreamWriter failed writing file ...")`,
safetensors' own `SafetensorError("Error while serializing: I/O error: No space left on device (os error
28)")` (an Exception, neither OSError nor RuntimeError), or any of them wrapped by a library as the
`__cause__` / `__context__` of another exception. `storage_problem` is the one classifier: it walks the chain
and reads errnos, then the errno numbers and texts that wrapping libraries put in their messages, whatever
the exception class. `storage_errors_named` turns such a failure into one `StorageError` (exit 2 at the
command line) and lets every other exception through unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, Optional

# errno -> what it means for a save; each needs a different fix.
STORAGE_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EIO: "the disk reported an I/O error",
    errno.EFBIG: "the file is larger than this file system allows",
}
# Texts libraries put in their own exceptions instead of an errno. torch's stream writer says only that the
# write failed; a failed write of a model file is almost always a full disk, and free space is reported.
_MESSAGE_MARKERS = (
    ("No space left on device", errno.ENOSPC),
    ("Disk quota exceeded", errno.EDQUOT),
    ("Read-only file system", errno.EROFS),
    ("Input/output error", errno.EIO),
    ("PytorchStreamWriter failed writing file", errno.ENOSPC),
    ("file write failed", errno.ENOSPC),
)
# "(os error 28)" (Rust's std::io::Error, so safetensors) and "[Errno 28]" (Python's OSError text, re-wrapped).
_ERRNO_IN_TEXT = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")


def storage_errno(err: Optional[BaseException]) -> Optional[int]:
    """The storage errno behind `err` (one of STORAGE_ERRNOS), or None when `err` is no storage failure.

    >>> storage_errno(RuntimeError("wrapped")) is None
    True
    >>> storage_errno(Exception("Error while serializing: I/O error: No space left on device (os error 28)"))
    28
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS:
            return err.errno
        text = str(err)
        for match in _ERRNO_IN_TEXT.finditer(text):
            number = int(match.group(1) or match.group(2))
            if number in STORAGE_ERRNOS:
                return number
        for marker, number in _MESSAGE_MARKERS:
            if marker in text:
                return number
        err = err.__cause__ or err.__context__
    return None


def storage_problem(err: Optional[BaseException]) -> Optional[str]:
    """What went wrong with the storage behind `err` in words ("the disk is full"), or None."""
    number = storage_errno(err)
    return STORAGE_ERRNOS[number] if number is not None else None


class StorageError(OSError):
    """A save failed because of the storage (full, over quota, read-only, I/O error). The message says where,
    why, the free space there and roughly what one save needs, and what next."""

    def __init__(self, where: str | os.PathLike[str], err_number: int, needed_bytes: Optional[int],
                 resume_hint: str):
        folder = Path(where)
        probe = folder
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            free: Optional[int] = shutil.disk_usage(probe).free
        except OSError:
            free = None
        self.where, self.needed_bytes, self.free_bytes = folder, needed_bytes, free
        fix = {errno.EROFS: "point output_dir at a writable folder",
               errno.EIO: "check the disk (dmesg) or point output_dir at another disk"}.get(
            err_number, "free space there or point output_dir at a larger disk")
        space = f"{_size(free)} free on that disk" if free is not None else "free space unknown"
        if needed_bytes:
            space += f"; one save needs about {_size(needed_bytes)}"
        super().__init__(err_number, f"{STORAGE_ERRNOS[err_number]}: could not save in {folder} ({space}). "
                                     f"{fix[0].upper()}{fix[1:]}, then {resume_hint}")

    def __str__(self) -> str:
        return self.strerror


@contextlib.contextmanager
def storage_errors_named(where: str | os.PathLike[str], resume_hint: str,
                         needed_bytes: Optional[int] | Callable[[], int] = None) -> Iterator[None]:
    """Re-raise a storage failure inside the block, whatever its class, as one StorageError; others pass.
    `needed_bytes` may be a function, asked only when a failure is reported."""
    try:
        yield
    except StorageError:
        raise
    except Exception as err:  # classified by what it is, not by its class
        number = storage_errno(err)
        if number is None:
            raise
        needed = needed_bytes() if callable(needed_bytes) else needed_bytes
        raise StorageError(where, number, needed, resume_hint) from None


def _size(n_bytes: float) -> str:
    """
    >>> _size(3 * 2**30), _size(5 * 2**20)
    ('3.0 GiB', '5.0 MiB')
    """
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"
