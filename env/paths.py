"""Path helpers every save and load goes through.

Why: vLLM resolves a relative LoRA path against the *engine process's* working directory and, when it
is not there, treats the string as a Hugging Face repo id (vllm#6231); Unsloth passes the path through
unchanged. A path made absolute at the moment the user gives it removes that whole class of bugs.
And a training run killed mid-save must never leave a half-written adapter under the final name, which
the next `load_lora` would happily read.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"
# The order is PEFT's: it writes safetensors unless told otherwise, and loads it first.
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# Sub-folders a trainer commonly saves the adapter into; used only to suggest "did you mean ...?".
_LIKELY_SUBDIRS = ("lora", "adapter", "final", "lora_adapter")
# A safetensors header is JSON describing tensors; 100 MB is far beyond any adapter's and guards
# against reading a garbage length from a file that is not safetensors at all.
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
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


def cache_root() -> Path:
    """The project's one cache folder: $GRPO_CACHE_DIR, else $XDG_CACHE_HOME/grpo-pipeline, else
    ~/.cache/grpo-pipeline. Prepared datasets, the unpacked tokenizer and the built-in models live under it."""
    root = os.environ.get("GRPO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "grpo-pipeline"
    )
    return Path(root)


# --- adapter checks -------------------------------------------------------------------------------


class AdapterError(FileNotFoundError, ValueError):
    """A LoRA adapter directory is missing, incomplete or unreadable.

    It is both a `FileNotFoundError` (the usual case: something is not there) and a `ValueError`
    (a file is there but invalid), so callers can catch whichever reads naturally.

    Attributes:
        path: the absolute adapter directory that was checked.
        missing: what is missing or broken, e.g. "adapter_config.json" or "adapter_config.json: r".
    """

    def __init__(self, path: Path, missing: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.missing = missing
        self.filename = str(path)

    def __str__(self) -> str:  # OSError.__str__ would add "[Errno None]"-style noise
        return str(self.args[0])


@dataclass(frozen=True)
class AdapterInfo:
    """What `verify_adapter_dir` found: enough to rebuild the LoRA and to know what it was trained on."""

    path: Path
    base_model_name_or_path: str | None
    r: int
    lora_alpha: float | None
    target_modules: list[str] | str | None  # PEFT allows a list or a regex string
    modules_to_save: list[str] | None
    weights_file: Path
    config: dict[str, Any] = field(repr=False, default_factory=dict)


def verify_adapter_dir(path: str | os.PathLike[str]) -> AdapterInfo:
    """Check a saved LoRA adapter directory and return what it holds, without importing torch or peft.

    Checks, in order: the directory exists; `adapter_config.json` is a readable JSON object with a
    positive integer `r`; `adapter_model.safetensors` (or `.bin`) is a readable, non-empty file, and a
    safetensors file has a valid header whose tensors fit in the file (a save killed midway fails here).

    Raises:
        AdapterError: naming the absolute path, the missing piece, and a hint when one applies.

    >>> verify_adapter_dir("/nonexistent/lora")
    Traceback (most recent call last):
    ...
    env.paths.AdapterError: LoRA adapter directory /nonexistent/lora does not exist
    """
    directory = absolute_path(path)

    def fail(missing: str, problem: str) -> AdapterError:
        hint = _hint(directory)
        return AdapterError(directory, missing, problem + (f"; {hint}" if hint else ""))

    if not directory.exists():
        given_absolute = os.path.isabs(os.path.expandvars(os.path.expanduser(os.fspath(path))))
        relative = "" if given_absolute else f" (relative path resolved against {Path.cwd()})"
        raise fail("directory", f"LoRA adapter directory {directory} does not exist{relative}")
    if not directory.is_dir():
        raise fail("directory", f"LoRA adapter path {directory} is a file, not a directory")

    config_path = directory / ADAPTER_CONFIG
    config = _read_config(config_path, fail)
    weights = _find_weights(directory, fail)
    r = config["r"]
    return AdapterInfo(
        path=directory,
        base_model_name_or_path=config.get("base_model_name_or_path"),
        r=r,
        lora_alpha=config.get("lora_alpha"),
        target_modules=config.get("target_modules"),
        modules_to_save=config.get("modules_to_save"),
        weights_file=weights,
        config=config,
    )


def _read_config(config_path: Path, fail) -> dict[str, Any]:
    if not config_path.exists():
        raise fail(ADAPTER_CONFIG, f"{ADAPTER_CONFIG} is missing in {config_path.parent}")
    if not config_path.is_file():
        raise fail(ADAPTER_CONFIG, f"{config_path} is not a regular file")
    try:
        text = config_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise fail(ADAPTER_CONFIG, f"{config_path} cannot be read: {err}") from err
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise fail(
            ADAPTER_CONFIG, f"{config_path} is not valid JSON ({err}); the save was probably interrupted"
        ) from err
    if not isinstance(config, dict):
        raise fail(ADAPTER_CONFIG, f"{config_path} must hold a JSON object, found {type(config).__name__}")
    r = config.get("r")
    # bool is an int subclass; `"r": true` is a corrupted file, not rank 1.
    if "r" not in config:
        raise fail(f"{ADAPTER_CONFIG}: r", f"{config_path} has no 'r' (LoRA rank); it is not a LoRA adapter config")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise fail(f"{ADAPTER_CONFIG}: r", f"{config_path}: 'r' must be a positive integer, found {r!r}")
    return config


def _find_weights(directory: Path, fail) -> Path:
    for name in ADAPTER_WEIGHTS:
        weights = directory / name
        if weights.exists():
            break
    else:
        raise fail(ADAPTER_WEIGHTS[0], f"no adapter weights ({' or '.join(ADAPTER_WEIGHTS)}) in {directory}")
    if not weights.is_file():
        raise fail(weights.name, f"{weights} is not a regular file")
    try:
        size = weights.stat().st_size
        if size == 0:
            raise fail(weights.name, f"{weights} is empty; the save was probably interrupted")
        with open(weights, "rb") as handle:
            head = handle.read(8)  # reading proves the file is readable, whatever its format
            if weights.suffix == ".safetensors":
                _check_safetensors(handle, head, size, weights, fail)
    except OSError as err:
        if isinstance(err, AdapterError):
            raise
        raise fail(weights.name, f"{weights} cannot be read: {err}") from err
    return weights


def _check_safetensors(handle, head: bytes, size: int, weights: Path, fail) -> None:
    """Validate the safetensors layout: u64 little-endian header length, JSON header, data that fits.

    Hand-written (30 lines) instead of `safetensors.safe_open` so the check needs no torch/numpy and
    reports *what* is wrong; the format is specified at github.com/huggingface/safetensors.
    """
    if len(head) < 8:
        raise fail(weights.name, f"{weights} is truncated ({size} bytes): no safetensors header")
    (header_length,) = struct.unpack("<Q", head)
    if header_length == 0 or header_length > _MAX_SAFETENSORS_HEADER or 8 + header_length > size:
        raise fail(
            weights.name, f"{weights} has an invalid safetensors header length {header_length} (file is {size} bytes)"
        )
    try:
        header = json.loads(handle.read(header_length))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise fail(weights.name, f"{weights} has a corrupt safetensors header: {err}") from err
    if not isinstance(header, dict):
        raise fail(weights.name, f"{weights} has a corrupt safetensors header (not a JSON object)")
    tensors = {name: info for name, info in header.items() if name != "__metadata__"}
    if not tensors:
        raise fail(weights.name, f"{weights} contains no tensors")
    try:
        data_end = max(int(info["data_offsets"][1]) for info in tensors.values())
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise fail(weights.name, f"{weights} has a corrupt safetensors header (bad data_offsets)") from err
    if 8 + header_length + data_end > size:
        raise fail(
            weights.name,
            f"{weights} is truncated: its header describes {8 + header_length + data_end} bytes but the file has {size}",
        )


def safetensors_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a .safetensors file is unreadable (empty, truncated, corrupt header), or None when it is whole.

    >>> import tempfile, pathlib
    >>> bad = pathlib.Path(tempfile.mkdtemp()) / "model.safetensors"
    >>> _ = bad.write_bytes(b"\\x10")
    >>> safetensors_problem(bad)
    '... is truncated (1 bytes): no safetensors header'
    """
    weights = absolute_path(path)
    quiet_fail = lambda missing, problem: AdapterError(weights.parent, missing, problem)
    try:
        size = weights.stat().st_size
        if size == 0:
            return f"{weights} is empty"
        with open(weights, "rb") as handle:
            _check_safetensors(handle, handle.read(8), size, weights, quiet_fail)
    except AdapterError as err:
        return str(err)
    except OSError as err:
        return f"{weights} cannot be read: {err}"
    return None


