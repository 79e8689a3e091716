"""The wheel set the GPU check carries to a machine that has no internet.

The lent GPU machine (Python 3.12, torch 2.11 + CUDA 13.0, transformers 5.17.0, peft, accelerate,
triton; see scripts/gpu_check/run_check.py) lacks trl, datasets, bitsandbytes, unsloth, unsloth_zoo
and math-verify. This script downloads those, at the versions of the GPU set's lock, with the
dependencies of theirs that the machine's image lacks, trims the two large wheels, and installs
them there without an index:

    python scripts/gpu_check/wheels.py build      # here: download + trim into .gpu-wheels/, print the size
    python scripts/gpu_check/wheels.py check      # here: the set on disk + the working tree fit the 64 MiB limit
    python3 scripts/gpu_check/wheels.py install --target /tmp/site   # on the GPU machine

With `--vllm` the set also holds vLLM 0.26.0 and the packages of its closure that the image lacks (VLLM_VERSION,
VLLM_DEPENDENCIES), in .gpu-wheels-vllm/; that set is far over 64 MiB even trimmed, so it travels in parts
(scripts/gpu_check/parts.py: split, store, assemble):

    python scripts/gpu_check/wheels.py build --vllm       # here: download + trim into .gpu-wheels-vllm/
    python scripts/gpu_check/wheels.py resolve-vllm       # here, after a version change: pip's resolver -> the record

Trimming (why the set fits at all):
- bitsandbytes ships one native library per CUDA/ROCm/XPU version (43 MB); the GPU machine's torch is
  a CUDA 13.0 build, so only libbitsandbytes_cuda130.so (and the small CPU one) is kept.
- unsloth's wheel is mostly its `studio/` web UI and the `unsloth_cli` commands; only the importable
  `unsloth` package and its metadata are kept.
- vllm 0.26.0's wheel is 289 MiB; about 100 MiB is left without the parts a dense model on sm90 never loads
  (VLLM_DROPPED, each with the reason read in the wheel's own code).
Each trimmed wheel's RECORD is rewritten to list exactly the files it still holds.

pip does the downloading and installing; what is hand-written is the trimming (no tool removes files
from a wheel) and the size check against the device's carry limit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from checkout import checkout_site  # beside this file: sys.path[0] as a script
from trim import TRIMMED, trim_wheel
from vllm_set import (
    PYTHON_VERSION,
    VLLM_DEPENDENCIES,
    VLLM_DROPPED,
    VLLM_DROPPED_THIRD_PARTY_SUFFIXES,
    VLLM_ENGINE_MODULES,
    VLLM_LEFT_OUT,
    VLLM_RECORD,
    VLLM_THIRD_PARTY,
    VLLM_VERSION,
    WheelSetError,
    canonical,
    probe_imports,
    requirement_applies,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
WHEEL_DIR = REPO_ROOT / ".gpu-wheels"  # git-ignored (.gitignore); named in the device command's carry
VLLM_WHEEL_DIR = REPO_ROOT / ".gpu-wheels-vllm"  # git-ignored: the set with vLLM, split into parts (parts.py)
MANIFEST_NAME = "manifest.json"
CARRY_LIMIT_BYTES = 64 * 1024 * 1024  # the device's limit on the working tree plus carried paths
# pip matches manylinux tags exactly, so every glibc level a wheel might be tagged with is listed
# (bitsandbytes 0.50.2 is manylinux_2_24, msgspec manylinux_2_28, hf_transfer manylinux_2_17).
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]

# The packages the GPU machine lacks, by their known_good.toml names: their versions come from the GPU set's lock.
PINNED_ROOTS = ("trl", "datasets", "bitsandbytes", "unsloth", "unsloth_zoo", "math-verify")

# Their dependencies (Requires-Dist, no extras, linux x86_64) that the GPU machine's image lacks, and
# those dependencies' own. Versions: the newest that satisfies every specifier on 2026-11-30.
DEPENDENCIES = {
    "dill": "0.4.1",  # datasets: dill>=0.3.0,<0.4.2; multiprocess 0.70.19: dill>=0.4.1
    "multiprocess": "0.70.19",  # datasets: multiprocess<0.70.20
    "latex2sympy2_extended": "1.11.0",  # math-verify==0.9.0: latex2sympy2_extended==1.11.0
    "antlr4-python3-runtime": "4.13.2",  # latex2sympy2_extended: >=4.9.3,<=4.13.2
    "cut_cross_entropy": "25.1.1",  # unsloth_zoo
    "msgspec": "0.23.0",  # unsloth_zoo
    "hf_transfer": "0.1.9",  # unsloth, unsloth_zoo
    "json5": "0.17.3",  # unsloth: json5>=0.9.25
    "nest-asyncio": "1.6.0",  # unsloth
    "structlog": "26.1.0",  # unsloth: structlog>=24.1.0
    "tyro": "1.0.17",  # unsloth, unsloth_zoo
    "docstring-parser": "0.18.0",  # tyro: >=0.16
    "typeguard": "4.6.1",  # tyro: >=4.0.0
    "pydantic": "2.14.4",  # unsloth
    "pydantic-core": "2.50.5",  # pydantic 2.14.4: ==2.50.5
    "annotated-types": "0.8.0",  # pydantic: >=0.6.0
    "typing-inspection": "0.4.5",  # pydantic: >=0.4.4
}

# Declared requirements deliberately left behind, with the reason. The check states them.
LEFT_OUT = {
    "vllm": "its 0.31.0 wheel is 320 MB (CUDA kernels), far over the carry limit, and pins torch==2.13.0 beside "
            "the machine's torch 2.11; fast_inference is covered by the contract tests only",
    "vllm-bnb-plugin": "only used inside vLLM",
    "xformers": "its PyPI wheel is a CUDA 12 build (libcudart.so.12) beside a CUDA 13 torch; unsloth falls back "
                "to PyTorch SDPA without it (env/known_good.toml: xformers-cu12-beside-cuda13-torch)",
    "torchao": "a compiled extension built per torch release; unsloth checks importlib.util.find_spec('torchao') "
               "and runs without it, while a build for another torch can break the import",
    "diffusers": "declared by unsloth but imported nowhere in the unsloth or unsloth_zoo packages (only the "
                 "studio UI, which is trimmed away)",
}


# Packages the GPU machine's image already has (its `cuda` image, as read on 2026-11-17), by canonical
# name. A requirement on one of these is satisfied there and is not carried.
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec
patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())


@dataclass(frozen=True)
class Wanted:
    name: str
    version: str
    source: str  # "known_good.toml" or "dependency"

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def wanted_wheels(vllm: bool = False) -> list[Wanted]:
    """Every wheel of the set, pinned: the roots at their versions in the GPU set's lock (env/pylock.gpu.toml),
    then DEPENDENCIES; with `vllm` also vllm VLLM_VERSION and VLLM_DEPENDENCIES (source "vllm")."""
    from grpo_pipeline.env.matrix import locked_versions

    locked = locked_versions("gpu")
    out = [Wanted(name, locked[canonical(name)], "known_good.toml") for name in PINNED_ROOTS]
    out.extend(Wanted(name, version, "dependency") for name, version in DEPENDENCIES.items())
    if vllm:
        out.append(Wanted("vllm", VLLM_VERSION, "vllm"))
        out.extend(Wanted(name, version, "vllm") for name, version in VLLM_DEPENDENCIES.items())
    return out


def resolve_vllm(pip: list[str] | None = None, record_path: Path = VLLM_RECORD) -> list[str]:
    """Run pip's resolver for vllm==VLLM_VERSION on the GPU machine's platform (a dry run: it reads metadata, and
    downloads a wheel only where the index serves no separate METADATA, torch's CUDA set included, several GB),
    store the records of vllm and of each package the image lacks (VLLM_RECORD), and return one line for each
    such package that is neither carried nor left out with a reason, or that is carried at another version."""
    import tempfile

    platform_args = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(scratch) / "report.json"
        command = [*(pip or [sys.executable, "-m", "pip"]), "install", "--dry-run", "--ignore-installed",
                   "--target", str(Path(scratch) / "never"), "--only-binary=:all:", "--python-version",
                   PYTHON_VERSION, "--implementation", "cp", *platform_args, "--report", str(report_path),
                   f"vllm=={VLLM_VERSION}"]
        if subprocess.run(command).returncode != 0:
            raise WheelSetError("pip's resolver failed for vllm (see its message above); it needs PyPI")
        report = json.loads(report_path.read_text(encoding="utf-8"))
    return store_vllm_record(report, record_path)


def store_vllm_record(report: dict, record_path: Path = VLLM_RECORD) -> list[str]:
    """resolve_vllm's second half: the records from a `pip install --report` document, and the lines to act on."""
    from packaging.requirements import Requirement


    image = {canonical(name) for name in IMAGE_PACKAGES}
    carried = {canonical(w.name): w.version for w in wanted_wheels(vllm=True)}
    records = [r for r in record_from_report(report) if canonical(r["name"]) not in image]
    records = [{**r, "requires_dist": sorted(r["requires_dist"])} for r in sorted(records, key=lambda r: r["name"])]
    # Stored: vllm and what the kit carries of its closure (the test checks their requirements offline).
    record_path.write_text(json.dumps({"python": PYTHON_VERSION, "platform": "manylinux x86_64", "records": [
        r for r in records if canonical(r["name"]) in carried]}, indent=1) + "\n", encoding="utf-8")
    left_out = {canonical(name) for name in {**LEFT_OUT, **VLLM_LEFT_OUT}}
    problems = []
    for record in records:
        key = canonical(record["name"])
        if key in carried and carried[key] != record["version"]:
            problems.append(f"{key}: carried at {carried[key]}, pip resolved {record['version']}")
    # Only vllm's own requirements must be decided one by one; the rest of the closure comes with them.
    for line in next(r for r in records if canonical(r["name"]) == "vllm")["requires_dist"]:
        requirement = Requirement(line)
        key = canonical(requirement.name)
        if requirement_applies(requirement, PYTHON_VERSION) and key not in image | set(carried) | left_out:
            problems.append(f"{key}: vllm needs {line}; carry it (VLLM_DEPENDENCIES) or say why not (VLLM_LEFT_OUT)")
    return problems


def record_from_report(report: dict) -> list[dict]:
    """The stored records (one per package pip would install) from a `pip install --report` JSON document."""
    return [{"name": item["metadata"]["name"], "version": item["metadata"]["version"],
             "requires_python": item["metadata"].get("requires_python"),
             "requires_dist": item["metadata"].get("requires_dist", []),
             "source": {"file": item.get("download_info", {}).get("url", "").rsplit("/", 1)[-1],
                        "sha256": item.get("download_info", {}).get("archive_info", {}).get("hashes", {}).get("sha256"),
                        "pip": report.get("pip_version")}}
            for item in report.get("install", [])]


def working_tree_bytes(root: Path = REPO_ROOT) -> int:
    """Bytes of what the device copies: tracked plus untracked-not-ignored files (git's own list)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            check=True, capture_output=True).stdout.decode().split("\0")
    return sum((root / name).stat().st_size for name in set(listed) if name and (root / name).is_file())


def set_bytes(folder: Path = WHEEL_DIR) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.whl"))


def check_size(wheels: int, tree: int, limit: int = CARRY_LIMIT_BYTES) -> str:
    """One line with the sizes; raises WheelSetError when set + tree would pass the carry limit.

    >>> check_size(10 * 2**20, 3 * 2**20)
    'wheel set 10.0 MiB + working tree 3.0 MiB = 13.0 MiB of the 64.0 MiB the device carries'
    """
    mib = 2**20
    line = (f"wheel set {wheels / mib:.1f} MiB + working tree {tree / mib:.1f} MiB = {(wheels + tree) / mib:.1f} MiB")
    if wheels + tree > limit:
        raise WheelSetError(f"{line}, over the {limit / mib:.1f} MiB the device carries; trim the set or the tree "
                            "(untracked files count unless git ignores them)")
    return f"{line} of the {limit / mib:.1f} MiB the device carries"


def _wheel_name_version(path: Path) -> tuple[str, str]:
    name, version = path.name.split("-")[:2]
    return canonical(name), version


def build(folder: Path = WHEEL_DIR, pip: list[str] | None = None, vllm: bool = False) -> dict:
    """Download the set into `folder` (with `vllm`, the set with vLLM), trim it and write manifest.json. Returns
    the manifest."""
    wanted = wanted_wheels(vllm=vllm)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.whl"):  # one version of each package: two would stop the install
        stale.unlink()
    platform_args = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [*(pip or [sys.executable, "-m", "pip"]), "download", "--no-deps", "--only-binary=:all:",
               "--python-version", PYTHON_VERSION, "--implementation", "cp", *platform_args, "-d", str(folder),
               *[w.requirement for w in wanted]]
    if subprocess.run(command).returncode != 0:
        raise WheelSetError("pip download failed (see its message above); it needs PyPI")
    found = {_wheel_name_version(p): p for p in folder.glob("*.whl")}
    entries = []
    for w in wanted:
        path = found.get((canonical(w.name), w.version))
        if path is None:
            raise WheelSetError(f"pip did not download {w.requirement} into {folder}")
        downloaded = path.stat().st_size
        trimmed = None
        if canonical(w.name) in TRIMMED:
            kept, dropped = trim_wheel(path, w.name)
            trimmed = {"files_kept": kept, "files_dropped": dropped, "downloaded_bytes": downloaded}
        entries.append({"name": w.name, "version": w.version, "source": w.source, "file": path.name,
                        "bytes": path.stat().st_size, "trimmed": trimmed})
    left_out = {**{k: v for k, v in LEFT_OUT.items() if k != "vllm"}, **VLLM_LEFT_OUT} if vllm else LEFT_OUT
    manifest = {"python": PYTHON_VERSION, "wheels": entries, "left_out": left_out}
    if vllm:
        suffixes = ",".join(suffix.lstrip(".") for suffix in VLLM_DROPPED_THIRD_PARTY_SUFFIXES)
        manifest["vllm_dropped"] = {
            **VLLM_DROPPED,
            f"{VLLM_THIRD_PARTY}**/*.{{{suffixes}}}": "JIT sources of DeepGEMM (FP8 block GEMM) and fmha_sm100 (sm100)",
            f"{VLLM_THIRD_PARTY}**/*.cpython-3XX-*.so": f"builds for Pythons other than {PYTHON_VERSION}"}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def install(target: Path, folder: Path = WHEEL_DIR) -> None:
    """pip install the set into `target` with no index and no dependency resolution (the device's recipe)."""
    manifest_path = folder / MANIFEST_NAME
    if not manifest_path.is_file():
        raise WheelSetError(f"{manifest_path} is missing: run `python scripts/gpu_check/wheels.py build` first and "
                            "carry .gpu-wheels")
    files = [folder / entry["file"] for entry in json.loads(manifest_path.read_text())["wheels"]]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise WheelSetError(f"{folder} lacks {missing}; rebuild the set")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, files)])
    if done.returncode != 0:
        raise WheelSetError(f"pip could not install the set into {target} (see pip's message above); the set is "
                            f"built for CPython {PYTHON_VERSION} on manylinux x86_64")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wheels.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="print the pinned wheel list (no download)")
    build_parser = sub.add_parser("build", help="download and trim the set into .gpu-wheels/, then check its size")
    build_parser.add_argument("--vllm", action="store_true", help=f"the set with vllm {VLLM_VERSION}, into "
                              f"{VLLM_WHEEL_DIR.name}/ (it travels in parts: parts.py split)")
    sub.add_parser("check", help="check that the built set plus the working tree fit the carry limit")
    sub.add_parser("resolve-vllm", help=f"pip's resolver for vllm=={VLLM_VERSION} -> {VLLM_RECORD.name}; names what "
                   "the image lacks and the kit neither carries nor leaves out with a reason")
    sub.add_parser("probe-vllm", help="import the offline vLLM engine's modules from PYTHONPATH (the installed set "
                   "and the image's packages): names any package the set lacks; exit 1 then")
    install_parser = sub.add_parser("install", help="install the set into --target (on the GPU machine)")
    install_parser.add_argument("--target", required=True)
    install_parser.add_argument("--folder", type=Path, default=WHEEL_DIR, help="the built set (default .gpu-wheels)")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for w in wanted_wheels():
                print(f"{w.requirement:40s} {w.source}")
            for name, why in LEFT_OUT.items():
                print(f"{name:40s} left out: {why}")
            return 0
        if args.command == "probe-vllm":
            missing, other = probe_imports()
            import vllm

            print(f"vllm {vllm.__version__} ({vllm.__file__}): {len(VLLM_ENGINE_MODULES) - len(missing) - len(other)} "
                  f"of {len(VLLM_ENGINE_MODULES)} modules import here")
            for module, name in missing.items():
                print(f"  {module}: needs {name}, which the set lacks (carry it: VLLM_DEPENDENCIES)")
            for module, error in other.items():
                print(f"  {module}: {error} (not a missing package: needs the GPU machine, or look at it)")
            return 1 if missing else 0
        if args.command == "resolve-vllm":
            problems = resolve_vllm()
            print(f"wrote {VLLM_RECORD.relative_to(REPO_ROOT)}")
            for line in problems:
                print(f"  {line}")
            return 1 if problems else 0
        if args.command == "build":
            manifest = build(VLLM_WHEEL_DIR if args.vllm else WHEEL_DIR, vllm=args.vllm)
            for entry in manifest["wheels"]:
                trimmed = entry["trimmed"]
                note = f" (trimmed from {trimmed['downloaded_bytes'] / 2**20:.1f} MiB)" if trimmed else ""
                print(f"{entry['file']:75s} {entry['bytes'] / 2**20:6.2f} MiB{note}")
            if args.vllm:
                print(f"the set with vLLM: {set_bytes(VLLM_WHEEL_DIR) / 2**20:.1f} MiB in {VLLM_WHEEL_DIR.name}/; "
                      "next: python scripts/gpu_check/parts.py split")
                return 0
        if args.command == "install":
            install(Path(args.target), args.folder)
            print(f"installed the wheel set into {args.target}")
            return 0
        print(check_size(set_bytes(), working_tree_bytes()))
    except WheelSetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    checkout_site()  # grpo_pipeline from this checkout, installed or not
    raise SystemExit(main())
