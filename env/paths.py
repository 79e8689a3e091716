"""How files are written: writes a crash cannot leave half done, and the command lines printed to paste.

A training run killed mid-save must never leave a half-written adapter under the final name, which the next
`load_lora` would happily read: every folder and state file is written under a hidden sibling name and renamed into
place, replacing only what the writer saw at its start (env/locations.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import re
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.disk import storage_named
from grpo_pipeline.env.file_modes import fsync_path, normalize_file_modes
from grpo_pipeline.env.locations import PathChangedError, Seen, absolute_path, path_identity, snapshot
from grpo_pipeline.env.secret_fields import masked_argv


def shell_command(*words: str | os.PathLike[str]) -> str:
    """A command line to print for the user to paste (every "next:", "resume with:" and "run this" line): each word
    shell-quoted (`shell_word`), a secret option's value masked (env/secret_fields.py masked_argv).

    >>> print(shell_command("grpo", "generate", "--lora", "/runs/my run/lora", "--prompt", "What is 2+2?"))
    grpo generate --lora '/runs/my run/lora' --prompt 'What is 2+2?'
    """
    return " ".join(shell_word(os.fspath(word)) for word in masked_argv(list(words)))


def shell_word(word: str) -> str:
    r"""One word of a printed command, shlex.quote'd. A file name whose bytes are not UTF-8 (surrogate escapes, which
    no stream can print) is written in bash's $'...' form, each such byte as \xNN: it pastes back as the same bytes.

    >>> print(shell_word("my run"), shell_word("caf\udce9.jsonl"))
    'my run' $'caf\xe9.jsonl'
    """
    import shlex

    if not any("\ud800" <= char <= "\udfff" for char in word):
        return shlex.quote(word)
    try:
        raw = os.fsencode(word)  # the bytes the OS has, whatever the locale's encoding
    except UnicodeEncodeError:  # a lone surrogate no file name holds: its escape, as text
        raw = word.encode("utf-8", "backslashreplace")
    return "$'" + "".join(chr(b) if 32 <= b < 127 and chr(b) not in "'\\" else f"\\x{b:02x}" for b in raw) + "'"


def _sibling(final: Path, tag: str) -> Path:
    return final.parent / f".{final.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}"


def previous_versions(final_path: str | os.PathLike[str]) -> list[Path]:
    """The previous complete copies an interrupted `atomic_directory` left beside `final_path`, oldest name first."""
    final = absolute_path(final_path)
    if not final.parent.is_dir():
        return []
    return sorted(final.parent.glob(f".{final.name}.old-*"))


# renameat2(2) flags (Linux): publish without replacing, or swap two entries in one step.
_RENAME_NOREPLACE, _RENAME_EXCHANGE, _AT_FDCWD = 1, 2, -100
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, getattr(errno, "ENOTSUP", errno.EINVAL), errno.EOPNOTSUPP}


@functools.lru_cache(maxsize=1)
def _libc_renameat2() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.renameat2
    except (OSError, AttributeError):  # no libc symbol (glibc < 2.28, musl < 1.2.3)
        return None


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """renameat2(src, dst, flags); False where this kernel, libc or file system has no such rename."""
    call = _libc_renameat2()
    if call is None:
        return False
    if call(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    number = ctypes.get_errno()
    if number in _UNSUPPORTED:
        return False
    raise OSError(number, os.strerror(number), str(src), None, str(dst))


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """Rename `src` to `dst` only if nothing is at `dst`; False (and `src` untouched) when something is."""
    try:
        if _renameat2(src, dst, _RENAME_NOREPLACE):
            return True
    except FileExistsError:
        return False
    if os.path.lexists(dst):  # no renameat2 here: the check and the rename are a few calls apart
        return False
    if not src.is_dir():
        try:  # a file: link(2) never replaces
            os.link(src, dst)
        except FileExistsError:
            return False
        except OSError:
            os.rename(src, dst)
            return True
        os.unlink(src)
        return True
    try:
        os.rename(src, dst)  # onto a folder that appeared since, only an empty one would be replaced
    except OSError as err:
        if err.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
            return False
        raise
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def publish(temp: Path, final: Path, seen: Seen, *, keep_theirs: Optional[Callable[[Path], bool]] = None,
            durable: bool = True) -> bool:
    """Put the complete `temp` (beside `final`) at `final`, replacing only what `seen` recorded: every writer's
    publish step. Otherwise `temp` is removed and PathChangedError raised, or, when `keep_theirs` accepts the `final`
    another process published first, False returned. Without renameat2's atomic swap: final -> `.{name}.old-*`, temp
    -> final (never replacing), the old copy deleted."""
    def conflict(now: Optional[tuple]) -> bool:
        _remove(temp)
        if keep_theirs is not None and now is not None and keep_theirs(final):
            return False
        raise PathChangedError(seen, now)

    now = path_identity(final)
    if now != seen.identity:
        return conflict(now)
    replaced: Optional[Path] = None
    if seen.identity is None:
        if not _rename_noreplace(temp, final):
            return conflict(path_identity(final))
    else:
        try:
            swapped = _renameat2(temp, final, _RENAME_EXCHANGE)
            replaced = temp if swapped else _sibling(final, "old")
            if not swapped:
                os.rename(final, replaced)
        except FileNotFoundError:  # gone since the check
            return conflict(None)
        moved = path_identity(replaced)
        if moved is None or moved[:2] != seen.identity[:2]:  # another writer got in between: theirs goes back
            if swapped:
                _renameat2(temp, final, _RENAME_EXCHANGE)
            else:
                _rename_noreplace(replaced, final)
            return conflict(path_identity(final))
        if not swapped and not _rename_noreplace(temp, final):  # appeared between the two renames: the old copy stays
            _remove(temp)
            raise PathChangedError(Seen(final, None, seen.option, f"The previous version is at {replaced}. {seen.fix}"),
                                   path_identity(final))
    if durable:
        fsync_path(final.parent)
    if replaced is not None:
        _remove(replaced)  # the replaced version
    return True


@contextlib.contextmanager
def atomic_directory(final_path: str | os.PathLike[str], *, durable: bool = True, seen: Optional[Seen] = None,
                     keep_theirs: Optional[Callable[[Path], bool]] = None) -> Iterator[Path]:
    """Yield a fresh, empty directory `.{name}.tmp-<pid>-<rand>` beside `final_path`; on success it is published
    there (`publish_directory`), replacing only `seen` (default: what is there now); on an exception removed. A crash
    between the two renames of a system without renameat2 leaves the previous version at `.{name}.old-*`
    (`verify_adapter_dir` points at it), never a half-written one. `durable`: fsync first, so a power loss cannot
    publish empty files. A storage failure is one StorageError naming `final_path`.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_directory(root / "lora") as tmp:
    ...     _ = (tmp / "adapter_config.json").write_text("{}")
    >>> sorted(p.name for p in root.iterdir())
    ['lora']
    """
    final = absolute_path(final_path)
    seen = seen or snapshot(final)
    with storage_named(final, seen.option):
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = _sibling(final, "tmp")
        os.mkdir(temp)  # not tempfile.mkdtemp (mode 0700): the published folder gets the usual permissions
    try:
        with storage_named(final, seen.option):
            yield temp
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    publish_directory(temp, final, durable=durable, seen=seen, keep_theirs=keep_theirs)


def publish_directory(temp: Path, final: Path, *, durable: bool = True, seen: Optional[Seen] = None,
                      keep_theirs: Optional[Callable[[Path], bool]] = None) -> bool:
    """The second half of `atomic_directory`, also for folders a library writes under a name of its own choosing
    (the Trainer's checkpoints, pipeline/run/checkpoints.py): file modes normalised, fsynced (`durable`), published.
    On failure `temp` is removed and `final` keeps its previous version."""
    seen = seen or snapshot(final)
    try:
        with storage_named(final, seen.option):
            normalize_file_modes(temp)  # safetensors' 0600 weights get the same permissions as the rest
            if durable:
                for root, _dirs, files in os.walk(temp):
                    for name in files:
                        fsync_path(Path(root) / name)
                    fsync_path(Path(root))
            return publish(temp, final, seen, keep_theirs=keep_theirs, durable=durable)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


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
                 is_complete: Callable[[Path], bool], *, option: str = "", seen: Optional[Seen] = None) -> Path:
    """Build a cache many processes may fill at once (the demo model, a prepared dataset) under `final_path`, once:
    a folder `is_complete` accepts is kept (`write` not called), else `write(staging)` fills a sibling published in
    one step, and a racing process's complete copy that got there first wins. Returns the path absolute. `option`:
    the setting that chose the path, for a StorageError's message.

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
    # a cache: its files are not fsynced one by one
    with atomic_directory(final, durable=False, seen=seen or snapshot(final, option=option),
                          keep_theirs=is_complete) as temp:
        write(temp)
        if not is_complete(temp):  # never publish a copy its own readers would take for damaged
            raise RuntimeError(f"building {final} wrote an incomplete copy (nothing was published)")
    return final


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8",
                      seen: Optional[Seen] = None) -> Path:
    """Write a text file atomically (a temp file beside it, fsync, `publish` over `seen`, default what is there
    now): readers see the old content or the new. Returns the absolute path.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "state.json"
    >>> atomic_write_text(target, "{}").read_text()
    '{}'
    """
    # encoded before anything is created: an unencodable text leaves nothing behind
    return atomic_write_bytes(path, text.encode(encoding), seen=seen)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, seen: Optional[Seen] = None) -> Path:
    """`atomic_write_text` of bytes (a plot's PNG, say)."""
    final = absolute_path(path)
    seen = seen or snapshot(final)
    temp = _sibling(final, "tmp")
    with storage_named(final, seen.option):
        final.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: never clobber someone else's temp file; mode 0o666 lets the umask decide, unlike mkstemp's 0600.
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            publish(temp, final, seen)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
    return final


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int = 2,
                      seen: Optional[Seen] = None) -> Path:
    """`atomic_write_text` of `obj` as JSON (UTF-8, not ASCII-escaped, trailing newline; json_text)."""
    return atomic_write_text(path, json_text(obj, indent) + "\n", seen=seen)


def json_text(obj: Any, indent: Optional[int] = 2) -> str:
    r"""`obj` as JSON with its non-ASCII text as it is; when a string holds surrogate escapes (a file name whose
    bytes are not UTF-8), all of it \u-escaped, which UTF-8 takes and json.loads reads back as the same name.

    >>> json_text({"path": "caf\udce9"}, None), json_text({"path": "caf\u00e9"}, None)
    ('{"path": "caf\\udce9"}', '{"path": "café"}')
    """
    text = json.dumps(obj, indent=indent, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(obj, indent=indent, ensure_ascii=True)
    return text
