"""A storage failure while saving, recognised by what it is (`storage_errno`) and said where, why and what next.
A full disk reaches us as `OSError(ENOSPC)`, torch.save's `RuntimeError("... PytorchStreamWriter failed writing
file ...")`, safetensors' `SafetensorError("... (os error 28)")`, or any of them in another exception's chain.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

from grpo_pipeline.env.locations import cache_root
from grpo_pipeline.env.text import exception_chain

# errno -> what it means for a save; each needs a different fix.
STORAGE_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EIO: "the disk reported an I/O error",
    errno.EFBIG: "the file is larger than this file system allows",
}
# Not the disk itself, but as much a matter of where the file goes: counted only for an OSError that names its
# path (errno 13 in a library's text, an HTTP 403, a signal sent to another user's process are something else).
ACCESS_ERRNOS = {
    errno.EACCES: "permission is denied",
    errno.EPERM: "the operation is not permitted",
}
# Where a folder cannot be made at all, counted only for a path of the cache root (the folder itself, one on the
# way to it, or one inside it: `cache_place`): a HOME that is a file, a GRPO_CACHE_DIR under a missing mount. Any
# other path with these errnos is an input that is not there, named by the check of its own option.
PLACE_ERRNOS = {
    errno.ENOTDIR: "a file stands where a folder must be",
    errno.ENOENT: "a folder on the way cannot be made",
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
    """The storage errno behind `err`, or None when `err` is no storage failure.
    >>> storage_errno(RuntimeError("wrapped")) is None
    True
    >>> storage_errno(Exception("Error while serializing: I/O error: No space left on device (os error 28)"))
    28
    """
    for cause in exception_chain(err):
        if isinstance(cause, StorageError):
            return cause.errno
        if isinstance(cause, OSError) and (cause.errno in STORAGE_ERRNOS or
                                           (cause.errno in ACCESS_ERRNOS and cause.filename is not None) or
                                           (cause.errno in PLACE_ERRNOS and cache_place(cause.filename))):
            return cause.errno
        text = str(cause)
        for match in _ERRNO_IN_TEXT.finditer(text):
            number = int(match.group(1) or match.group(2))
            if number in STORAGE_ERRNOS:
                return number
        for marker, number in _MESSAGE_MARKERS:
            if marker in text:
                return number
    return None


PROBLEMS = {**STORAGE_ERRNOS, **ACCESS_ERRNOS, **PLACE_ERRNOS}
AGAIN = "run the same command again."
_FIXES = {
    errno.EROFS: "point {what} at a writable folder",
    errno.EIO: "check the disk (dmesg) or point {what} at another disk",
    errno.EACCES: "give this user write permission there or point {what} at a folder it can write",
    errno.EPERM: "give this user write permission there or point {what} at a folder it can write",
    errno.ENOTDIR: "point {what} at a folder that can be made (or move the file in the way)",
    errno.ENOENT: "point {what} at a folder that can be made",
}


class StorageError(Exception):
    """A write failed because of where it went; the message says where, why, the free space there (and roughly
    what one save needs), what to change and what next. Not an OSError on purpose: an `except OSError` meant for a
    missing or unreadable input must not catch it and blame that input."""

    def __init__(self, where: str | os.PathLike[str], err_number: int, needed_bytes: Optional[int] = None,
                 resume_hint: str = AGAIN, option: Optional[str] = "output_dir"):
        folder = Path(where)
        probe = folder
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            free: Optional[int] = shutil.disk_usage(probe).free
        except OSError:
            free = None
        self.errno, self.where, self.needed_bytes, self.free_bytes = err_number, folder, needed_bytes, free
        self.option, self.resume_hint = option, resume_hint
        setting = option or (f"GRPO_CACHE_DIR (the cache root, now {os.path.abspath(cache_root())})"
                             if cache_place(folder) else "the option that names it")
        fix = _FIXES.get(err_number, "free space there or point {what} at a larger disk").format(what=setting)
        space = f"{_size(free)} free on that disk" if free is not None else "free space unknown"
        if needed_bytes:
            space += f"; one save needs about {_size(needed_bytes)}"
        verb = "write or read" if err_number in ACCESS_ERRNOS else "save in"
        self.message = (f"{PROBLEMS[err_number]}: could not {verb} {folder} ({space}). {fix[0].upper()}{fix[1:]}, "
                        f"then {resume_hint}")
        super().__init__(self.message)


def cache_place(path: Any) -> bool:
    """Whether `path` is the cache root, inside it, or a folder on the way to it (a read-only or file HOME)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False
    root, place = os.path.abspath(cache_root()), os.path.abspath(os.fsdecode(path))
    on_the_way = place != os.sep and root.startswith(place + os.sep)
    return place == root or place.startswith(root + os.sep) or on_the_way


