"""The one check of every path a user gives, run before any work: one table (`PATH_OPTIONS`), one function
(`check_path`: a PathError naming the option, exit 2). Refused: an empty value; an unset or empty `$VAR` (`$OUT/run`
must not become `/run`); an unknown `~user`; a symlink loop or dangling link; a file where a folder is expected and
the reverse; a missing or unreadable input; an unwritable output; an existing new folder without --overwrite; an
output that is, contains or lies inside something the command reads (`grpo export --out <the adapter>`).
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from grpo_pipeline.env.locations import cache_root
from grpo_pipeline.env.text import excerpt, printable, shorten

_VARIABLE = re.compile(r"\$(?:\{([^}]*)\}|(\w+))")
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
RECIPE_SUFFIXES = (".yaml", ".yml")


class PathError(ValueError):
    """A path option that cannot work. `option` names it (`--out`, `output_dir`); the message says the fix."""

    def __init__(self, option: str, message: str):
        self.option = option
        self.detail = message
        super().__init__(f"`{option}`: {message}")


def _path_like(value: str) -> bool:
    return value.startswith(("/", ".", "~", "$", os.sep))


def local_model(value: str) -> bool:
    """A model given as a folder, not a hub id (`org/name`) or a built-in name (`tiny-demo`, `bundled:...`).
    The same rule as grpo_pipeline.pipeline.data.model_check.check_model."""
    return os.path.lexists(os.path.expanduser(value)) or _path_like(value) or value.count("/") > 1


def local_data(value: str) -> bool:
    """dataset_name / eval_dataset_name / --data naming a local file or folder, not a hub id (`org/name`) or a
    built-in name (`sample`): it exists, starts like a path (`/ . ~ $`), has more than one `/` or a backslash, or
    ends in a data or recipe suffix (`my.yaml` is refused later as data, with its reason).

    >>> [local_data(n) for n in ("openai/gsm8k", "gsm8k", "./data", "/x/y", "a/b/c", "my.jsonl", "$DATA/x", "C:\\d")]
    [False, False, True, True, True, True, True, True]
    """
    return (value.lower().endswith(DATA_SUFFIXES + RECIPE_SUFFIXES) or os.path.lexists(os.path.expanduser(value))
            or _path_like(value) or value.count("/") > 1 or "\\" in value)


def resume_path(value: str) -> bool:
    """--resume PATH (auto and never are words; a bare word is grpo_pipeline.pipeline.preflight.check_resume's to explain)."""
    return value not in ("auto", "never") and ("/" in value or os.sep in value or os.path.lexists(value))


EXPORT_MARKER = "grpo_export.json"  # written into every `grpo export` folder: what --overwrite may replace


def previous_export(folder: Path) -> Optional[str]:
    """Why --overwrite may not replace `folder`, or None: only an empty folder or one `grpo export` wrote (it
    holds EXPORT_MARKER) is replaced; a run, a checkpoint, an adapter or a model of the user's never is."""
    entries = sorted(p.name for p in folder.iterdir())
    if not entries or EXPORT_MARKER in entries:
        return None
    shown = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "")
    return (f"--overwrite only replaces a folder that `grpo export` wrote (with {EXPORT_MARKER} inside), and this "
            f"one holds {shown}. Choose a new --out, or move that folder away yourself.")


def always(value: str) -> bool:
    return True


@dataclass(frozen=True)
class PathOption:
    """What a path option names. role: input | output; want: file | dir | any. Outputs: may_exist False = a new
    folder, refused when it exists unless --overwrite; replaces True = a whole new file/folder put there, which must
    neither be, contain nor lie inside anything the command reads; False = a folder filled in place (a run folder, a
    cache), which must not be an input itself but may hold one (the checkpoint a run folder resumes)."""

    role: str
    want: str
    may_exist: bool = True
    replaces: bool = False
    applies: Callable[[str], bool] = always  # False: the value is a name, not a path (a hub id, `auto`)
    replaceable: Optional[Callable[[Path], Optional[str]]] = None  # with --overwrite: why not, or None

    def describe(self) -> str:
        noun = {"file": "file", "dir": "folder", "any": "file or folder"}[self.want]
        return f"{'an input' if self.role == 'input' else 'an output'} {noun}"


