"""Facts about this machine for `grpo env`: Python, OS, platform hints, installed packages, GPU.

Every probe returns plain data and never raises: a half-installed environment (METADATA without a module, an
unparsable version, a torch that fails to import) is reported, not crashed on. Only `gpu_info()` may import torch,
and only when an NVIDIA GPU is visible from the filesystem first: importing torch costs seconds.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

_DRIVER_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


def python_info() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


def os_info() -> dict[str, Any]:
    return {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "platform": platform.platform(terse=True),
    }


def platform_hints() -> dict[str, bool]:
    """Cheap guesses at the hosting platform, to suggest a profile: Colab sets COLAB_* environment variables,
    AutoDL mounts its data disk at /root/autodl-tmp."""
    return {
        "colab": any(key.startswith("COLAB_") for key in os.environ),
        "autodl": Path("/root/autodl-tmp").is_dir(),
        "wsl": "microsoft" in platform.release().lower(),
    }


@dataclass
class Installed:
    """What is on disk for one package."""

    name: str
    state: str  # "installed", "missing" or "broken"
    version: str | None = None  # None when missing, or when METADATA has no Version
    detail: str = ""  # why it is broken
    requires: tuple[str, ...] = ()  # its Requires-Dist lines, for the constraint check


def installed_package(name: str, module: str) -> Installed:
    """Look `name` up through importlib.metadata (first match on sys.path, as import would) without importing it.
    "broken": METADATA exists but the version is absent/unparsable, or the import name `module` cannot be found
    (a half-finished `pip uninstall`, a deleted site-packages folder)."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return Installed(name, "missing")
    except Exception as err:  # noqa: BLE001 - a corrupt dist-info can make the lookup itself fail
        return Installed(name, "broken", detail=f"reading its metadata failed: {type(err).__name__}: {err}")
    try:
        version = dist.version
    except Exception as err:  # noqa: BLE001 - a probe must report, never crash
        return Installed(name, "broken", detail=f"METADATA unreadable: {type(err).__name__}: {err}")
    try:
        requires = tuple(dist.requires or ())
    except Exception:  # noqa: BLE001 - a probe must report, never crash
        requires = ()
    broken = lambda detail, version=version: Installed(name, "broken", version, detail, requires)  # noqa: E731
    if not version:
        return broken("METADATA has no Version field", None)
    try:
        Version(version)
    except InvalidVersion:
        return broken(f"version {version!r} is not PEP 440")
    try:
        spec, error = importlib.util.find_spec(module), "not found on sys.path"
    except Exception as err:  # noqa: BLE001 - a probe must report, never crash
        spec, error = None, f"{type(err).__name__}: {err}"
    if spec is None:
        return broken(f"METADATA says {version} but module {module!r} is {error} (half-installed? reinstall it)")
    return Installed(name, "installed", version=version, requires=requires)


def torch_build() -> dict[str, Any]:
    """torch's version and the CUDA/HIP it was built for, read from torch/version.py *without* importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except Exception:  # noqa: BLE001 - a probe must report, never crash
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return {}
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        tree = ast.parse(version_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    values: dict[str, Any] = {}
    for node in tree.body:  # generated as plain assignments: `cuda: Optional[str] = '13.0'`
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        name = targets[0].id if len(targets) == 1 and isinstance(targets[0], ast.Name) else None
        if name in ("__version__", "cuda", "hip") and isinstance(node.value, ast.Constant):
            values[name.strip("_")] = node.value.value
    return values


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver version (e.g. "580.65.06"), or None: /proc first, then `nvidia-smi` (the only source on
    WSL2 and in containers that do not mount /proc/driver/nvidia)."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text(errors="replace")
    except OSError:
        return nvidia_smi_driver_version()
    match = _DRIVER_VERSION.search(text)
    return match.group(1) if match else nvidia_smi_driver_version()


def _nvidia_smi_first_line(*args: str) -> str | None:
    """The first line `nvidia-smi ARGS` prints (the first GPU), or None (no nvidia-smi, no GPU, an error)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return lines[0] if out.returncode == 0 and lines else None


def nvidia_smi_driver_version() -> str | None:
    """`nvidia-smi --query-gpu=driver_version`: the driver of the first GPU, or None (no nvidia-smi, no GPU)."""
    line = _nvidia_smi_first_line("--query-gpu=driver_version", "--format=csv,noheader")
    return line if line and re.fullmatch(r"\d+(?:\.\d+)+", line) else None


def nvidia_smi_memory() -> dict[str, Any] | None:
    """`nvidia-smi --query-gpu=name,memory.total,memory.free` of the first GPU (MiB), or None; no torch. The memory
    planner (`grpo plan`, the `memory` check) plans for the card that is really here."""
    line = _nvidia_smi_first_line("--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits")
    fields = [part.strip() for part in (line or "").rsplit(",", 2)]
    try:
        return {"name": fields[0], "total_mib": float(fields[1]), "free_mib": float(fields[2])}
    except (IndexError, ValueError):
        return None


