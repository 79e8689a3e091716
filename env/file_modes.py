"""What a write leaves on disk: synced (`fsync_path`), and with the usual permissions (`normalize_file_modes`:
safetensors writes its weights 0600).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file or directory; a no-op where directories cannot be opened (Windows)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process umask (read from /proc where possible: os.umask can only be read by setting it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def normalize_file_modes(directory: str | os.PathLike[str]) -> None:
    """Give every file under `directory` at least 0o666 minus the umask (safetensors writes its files 0600). Bits are
    only added, never removed (a umask of 077 keeps everything private)."""
    wanted = 0o666 & ~current_umask()
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):
                mode = os.lstat(path).st_mode
                if stat.S_ISREG(mode) and (mode & wanted) != wanted:
                    os.chmod(path, (mode & 0o7777) | wanted)