@contextlib.contextmanager
def storage_errors_named(where: str | os.PathLike[str], resume_hint: str = AGAIN,
                         needed_bytes: Optional[int] | Callable[[], int] = None,
                         option: Optional[str] = "output_dir") -> Iterator[None]:
    """Re-raise a storage failure inside the block as one StorageError; others pass. `needed_bytes` may be a
    function, asked only on failure. A StorageError from a writer inside keeps its place and setting."""
    try:
        yield
    except StorageError as err:
        if resume_hint == AGAIN or resume_hint == err.resume_hint:
            raise
        needed = (needed_bytes() if callable(needed_bytes) else needed_bytes) or err.needed_bytes
        raise StorageError(err.where, err.errno, needed, resume_hint, err.option) from err
    except Exception as err:  # classified by what it is, not by its class
        number = storage_errno(err)
        if number is None:
            raise
        needed = needed_bytes() if callable(needed_bytes) else needed_bytes
        raise StorageError(where, number, needed, resume_hint, option) from err


@contextlib.contextmanager
def storage_named(final: str | os.PathLike[str], option: str = "") -> Iterator[None]:
    """What env/paths.py's writers wrap their work in: a storage failure names `final` and the setting that chose it,
    not the hidden staging name beside it; one at a path of its own elsewhere is named as it is."""
    final = Path(final)
    try:
        yield
    except StorageError:
        raise
    except Exception as err:  # classified by what it is, not by its class
        failure = storage_failure(err)
        if failure is None:
            raise
        where = failure.where
        staged = where == Path.cwd() or any(part.startswith(f".{final.name}.") for part in where.parts)
        if staged or where == final or final in where.parents:
            raise StorageError(final, failure.errno, None, AGAIN, option or None) from err
        raise failure from err


def storage_failure(err: BaseException, run_folder: Optional[Path] = None) -> Optional[StorageError]:
    """`err` as a StorageError (the classifier at the command boundary, pipeline/errors.py run_command) naming the
    failed path (the first OSError filename in its chain, else `run_folder`, else the working folder) and, in the
    `run_folder`, output_dir; None when `err` is no storage failure."""
    def in_run(path: Path) -> bool:
        return run_folder is not None and (path == run_folder or Path(run_folder) in path.parents)

    if isinstance(err, StorageError):
        if err.option is None and in_run(err.where):
            return StorageError(err.where, err.errno, err.needed_bytes, err.resume_hint, "output_dir")
        return err
    number = storage_errno(err)
    if number is None:
        return None
    path: Optional[Path] = None
    for cause in exception_chain(err):
        name = getattr(cause, "filename", None) if isinstance(cause, OSError) else None
        if isinstance(name, (str, bytes, os.PathLike)):
            path = Path(os.fsdecode(name))
            break
    where = path or run_folder or Path.cwd()
    return StorageError(where, number, None, AGAIN, "output_dir" if in_run(where) else None)


def _size(n_bytes: float) -> str:
    """
    >>> _size(3 * 2**30), _size(5 * 2**20), _size(48 * 2**10)
    ('3.0 GiB', '5.0 MiB', '48 KiB')
    """
    if n_bytes >= 2**30:
        return f"{n_bytes / 2**30:.1f} GiB"
    return f"{n_bytes / 2**20:.1f} MiB" if n_bytes >= 2**20 else f"{n_bytes / 2**10:.0f} KiB"