def _is_complete_adapter(directory: Path) -> bool:
    """Whether `directory` holds a valid adapter (no hint search, which would recurse)."""
    quiet_fail = lambda missing, problem: AdapterError(directory, missing, problem)
    try:
        if not directory.is_dir():
            return False
        _read_config(directory / ADAPTER_CONFIG, quiet_fail)
        _find_weights(directory, quiet_fail)
    except (AdapterError, OSError):
        return False
    return True


def _hint(directory: Path) -> str:
    """Suggest where the adapter probably is: a likely sub-folder, the newest checkpoint, or a leftover save."""
    try:
        if directory.is_dir():
            for name in _LIKELY_SUBDIRS:
                if _is_complete_adapter(directory / name):
                    return f"did you mean {directory / name}?"
            checkpoints = sorted(
                (p for p in directory.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
                key=lambda p: int(p.name.split("-")[-1]),
            )
            for checkpoint in reversed(checkpoints):
                if _is_complete_adapter(checkpoint):
                    return f"did you mean the newest checkpoint {checkpoint}?"
        # An interrupted atomic save leaves the previous complete version under a hidden name.
        parent = directory.parent
        if parent.is_dir():
            leftovers = sorted(parent.glob(f".{directory.name}.old-*"))
            if leftovers:
                return (
                    f"an interrupted save left the previous version at {leftovers[-1]}; rename it to {directory.name}"
                )
    except OSError:
        pass
    return ""


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
