"""Trimming a carried wheel to what the GPU check runs (wheels.py build): which files of bitsandbytes, unsloth and
vllm stay (`keep_file`), and the wheel rewritten with its RECORD (`trim_wheel`)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import zipfile
from pathlib import Path

from vllm_set import (
    PYTHON_VERSION,
    VLLM_DROPPED,
    VLLM_DROPPED_THIRD_PARTY_SUFFIXES,
    VLLM_THIRD_PARTY,
    WheelSetError,
    canonical,
)


# The wheels that are trimmed (keep_file says what each keeps).
TRIMMED = ("bitsandbytes", "unsloth", "vllm")

BNB_KEPT_LIBRARIES = ("libbitsandbytes_cuda130.so", "libbitsandbytes_cpu.so")  # of its 15 native libraries


UNSLOTH_KEPT_PREFIXES = ("unsloth/", "unsloth-")  # the package and its .dist-info; not studio/, not unsloth_cli/


def keep_file(package: str, path: str) -> bool:
    """Whether a trimmed wheel keeps the file at `path` (always True for untrimmed packages).

    >>> keep_file("bitsandbytes", "bitsandbytes/libbitsandbytes_cuda128.so")
    False
    >>> keep_file("bitsandbytes", "bitsandbytes/libbitsandbytes_cuda130.so")
    True
    >>> keep_file("bitsandbytes", "bitsandbytes/nn/modules.py")
    True
    >>> keep_file("unsloth", "studio/backend/app.py"), keep_file("unsloth", "unsloth/models/llama.py")
    (False, True)
    >>> [keep_file("vllm", p) for p in ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    ...                                 "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/third_party/pynvml.py",
    ...                                 "vllm/third_party/deep_gemm/include/cute/tensor.hpp",
    ...                                 "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
    ...                                 "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so")]
    [False, True, True, False, False, True]
    """
    key = canonical(package)
    if key == "bitsandbytes":
        base = path.rsplit("/", 1)[-1]
        return not (base.startswith("libbitsandbytes_") and base not in BNB_KEPT_LIBRARIES)
    if key == "unsloth":
        return path.startswith(UNSLOTH_KEPT_PREFIXES)
    if key == "vllm":
        if path in VLLM_DROPPED:
            return False
        if path.startswith(VLLM_THIRD_PARTY):
            base = path.rsplit("/", 1)[-1]
            other_python = ".cpython-3" in base and f".cpython-{PYTHON_VERSION.replace('.', '')}-" not in base
            return not (base.endswith(VLLM_DROPPED_THIRD_PARTY_SUFFIXES) or other_python)
    return True


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def trim_wheel(path: Path, package: str) -> tuple[int, int]:
    """Rewrite the wheel at `path` without the files `keep_file` drops; returns (files kept, files dropped).

    The RECORD file is rewritten to list what is left, with fresh hashes, so pip installs a
    consistent package. The new wheel replaces the old one only once it is complete.
    """
    kept = dropped = 0
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        record_name = next((n for n in src.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record_name is None:
            raise WheelSetError(f"{path.name} has no .dist-info/RECORD; is it a wheel?")
        rows = []
        for info in src.infolist():
            if info.filename == record_name:
                continue
            if not keep_file(package, info.filename):
                dropped += 1
                continue
            data = src.read(info)
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            rows.append([info.filename, _record_hash(data), str(len(data))])
            kept += 1
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows([*rows, [record_name, "", ""]])
        dst.writestr(record_name, buffer.getvalue())
    os.replace(tmp, path)
    return kept, dropped
