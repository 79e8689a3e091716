"""Where files are: a path the user gave, made absolute the moment it is given (vLLM resolves a relative LoRA path
against the *engine process's* working directory, else takes it for a hub repo id: vllm#6231); the one cache root;
what a writer saw at a path when its command started (`snapshot`), re-checked when it publishes (env/paths.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

_UNEXPANDED_VAR = re.compile(r"\$(\w+|\{[^}]*\})")


def absolute_path(path: str | os.PathLike[str]) -> Path:
    """Expand `~` and `$VARS`, then make the path absolute against the current directory *now*. Symlinks are not
    resolved (a Colab Drive mount stays /content/drive/...), and `..` is collapsed lexically (`link/..` is the folder
    holding `link`). ValueError for an empty path or an unset variable (`$HOME_DIR/x` is a missing export).

    >>> import os; os.environ["GRPO_DOC_DIR"] = "/data"
    >>> str(absolute_path("$GRPO_DOC_DIR/runs/../lora"))
    '/data/lora'
    """
    raw = os.fspath(path)
    if not raw:
        raise ValueError("path is empty: pass a directory such as outputs/lora")
    expanded = os.path.expandvars(os.path.expanduser(raw))
    leftover = _UNEXPANDED_VAR.search(expanded)
    if leftover:
        raise ValueError(
            f"path {raw!r} uses environment variable {leftover.group(0)} which is not set: export it or write the "
            "path out"
        )
    return Path(os.path.abspath(expanded))


def cache_root() -> Path:
    """The project's one cache folder: $GRPO_CACHE_DIR, else $XDG_CACHE_HOME/grpo-pipeline, else
    ~/.cache/grpo-pipeline. Prepared datasets, the unpacked tokenizer and the built-in models live under it."""
    xdg = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return Path(os.environ.get("GRPO_CACHE_DIR") or os.path.join(xdg, "grpo-pipeline"))


_TREE_ENTRIES = 10_000  # a folder's identity covers this many entries below it (an export, a cache entry, an adapter)


def path_identity(path: str | os.PathLike[str]) -> Optional[tuple]:
    """What `path` is now: None when nothing is there, else (st_dev, st_ino, st_mtime_ns, st_size) of the entry
    itself (lstat) and, for a folder, a digest of the same for every entry below it (a file edited deep inside)."""
    try:
        top = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # NotADirectoryError: a parent is a file
        return None
    identity: tuple = (top.st_dev, top.st_ino, top.st_mtime_ns, top.st_size)
    if stat.S_ISDIR(top.st_mode):
        digest, count = hashlib.sha1(), 0
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files) + dirs:
                with contextlib.suppress(OSError):
                    entry = os.lstat(os.path.join(root, name))
                    digest.update(f"{os.path.relpath(os.path.join(root, name), path)}\0{entry.st_ino}\0"
                                  f"{entry.st_mtime_ns}\0{entry.st_size}\n".encode("utf-8", "surrogateescape"))
                count += 1
            if count >= _TREE_ENTRIES:
                dirs.clear()  # a huge folder: its first entries stand for it
        identity += (digest.hexdigest(),)
    return identity


@dataclass(frozen=True)
class Seen:
    """What a writer saw at `path` when its command started: publishing replaces only that. `option` names the
    setting that gave the path ("--out"), `fix` says how to go on when the path changed."""

    path: Path
    identity: Optional[tuple]
    option: str = ""
    fix: str = ""

    def label(self) -> str:
        return f"{self.option} {self.path}" if self.option else str(self.path)


def snapshot(path: str | os.PathLike[str], *, option: str = "", fix: str = "") -> Seen:
    """Record what is at `path` now, for a writer to hand to its publish step later.
    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.json"
    >>> seen = snapshot(target, option="--output")
    >>> seen.identity is None, seen.label().startswith("--output /")
    (True, True)
    """
    return Seen(absolute_path(path), path_identity(absolute_path(path)), option, fix)


class PathChangedError(Exception):
    """The path a command is about to publish to appeared, changed or went away since the command saw it: nothing
    there was replaced or deleted (exit 2)."""

    def __init__(self, seen: Seen, now: Optional[tuple]):
        self.seen, self.now = seen, now
        if seen.identity is None:
            what = "appeared after this command started (nothing was there when it was checked)"
        elif now is None:
            what = "was moved or deleted after this command started"
        else:
            what = "changed after this command started (another program or run wrote it)"
        fix = seen.fix or "Move it away or choose another path, then run the command again."
        super().__init__(f"{seen.label()} {what}: it was left as it is, and what this command wrote was not kept. "
                         f"{fix}")