INPUT_FILE = PathOption("input", "file")
INPUT_DIR = PathOption("input", "dir")
OUTPUT_FILE = PathOption("output", "file", replaces=True)
FILLED_OUTPUT_DIR = PathOption("output", "dir")
LOCAL_DATA = PathOption("input", "any", applies=local_data)  # a file, a folder of files or a save_to_disk folder
LOCAL_MODEL = PathOption("input", "dir", applies=local_model)


# command -> option (config field name, or the argparse dest of `--option`) -> its kind. Config fields are
# shared by `grpo train` and `grpo data` (both read the recipe); every other path option is listed per command.
CONFIG_PATHS: dict[str, PathOption] = {
    "output_dir": FILLED_OUTPUT_DIR,
    "data_cache_dir": FILLED_OUTPUT_DIR,
    "dataset_name": LOCAL_DATA,
    "eval_dataset_name": LOCAL_DATA,
    "model_name_or_path": LOCAL_MODEL,
    "resume": PathOption("input", "dir", applies=resume_path),
}
_INFERENCE_PATHS = {"lora": INPUT_DIR, "run": INPUT_DIR, "config": INPUT_FILE, "model": LOCAL_MODEL}
PATH_OPTIONS: dict[str, dict[str, PathOption]] = {
    "train": {"config": INPUT_FILE, **CONFIG_PATHS},
    "data": {"config": INPUT_FILE, **{k: v for k, v in CONFIG_PATHS.items() if k != "resume"}},
    "generate": {**_INFERENCE_PATHS, "input": INPUT_FILE, "output": OUTPUT_FILE},
    "eval": {**_INFERENCE_PATHS, "data": LOCAL_DATA, "output": OUTPUT_FILE},
    "export": {"lora": INPUT_DIR, "out": PathOption("output", "dir", may_exist=False, replaces=True,
                                                    replaceable=previous_export)},
    "plot": {"run": INPUT_DIR},  # writes only its plots/, as the run does
}


def flag(option: str, command: str) -> str:
    """How the user wrote the option: `--out` for a command flag, the field name for a config field."""
    return option if command in ("train", "data") and option in CONFIG_PATHS else f"--{option}"


def relative_base(raw: Any) -> str:
    """For a relative path that is missing: the one base every relative path is read against, said.

    >>> relative_base("/abs/x"), relative_base("data/x.jsonl").startswith(" data/x.jsonl is relative")
    ('', True)
    """
    text = os.fspath(raw) if raw is not None else ""
    if not text or os.path.isabs(os.path.expanduser(os.path.expandvars(text))):
        return ""
    return (f" {text} is relative: every relative path (data, eval data, reward modules, output), in a recipe or "
            f"on the command line, is read against the working folder ({os.getcwd()}), as TRL reads them. Run "
            "from the folder it is relative to, or give an absolute path.")


def expand(option: str, raw: Any) -> Path:
    """`raw` with `~` and `$VARS` expanded, made absolute; refuses empty values and unset or empty variables."""
    text = os.fspath(raw) if raw is not None else ""
    if not text.strip():
        raise PathError(option, "is empty. Give a path, e.g. outputs/my-run.")
    for match in _VARIABLE.finditer(text):
        name = match.group(1) if match.group(1) is not None else match.group(2)
        value = os.environ.get(name) if re.fullmatch(r"\w+", name or "") else None
        if value is None:
            raise PathError(option, f"{excerpt(text)} uses the environment variable {match.group(0)}, which is not "
                            f"set. Export it (export {name or 'NAME'}=...) or write the path out.")
        if value == "":
            raise PathError(option, f"{excerpt(text)} uses the environment variable {match.group(0)}, which is set "
                            f"but empty, so the path would become {excerpt(os.path.expandvars(text))}. Set {name} or "
                            "write the path out.")
    text = os.path.expandvars(text)
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        user = expanded[1:].split("/", 1)[0]
        raise PathError(option, f"{excerpt(text)} starts with ~{shorten(user, 80)}, but there is no user "
                        f"{excerpt(user, 80)} (and $HOME does not apply). Write the path out.")
    return Path(os.path.abspath(expanded))