# The oldest Linux driver that runs a CUDA major version's runtime (NVIDIA's CUDA toolkit release notes,
# "minor version compatibility"): a torch built for CUDA 13.x sees no GPU on a driver below 580.
MIN_DRIVER_FOR_CUDA = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}


@dataclass(frozen=True)
class CudaUsability:
    """Whether torch could use an NVIDIA GPU here, decided WITHOUT importing torch (see `cuda_usability`)."""

    usable: bool
    reason: str  # why not (or what was found), in words
    driver: str | None = None
    torch_cuda: str | None = None
    driver_needed: str | None = None


def cuda_usability() -> CudaUsability:
    """Can torch use CUDA here? From torch/version.py, the driver version and CUDA_VISIBLE_DEVICES only: importing
    torch costs seconds, and must not precede `import unsloth` (unsloth_zoo sets PYTORCH_ALLOC_CONF at its import)."""
    build = torch_build()
    if not build:
        return CudaUsability(False, "torch is not installed")
    torch_cuda = build.get("cuda")
    if not torch_cuda:
        return CudaUsability(False, f"this torch ({build.get('version', '?')}) is a CPU-only build")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return CudaUsability(False, f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU", torch_cuda=torch_cuda)
    driver = nvidia_driver_version()
    if driver is None:
        return CudaUsability(False, "no NVIDIA device: no driver answered (/proc/driver/nvidia/version is absent and "
                             "`nvidia-smi --query-gpu=driver_version` found no GPU)", torch_cuda=torch_cuda)
    needed = MIN_DRIVER_FOR_CUDA.get(str(torch_cuda).split(".")[0])
    if needed and Version(driver) < Version(needed):
        torch_version = build.get("version", "?")
        return CudaUsability(False, f"NVIDIA driver {driver} is too old for this torch build (torch {torch_version} "
                             f"is built for CUDA {torch_cuda}, which needs driver >= {needed})", driver, torch_cuda,
                             needed)
    return CudaUsability(True, f"NVIDIA driver {driver}, torch built for CUDA {torch_cuda}", driver, torch_cuda,
                         needed)


def nvidia_evidence() -> list[str]:
    """Filesystem signs of an NVIDIA GPU; empty means none, and then torch is not imported at all."""
    evidence = []
    try:
        gpus = Path("/proc/driver/nvidia/gpus")
        if gpus.is_dir() and any(gpus.iterdir()):
            evidence.append("/proc/driver/nvidia/gpus")
        devices = sorted(p.name for p in Path("/dev").glob("nvidia[0-9]*"))
        if devices:
            evidence.append("/dev/" + devices[0])
        if Path("/dev/dxg").exists():  # WSL2 exposes GPUs through /dev/dxg
            evidence.append("/dev/dxg")
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        evidence.append("nvidia-smi on PATH")
    return evidence


def gpu_info(torch_state: str) -> dict[str, Any]:
    """GPU name, memory, compute capability and bf16 support via torch, or the reason it was not probed; torch is
    imported only when `torch_state` (its `Installed.state`) is "installed" and a GPU is visible."""
    info: dict[str, Any] = {"probed": False, "evidence": nvidia_evidence(), "driver": nvidia_driver_version(),
                            "torch_cuda": torch_build().get("cuda"), "devices": []}
    if torch_state != "installed":
        info["reason"] = f"torch is {torch_state}"
        return info
    if not info["evidence"]:
        info["reason"] = ("no NVIDIA GPU visible (no /proc/driver/nvidia, /dev/nvidia*, /dev/dxg or nvidia-smi); "
                          "torch not imported")
        return info
    try:
        import torch  # the one heavy import in `grpo env`, only on machines that show a GPU
    except Exception as err:  # noqa: BLE001 - a broken torch install fails at import in many ways (missing .so, ABI)
        info["reason"] = f"import torch failed: {type(err).__name__}: {err}"
        return info
    info["probed"] = True
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        driver_api = getattr(torch._C, "_cuda_getDriverVersion", None)
        if driver_api is not None and torch.version.cuda:
            raw = int(driver_api())  # e.g. 12040 -> CUDA 12.4: the newest CUDA this driver supports
            info["driver_cuda"] = f"{raw // 1000}.{raw % 1000 // 10}" if raw else None
        if not info["cuda_available"]:
            info["reason"] = (
                "torch is a CPU build" if not torch.version.cuda else
                f"torch (built for CUDA {torch.version.cuda}) sees no usable GPU: driver too old or no device"
            )  # fmt: skip
            return info
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            # Native bf16 needs Ampere (sm80)+. torch.cuda.is_bf16_supported() can say True on older cards through
            # emulation, but vLLM refuses bf16 below 8.0, so that is the test.
            info["devices"].append({"index": index, "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                                    "compute_capability": f"{props.major}.{props.minor}", "bf16": props.major >= 8})
    except Exception as err:  # noqa: BLE001 - a probe must report, never crash
        info["error"] = f"{type(err).__name__}: {err}"
    return info
