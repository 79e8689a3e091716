"""Where files go and how they are written: absolute paths, and writes a crash cannot leave half done.

Why: vLLM resolves a relative LoRA path against the *engine process's* working directory and, when it
is not there, treats the string as a Hugging Face repo id (vllm#6231); Unsloth passes the path through
unchanged. A path made absolute at the moment the user gives it removes that whole class of bugs.
And a training run killed mid-save must never leave a half-written adapter under the final name, which
the next `load_lora` would happily read: every folder and state file is written under a hidden sibling
name and renamed into place. Checking that a folder holds a usable adapter is `env.adapters`; telling a
full disk apart from other save failures is `env.disk`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_UNEXPANDED_VAR = re.compile(r"\$(\w+|\{[^}]*\})")


def absolute_path(path: str | os.PathLike[str]) -> Path:
    """Expand `~` and `$VARS`, then make the path absolute against the current directory *now*.

    Symlinks are not resolved: the result names the path the user meant (a Colab Drive mount stays
    /content/drive/...), and vLLM only needs it to be absolute. `..` is collapsed lexically, as
    `os.path.abspath` does, so `link/..` means the folder holding `link`, not the target's parent.

    Raises:
        ValueError: the path is empty, or names an environment variable that is not set (a literal
            `$HOME_DIR/x` folder is almost always a missing export, not a real folder name).

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
            f"path {raw!r} uses environment variable {leftover.group(0)} which is not set: export it or write the path out"
        )
    return Path(os.path.abspath(expanded))


def shell_command(*words: str | os.PathLike[str]) -> str:
    """A command line to print for the user to paste: each word shell-quoted (paths with spaces, quotes, `$`).
    The one helper for every "next:", "resume with:" and "run this" line.

    >>> print(shell_command("grpo", "generate", "--lora", "/runs/my run/lora", "--prompt", "What is 2+2?"))
    grpo generate --lora '/runs/my run/lora' --prompt 'What is 2+2?'
    """
    import shlex

    return shlex.join(os.fspath(word) for word in words)


def cache_root() -> Path:
    """The project's one cache folder: $GRPO_CACHE_DIR, else $XDG_CACHE_HOME/grpo-pipeline, else
    ~/.cache/grpo-pipeline. Prepared datasets, the unpacked tokenizer and the built-in models live under it."""
    root = os.environ.get("GRPO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "grpo-pipeline"
    )
    return Path(root)


# --- atomic writes --------------------------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    """fsync a file or directory; a no-op where directories cannot be opened (Windows)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
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
    """Give every file under `directory` at least the usual permissions, 0o666 minus the umask.

    safetensors writes its files 0600 (a private temp file renamed into place), so weights came out
    unreadable to other users while every other file of a run was 0644. Bits are only added, never
    removed, and the umask is respected (a umask of 077 keeps everything private).
    """
    wanted = 0o666 & ~current_umask()
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):
                mode = os.lstat(path).st_mode
                if stat.S_ISREG(mode) and (mode & wanted) != wanted:
                    os.chmod(path, (mode & 0o7777) | wanted)


def _sibling(final: Path, tag: str) -> Path:
    return final.parent / f".{final.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}"


def previous_versions(final_path: str | os.PathLike[str]) -> list[Path]:
    """The previous complete copies an interrupted `atomic_directory` left beside `final_path`, oldest name first."""
    final = absolute_path(final_path)
    if not final.parent.is_dir():
        return []
    return sorted(final.parent.glob(f".{final.name}.old-*"))


@contextlib.contextmanager
def atomic_directory(final_path: str | os.PathLike[str], *, durable: bool = True) -> Iterator[Path]:
    """Write a directory under a temporary sibling name, then rename it into place in one step.

    Yields a fresh, empty temp directory `.{name}.tmp-<pid>-<rand>` next to `final_path` (same
    filesystem, so the rename is atomic). On success it becomes `final_path`; on an exception it is
    removed and the exception re-raised, and `final_path` is untouched.

    Replacing an existing directory takes two renames (POSIX cannot atomically swap a non-empty
    directory): final -> `.{name}.old-<pid>-<rand>`, then temp -> final, then the old copy is deleted.
    A crash between the two renames leaves *no* directory under the final name, with the previous
    complete version at `.{name}.old-*` and the new one at `.{name}.tmp-*`; `verify_adapter_dir` points
    at the old copy. At no moment is a half-written directory under the final name. A killed process
    leaves its hidden `.tmp-*` sibling behind; it is safe to delete.

    Args:
        final_path: where the directory must end up (made absolute now, see `absolute_path`).
        durable: fsync every file and the directories before renaming, so a power loss cannot publish
            a directory whose files are still empty on disk. Costs about one disk flush.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_directory(root / "lora") as tmp:
    ...     _ = (tmp / "adapter_config.json").write_text("{}")
    >>> sorted(p.name for p in root.iterdir())
    ['lora']
    """
    final = absolute_path(final_path)
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = _sibling(final, "tmp")
    # os.mkdir (not tempfile.mkdtemp, which forces mode 0700) so the published folder gets the
    # usual umask-derived permissions like any folder the user creates.
    os.mkdir(temp)
    try:
        yield temp
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    publish_directory(temp, final, durable=durable)