def library_name_problem(path: Path) -> Optional[str]:
    """Why the tokenizers and safetensors libraries (Rust: file names as UTF-8 text) would not find `path` where
    Python does, or None: under a non-UTF-8 locale Python writes a non-ASCII name in that encoding and they in UTF-8
    (two folders); a name whose bytes are not UTF-8 they cannot take at all."""
    text = str(path)
    encoding = codecs.lookup(sys.getfilesystemencoding()).name
    if encoding != "utf-8" and not text.isascii():
        locale_name = os.environ.get("LC_ALL") or os.environ.get("LC_CTYPE") or os.environ.get("LANG") or "C"
        return (f"{excerpt(text)} is not ASCII, and this locale ({locale_name}) writes file names as {encoding} "
                "while the tokenizers and safetensors libraries write them as UTF-8, so a run's files would land "
                "in two different folders. Run under a UTF-8 locale (export LC_ALL=C.UTF-8, or PYTHONUTF8=1), or "
                "give an ASCII path.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return (f"{printable(text)} is not UTF-8 text (the bytes shown as \\xNN are not), and the tokenizers and "
                "safetensors libraries take only UTF-8 file names. Rename the folder, or choose another.")
    return None


def nearest_existing(option: str, path: Path) -> Path:
    """The nearest existing path at or above `path`; refuses a symlink loop, a dangling symlink, or a file in the
    middle of the path, and a place that cannot be looked into."""
    current = path
    while True:
        try:
            os.stat(current)
            return current
        except OSError as err:
            if err.errno == errno.ELOOP:
                # the topmost link that does not resolve is the loop (a dangling one would have said ENOENT)
                link = next((p for p in reversed([current, *current.parents]) if os.path.islink(p)
                             and not os.path.exists(p)), current)
                raise PathError(option, f"{link} is a symlink loop (following it comes back to it), so {path} "
                                "cannot be reached. Remove or fix the link, or choose another path.") from None
            if err.errno == errno.ENOTDIR:
                blocker = next(p for p in reversed([current, *current.parents]) if os.path.isfile(p))
                raise PathError(option, f"{path} cannot be a path: {blocker} is a file, not a folder. Choose "
                                "another path.") from None
            if err.errno == errno.EACCES:
                raise PathError(option, f"{current} cannot be reached: permission denied on a folder above it. "
                                "Choose a path you can read.") from None
            if err.errno != errno.ENOENT:
                raise PathError(option, f"{current} cannot be read ({err.strerror}).") from None
        if os.path.islink(current):
            raise PathError(option, f"{current} is a symlink to {os.readlink(current)}, which does not exist. Fix "
                            "the link or choose another path.")
        if current.parent == current:
            return current
        current = current.parent


