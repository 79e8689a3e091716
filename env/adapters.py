"""Is this folder a usable LoRA adapter? Checked from the files alone, without importing torch or peft: a save
killed midway, a path one folder off or a truncated safetensors file is one message naming the folder, what is
missing and, when one applies, where the adapter probably is (instead of an error deep inside PEFT or vLLM).
"""

from __future__ import annotations

import json
import os
import pickletools
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.kept import read_record
from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.env.paths import previous_versions

ADAPTER_CONFIG = "adapter_config.json"
# The order is PEFT's: it writes safetensors unless told otherwise, and loads it first.
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# Sub-folders a trainer commonly saves the adapter into; used only to suggest "did you mean ...?".
_LIKELY_SUBDIRS = ("lora", "adapter", "final", "lora_adapter")
# A safetensors header is JSON describing tensors; 100 MB is far beyond any adapter's and guards
# against reading a garbage length from a file that is not safetensors at all.
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


class AdapterError(FileNotFoundError, ValueError):
    """A LoRA adapter directory is missing (FileNotFoundError), incomplete or unreadable (ValueError). `path`: the
    absolute directory; `missing`: what is missing or broken, e.g. "adapter_config.json" or "adapter_config.json: r".
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
    """Check a saved LoRA adapter directory and return what it holds, or raise AdapterError (with a hint when one
    applies): `adapter_config.json` is a JSON object with a positive integer `r`; `adapter_model.safetensors` (or
    `.bin`) is a readable, non-empty file, a safetensors one with a valid header whose tensors fit in the file.

    >>> verify_adapter_dir("/nonexistent/lora")
    Traceback (most recent call last):
    ...
    grpo_pipeline.env.adapters.AdapterError: LoRA adapter directory /nonexistent/lora does not exist
    """
    directory = absolute_path(path)
    try:
        if not directory.exists():
            given_absolute = os.path.isabs(os.path.expandvars(os.path.expanduser(os.fspath(path))))
            relative = "" if given_absolute else f" (relative path resolved against {Path.cwd()})"
            raise AdapterError(directory, "directory", f"LoRA adapter directory {directory} does not exist{relative}")
        if not directory.is_dir():
            raise AdapterError(directory, "directory", f"LoRA adapter path {directory} is a file, not a directory")
        config, weights = _read_config(directory), _find_weights(directory)
    except AdapterError as err:
        hint = _hint(directory)
        if hint:
            err.args = (f"{err}; {hint}",)
        raise
    refuse_shipped_code(directory, weights)
    return AdapterInfo(directory, config.get("base_model_name_or_path"), config["r"], config.get("lora_alpha"),
                       config.get("target_modules"), config.get("modules_to_save"), weights, config)


# What a torch-saved tensor file's pickle may name (torch.load(weights_only=True)'s own allow-list, as PEFT loads an
# adapter_model.bin): anything else is code the file would run, and the file is not loaded.
_WEIGHTS_GLOBALS = frozenset({
    "collections.OrderedDict", "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state", "torch.serialization._get_layout",
    "torch.device", "torch.Size", "builtins.set", "builtins.frozenset", "builtins.bytearray", "_codecs.encode",
    "torch.storage.UntypedStorage", "torch._tensor._rebuild_from_type_v2", "torch._utils._rebuild_wrapper_subclass"})
# The files of a tokenizer that runs its own code: tokenizer_config.json's `auto_map` names a class in a .py file
# beside it, which AutoTokenizer imports under trust_remote_code.
TOKENIZER_CONFIG = "tokenizer_config.json"


def refuse_shipped_code(directory: Path, weights: Optional[Path] = None) -> None:
    """A shared folder (an adapter, an export's source) never runs code it carries, whatever --trust_remote_code
    says (that is for the base model's own code): a tokenizer with its own code (tokenizer_config.json's `auto_map`)
    and a pickled weights file that names anything but tensors are refused (AdapterError), naming the file.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "tokenizer_config.json").write_text('{"auto_map": {"AutoTokenizer": ["tok.MyTok", null]}}')
    >>> refuse_shipped_code(folder)
    Traceback (most recent call last):
    ...
    grpo_pipeline.env.adapters.AdapterError: .../tokenizer_config.json names a tokenizer that runs its own code (auto_map: ...
    """
    config = directory / TOKENIZER_CONFIG
    # an unreadable file is named when the tokenizer loads (pipeline/data/tokenizer.py)
    auto_map = ((read_record(config) if config.is_file() else None) or {}).get("auto_map")
    if auto_map:
        values = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
        classes = ", ".join(sorted({str(v) for value in values for v in (value if isinstance(value, list) else [value])
                                    if v}))
        raise AdapterError(directory, TOKENIZER_CONFIG, (
            f"{config} names a tokenizer that runs its own code (auto_map: {classes}). Code shipped inside an "
            "adapter folder never runs, --trust_remote_code or not (that option runs the base model's own code). "
            f"Choose: use the base model's tokenizer by removing the adapter's tokenizer files ({TOKENIZER_CONFIG}, "
            f"tokenizer.json, special_tokens_map.json and the .py files) from {directory}, or ask whoever shared "
            "the adapter for one saved with a standard tokenizer."))
    if weights is not None and weights.suffix == ".bin":
        named = pickled_code(weights)
        if named:
            raise AdapterError(directory, weights.name, f"{weights} is a pickle that names {named}: loading it "
                               "would run that code, so it is not loaded (PEFT reads adapter weights as tensors "
                               "only). Choose: an adapter saved as adapter_model.safetensors (peft's save_pretrained "
                               "writes it), or a copy of this one from a source you trust converted to safetensors.")


def pickled_code(path: Path) -> Optional[str]:
    """The first thing other than tensors a torch-saved (or plain) pickle names (`module.name`), or None: read with
    pickletools, nothing run."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
                data = archive.read(name) if name else b""
        else:
            data = path.read_bytes()
    except (OSError, zipfile.BadZipFile, KeyError):
        return None  # not readable as a pickle here: the loader says what is wrong
    strings: list[str] = []
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name in ("GLOBAL", "INST"):
                found = str(arg).replace(" ", ".")
            elif opcode.name == "STACK_GLOBAL":
                found = ".".join(strings[-2:])
            else:
                if isinstance(arg, str):
                    strings.append(arg)
                continue
            if found not in _WEIGHTS_GLOBALS and not (found.startswith("torch.") and found.endswith("Storage")):
                return found
    except Exception:  # noqa: BLE001 - a stream pickletools cannot follow: torch's own load names it
        return None
    return None


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / ADAPTER_CONFIG
    if not path.is_file():
        problem = f"{path} is not a regular file" if path.exists() else f"{ADAPTER_CONFIG} is missing in {directory}"
        raise AdapterError(directory, ADAPTER_CONFIG, problem)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise AdapterError(directory, ADAPTER_CONFIG, f"{path} is not valid JSON ({err}); the save was probably "
                           "interrupted") from err
    except (OSError, UnicodeDecodeError) as err:
        raise AdapterError(directory, ADAPTER_CONFIG, f"{path} cannot be read: {err}") from err
    if not isinstance(config, dict):
        raise AdapterError(directory, ADAPTER_CONFIG, f"{path} must hold a JSON object, found {type(config).__name__}")
    r = config.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:  # `"r": true` is a corrupted file, not rank 1
        problem = (f"{path}: 'r' must be a positive integer, found {r!r}" if "r" in config else
                   f"{path} has no 'r' (LoRA rank); it is not a LoRA adapter config")
        raise AdapterError(directory, f"{ADAPTER_CONFIG}: r", problem)
    return config


def _find_weights(directory: Path) -> Path:
    weights = next((directory / name for name in ADAPTER_WEIGHTS if (directory / name).exists()), None)
    if weights is None:
        raise AdapterError(directory, ADAPTER_WEIGHTS[0], f"no adapter weights ({' or '.join(ADAPTER_WEIGHTS)}) in "
                           f"{directory}")
    problem = "is not a regular file" if not weights.is_file() else _weights_problem(weights)
    if problem:
        interrupted = "; the save was probably interrupted" if problem == "is empty" else ""
        raise AdapterError(directory, weights.name, f"{weights} {problem}{interrupted}")
    return weights


def _weights_problem(weights: Path) -> str | None:
    """Why a weights file cannot be read (said after its name), or None. A .safetensors file is checked against its
    layout (github.com/huggingface/safetensors): u64 little-endian header length, JSON header, data that fits. Not
    `safetensors.safe_open`, so it needs no torch/numpy and says *what* is wrong."""
    try:
        size = weights.stat().st_size
        if size == 0:
            return "is empty"
        with open(weights, "rb") as handle:
            head = handle.read(8)  # reading proves the file is readable, whatever its format
            if weights.suffix != ".safetensors":
                return None
            if len(head) < 8:
                return f"is truncated ({size} bytes): no safetensors header"
            (header_length,) = struct.unpack("<Q", head)
            if header_length == 0 or header_length > _MAX_SAFETENSORS_HEADER or 8 + header_length > size:
                return f"has an invalid safetensors header length {header_length} (file is {size} bytes)"
            header = json.loads(handle.read(header_length))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return f"has a corrupt safetensors header: {err}"
    except OSError as err:
        return f"cannot be read: {err}"
    if not isinstance(header, dict):
        return "has a corrupt safetensors header (not a JSON object)"
    tensors = [info for name, info in header.items() if name != "__metadata__"]
    if not tensors:
        return "contains no tensors"
    try:
        data_end = max(int(info["data_offsets"][1]) for info in tensors)
    except (KeyError, TypeError, ValueError, IndexError):
        return "has a corrupt safetensors header (bad data_offsets)"
    if 8 + header_length + data_end > size:
        return f"is truncated: its header describes {8 + header_length + data_end} bytes but the file has {size}"
    return None


def safetensors_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a .safetensors file is unreadable (empty, truncated, corrupt header), or None when it is whole.

    >>> import tempfile, pathlib
    >>> bad = pathlib.Path(tempfile.mkdtemp()) / "model.safetensors"
    >>> _ = bad.write_bytes(b"\\x10")
    >>> safetensors_problem(bad)
    '... is truncated (1 bytes): no safetensors header'
    """
    weights = absolute_path(path)
    problem = _weights_problem(weights)
    return f"{weights} {problem}" if problem else None


def _is_complete_adapter(directory: Path) -> bool:
    """Whether `directory` holds a valid adapter (no hint search, which would recurse)."""
    try:
        _read_config(directory)
        _find_weights(directory)
    except OSError:  # an AdapterError too
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
        leftovers = previous_versions(directory)
        if leftovers:
            return f"an interrupted save left the previous version at {leftovers[-1]}; rename it to {directory.name}"
    except OSError:
        pass
    return ""