def publish_directory(temp: Path, final: Path, *, durable: bool = True) -> None:
    """Rename the complete folder `temp` to `final` (same file system), replacing what is there.

    The second half of `atomic_directory`, for folders a library writes under a name of its own choosing
    (the Trainer's checkpoints, see pipeline/run/checkpoints.py `stage_checkpoint_saves`). File modes are
    normalised and, with `durable`, every file and folder is fsynced before the rename. On failure `temp` is
    removed and `final` keeps its previous version.
    """
    try:
        normalize_file_modes(temp)  # safetensors' 0600 weights get the same permissions as the rest
        if durable:
            for root, _dirs, files in os.walk(temp):
                for name in files:
                    _fsync_path(Path(root) / name)
                _fsync_path(Path(root))
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    if os.path.lexists(final):
        old = _sibling(final, "old")
        os.rename(final, old)
        try:
            os.rename(temp, final)
        except BaseException:
            os.rename(old, final)  # put the previous version back before reporting the failure
            shutil.rmtree(temp, ignore_errors=True)
            raise
        if durable:
            _fsync_path(final.parent)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
    else:
        os.rename(temp, final)
    if durable:
        _fsync_path(final.parent)


def staging_leftovers(folder: str | os.PathLike[str]) -> list[Path]:
    """The hidden `.NAME.tmp-*` / `.NAME.old-*` siblings that killed `atomic_directory` / `atomic_write_text`
    calls left in `folder`; a `.old-*` only once its final name exists again (until then it is the only
    complete copy, which `verify_adapter_dir` points at)."""
    root = Path(folder)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _LEFTOVER.match(path.name)
        if match and (match.group(2) == "tmp" or (root / match.group(1)).exists()):
            found.append(path)
    return sorted(found)


_LEFTOVER = re.compile(r"^\.(.+)\.(tmp|old)-\d+-[0-9a-f]{8}$")


def publish_once(final_path: str | os.PathLike[str], write: Callable[[Path], None],
                 is_complete: Callable[[Path], bool]) -> Path:
    """Build a directory once and publish it under `final_path`; the first complete copy wins.

    For caches that many processes may fill at once (the demo model, a saved hub dataset, a prepared
    dataset): unlike `atomic_directory`, which replaces what is there, a folder that `is_complete`
    accepts is kept as it is and `write` is not called, so a process already reading it is never
    disturbed. Otherwise `write(staging)` fills a fresh sibling folder that is renamed into place in one
    step. A racing process's rename fails on the now non-empty folder and its copy is dropped. An
    incomplete folder under the final name (damaged by hand: ours are never half-published) is replaced.
    Returns the absolute final path.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> has_data = lambda folder: (folder / "data.txt").is_file()
    >>> _ = publish_once(root / "cache", lambda tmp: (tmp / "data.txt").write_text("first"), has_data)
    >>> _ = publish_once(root / "cache", lambda tmp: (tmp / "data.txt").write_text("second"), has_data)
    >>> (root / "cache" / "data.txt").read_text(), sorted(p.name for p in root.iterdir())
    ('first', ['cache'])
    """
    final = absolute_path(final_path)
    if is_complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(final) and not is_complete(final):  # re-checked: another process may just have published
        shutil.rmtree(final, ignore_errors=True)
    temp = _sibling(final, "tmp")
    os.mkdir(temp)  # not tempfile.mkdtemp (mode 0700): the published folder gets the usual permissions
    try:
        write(temp)
        normalize_file_modes(temp)
        try:
            os.rename(temp, final)
        except OSError:
            if not is_complete(final):
                raise
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return final


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> Path:
    """Write a text file atomically: a temp file in the same directory, fsync, then `os.replace`.

    Readers see the old content or the new content, never a partial file. Returns the absolute path.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "state.json"
    >>> atomic_write_text(target, "{}").read_text()
    '{}'
    """
    final = absolute_path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = _sibling(final, "tmp")
    # O_EXCL: never clobber someone else's temp file; mode 0o666 lets the umask decide, unlike mkstemp's 0600.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode(encoding))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_path(final.parent)
    return final


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> Path:
    """`atomic_write_text` of `obj` as JSON (UTF-8, not ASCII-escaped, trailing newline)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")