def _writable(option: str, folder: Path, what: str) -> None:
    """A real temporary file: permission bits say nothing about read-only mounts, quotas or ACLs."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".grpo-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        why = "is on a read-only file system" if err.errno == errno.EROFS else f"is not writable ({err.strerror})"
        raise PathError(option, f"{folder} {why}, so {what} cannot be written there. Choose a writable place "
                        "(under your home folder, /content on Colab, /root/autodl-tmp on AutoDL).") from None


def _relation(out: Path, source: Path) -> Optional[str]:
    out_real, source_real = Path(os.path.realpath(out)), Path(os.path.realpath(source))
    if out_real == source_real:
        return "is"
    if source_real in out_real.parents:
        return "is inside"
    if out_real in source_real.parents:
        return "contains"
    return None


def check_path(option: str, raw: Any, kind: PathOption, *, reads: Mapping[str, Path] | None = None,
               overwrite: bool = False) -> Path:
    """Check one path option and return it absolute, or raise PathError naming `option`. `reads`: what the command
    reads (a label such as "the adapter folder --lora" -> its path)."""
    path = expand(option, raw)
    if kind.want == "dir":  # a folder the tokenizers / safetensors libraries read or write in as well as Python
        problem = library_name_problem(path)
        if problem:
            raise PathError(option, problem)
    existing = nearest_existing(option, path)
    exists = existing == path
    if kind.role == "input":
        if not exists:
            raise PathError(option, f"{path} does not exist (the nearest existing folder is {existing}). Check the "
                            f"path: it should be {kind.describe()}.{relative_base(raw)}")
        if kind.want == "file" and path.is_dir():
            raise PathError(option, f"{path} is a folder; it should be a file.")
        if kind.want == "dir" and not path.is_dir():
            raise PathError(option, f"{path} is a file; it should be a folder.")
        try:
            if path.is_dir():
                os.listdir(path)
            elif path.is_file():
                open(path, "rb").close()
            elif not os.access(path, os.R_OK):  # a pipe or FIFO (`--config <(...)`): opening it would wait or spend it
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        except OSError as err:
            raise PathError(option, f"{path} cannot be read ({err.strerror}). Fix its permissions or copy it "
                            "somewhere readable.") from None
        return path
    if exists:
        if kind.want == "dir" and not path.is_dir():
            raise PathError(option, f"{path} is a file, not a folder. Choose another folder, e.g. "
                            f"{path.with_suffix('')}-run.")
        if kind.want == "file" and path.is_dir():
            raise PathError(option, f"{path} is a folder; give a file name inside it, e.g. {path / 'out.jsonl'}.")
        if not kind.may_exist and not overwrite:
            raise PathError(option, f"{path} already exists. Choose a new folder, or pass --overwrite to replace "
                            "it (the old one is kept until the new one is complete).")
    elif not existing.is_dir():
        raise PathError(option, f"{path} cannot be created: {existing} is a file, not a folder.")
    for label, source in (reads or {}).items():
        relation = _relation(path, source)
        # Every output refuses to be or to lie inside an input folder: a cache or run folder filled in place inside
        # the dataset's folder adds files that the next run reads as data ("no data files", or a report read as a
        # split). A filled output may contain an input (a run folder holds the checkpoint it resumes); a replaced
        # one may not (replacing it deletes the input).
        if relation and (kind.replaces or relation in ("is", "is inside")):
            harm = "replace it" if relation == "is" else ("delete it with the old contents" if relation == "contains"
                                                          else "change it: its new files would be read as part of it")
            raise PathError(option, f"{path} {relation} {label} ({source}), which this command reads; writing "
                            f"there would {harm}. Choose a place outside it.")
    if exists and path.is_dir() and not kind.may_exist and kind.replaceable is not None:
        refusal = kind.replaceable(path)
        if refusal:
            raise PathError(option, f"{path}: {refusal}")
    if exists and kind.want == "dir":
        _writable(option, path, "its files")
    else:
        _writable(option, existing if not exists else path.parent, path.name)
    return path


def _inputs(command: str, values: Mapping[str, Any]) -> dict[str, Path]:
    """What `command` reads, from its input options: the label for messages -> absolute path."""
    reads: dict[str, Path] = {}
    for option, spec in PATH_OPTIONS[command].items():
        value = values.get(option)
        if spec.role != "input" or not isinstance(value, (str, os.PathLike)) or not spec.applies(str(value)):
            continue
        with contextlib.suppress(PathError):  # an input that does not expand: its own check reports it
            path = expand(flag(option, command), value)
            reads[flag(option, command)] = path
            if option == "lora" and (path.parent / "manifest.json").is_file():
                reads["the run's manifest.json beside --lora"] = path.parent / "manifest.json"
            if option == "run":
                for inner in ("manifest.json", "lora"):
                    if os.path.lexists(path / inner):
                        reads[f"{inner} of --run"] = path / inner
    return reads


def check_command_paths(command: str, values: Mapping[str, Any], *, only: Iterable[str] | None = None,
                        overwrite: bool = False, extra_reads: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """Check every path option of `command` that `values` (argparse's namespace as a dict, or a config's fields)
    sets, inputs first; return option -> absolute path. `extra_reads`: what else the command reads (export: the
    adapter's base model folder)."""
    problem = library_name_problem(cache_root())  # the built-in models and the tokenizer are read from there too
    if problem:
        raise PathError("GRPO_CACHE_DIR", f"the cache root {problem}")
    table = PATH_OPTIONS[command]
    wanted = list(only) if only is not None else list(table)
    reads = {**_inputs(command, values),
             **{label: Path(os.path.abspath(p)) for label, p in (extra_reads or {}).items()}}
    checked: dict[str, Path] = {}
    for role in ("input", "output"):
        for option in wanted:
            spec = table[option]
            value = values.get(option)
            if spec.role != role or value is None or (isinstance(value, str) and value.strip() and
                                                            not spec.applies(value)):
                continue
            own = {label: p for label, p in reads.items() if label != flag(option, command)}
            checked[option] = check_path(flag(option, command), value, spec, reads=own, overwrite=overwrite)
    return checked
