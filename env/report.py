"""The `grpo env` report as data: installed packages against the known-good matrix, the GPU, known-bad
combinations, which training modes can run here, and the pip command that fixes what is off.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping
from typing import Any

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from grpo_pipeline.env import imports, probes
from grpo_pipeline.env.kept import versions
from grpo_pipeline.env.matrix import KnownBad, Matrix, MatrixError, Pin, Profile, load_matrix, pip_install_command

# unsloth, unsloth_zoo or vllm installed means the user is setting up the GPU backend.
GPU_MARKERS = ("unsloth", "unsloth-zoo", "vllm")


def collect_report(profile: str | None = None, *, modules: Mapping[str, object] | None = None,
                   model_source: str = "hf") -> dict[str, Any]:
    """The whole `grpo env` report as JSON-ready data, `profile` ("colab-t4") compared with this machine; `modules`:
    the import-order check's table (default `sys.modules`)."""
    started = time.perf_counter()
    matrix = load_matrix()
    errors: list[str] = []  # probes that failed: reported, never raised, never silently dropped

    def safe(section: str, probe, default: Any) -> Any:
        try:
            return probe()
        except Exception as err:  # noqa: BLE001 - a probe must report, never crash
            errors.append(f"{section}: {type(err).__name__}: {err}")
            return default

    report: dict[str, Any] = {"schema": 1}
    report["python"] = safe("python", probes.python_info, {})
    report["os"] = safe("os", probes.os_info, {})
    report["platform"] = safe("platform", probes.platform_hints, {})

    pins = {**matrix.plain, **matrix.gpu}
    found = {key: _safe_installed(pin) for key, pin in pins.items()}

    chosen = matrix.profiles.get(profile) if profile else None
    if profile and chosen is None:
        raise MatrixError(f"unknown profile {profile!r}; choose one of {sorted(matrix.profiles)}")
    gpu_markers = any(found[key].state != "missing" for key in GPU_MARKERS if key in found)
    mode = report["mode"] = chosen.install if chosen else "gpu" if gpu_markers else "plain"

    no_gpu = {"probed": False, "reason": "GPU probe failed (see probe_errors)", "devices": []}
    report["gpu"] = safe("gpu", lambda: probes.gpu_info(found["torch"].state), no_gpu)
    rows = report["packages"] = _package_rows(matrix, mode, found)
    report["constraint_conflicts"] = safe("constraint_conflicts", lambda: _constraint_conflicts(found, pins), [])
    report["known_bad"] = safe("known_bad", lambda: _known_bad(matrix.known_bad, found, report), [])
    report["import_order"] = {
        "problems": imports.import_order_problems(modules),
        "unsloth_imported": "unsloth" in (sys.modules if modules is None else modules),
        "note": "checks this process only: call grpo_pipeline.env.imports.require_unsloth_first() in your own script",
    }
    report["profile"] = _profile_section(chosen, report["gpu"]) if chosen else None
    report["suggested_profile"] = safe("suggested_profile", lambda: _suggest_profile(matrix, report), None)

    usable_problems = _plain_usable_problems(matrix, found)
    report["plain_backend_usable"] = not usable_problems
    report["plain_backend_problems"] = usable_problems
    report["fix_command"] = _fix_command(matrix, mode, rows, chosen)
    report["gpu_install_command"] = pip_install_command(chosen.id if chosen else "gpu", matrix)
    report["unsloth_modes"] = _unsloth_modes(matrix, found, report)
    vllm = matrix.gpu.get("vllm")
    report["vllm_pin"] = {"pin": vllm.requirement, "why": vllm.why, "evidence": dict(vllm.evidence)} if vllm else None
    # What the GPU set has not been shown to do (known_good.toml `risk`), whatever is installed here.
    report["gpu_risks"] = [{"package": pin.name, "pin": pin.requirement, "risk": pin.risk}
                           for pin in matrix.packages("gpu").values() if pin.risk]
    report["vllm_cpu"] = safe("vllm_cpu", _vllm_cpu_build, None)
    report["strict_problems"] = ([f"{row['name']}: {row['status']} (wants {row['pin']}, has {row['installed']})"
                                  for row in rows if row["status"] != "ok"]
                                 + [conflict["message"] for conflict in report["constraint_conflicts"]]
                                 + [f"known-bad {bad['id']}" for bad in report["known_bad"] if bad["severity"] == "error"]
                                 + report["plain_backend_problems"])
    report["hubs"] = safe("hubs", lambda: hubs_section(model_source), {})
    report["probe_errors"] = errors
    report["elapsed_s"] = round(time.perf_counter() - started, 3)
    return report


def version_satisfies(version: str | None, specifier: str | SpecifierSet) -> bool | None:
    """True/False, or None when `version` is missing or not PEP 440 (half-installed packages). Local labels are
    ignored the PEP 440 way ("2.14.0+cu130" satisfies "==2.14.0").

    >>> version_satisfies("2.14.0+cu130", "==2.14.0"), version_satisfies("garbage", ">=1"), version_satisfies("1.0", "")
    (True, None, True)
    """
    try:
        return SpecifierSet(str(specifier)).contains(Version(version), prereleases=True) if version else None
    except InvalidVersion:
        return None


def _vllm_cpu_build() -> dict[str, str] | None:
    """vLLM's CPU build when it is installed (pyproject's `vllm-cpu` extra: the distribution `vllm-cpu`, module
    `vllm`), with what it serves here; None when it is not. The GPU set's `vllm` row stays "missing" beside it."""
    version = versions("vllm-cpu")["vllm-cpu"]
    return None if version is None else {
        "version": version, "serves": "the plain backend's vllm_mode: colocate and grpo generate/eval through vLLM on "
                                      "this CPU; Unsloth's fast_inference needs vllm on a GPU"}


def _safe_installed(pin: Pin) -> probes.Installed:
    try:
        return probes.installed_package(pin.name, pin.module)
    except Exception as err:  # noqa: BLE001 - a probe must report, never crash
        return probes.Installed(pin.name, "broken", detail=f"probe failed: {type(err).__name__}: {err}")


def _package_rows(matrix: Matrix, mode: str, found: Mapping[str, probes.Installed]) -> list[dict[str, Any]]:
    """One row per package of the mode's set; in plain mode the GPU-only packages are listed too."""
    shown = {key: (pin, mode) for key, pin in matrix.packages(mode).items()}
    if mode == "plain":
        shown.update({key: (pin, "gpu") for key, pin in matrix.gpu_only().items()})
    rows = []
    for key, (pin, set_name) in shown.items():
        installed = found[key]
        status = installed.state if installed.state in ("missing", "broken") else (
            "ok" if version_satisfies(installed.version, matrix.specifier(set_name, key)) else "drift")
        rows.append({
            "name": pin.name,
            "set": pin.group,  # for torch in GPU mode: "gpu", whose exact pin is the one that binds
            "pin": pin.spec,
            "installed": installed.version,
            "status": status,
            "core": pin.core,
            "detail": installed.detail,
            "disables": pin.disables if status in ("missing", "broken") else "",
        })
    return rows


def _constraint_conflicts(found: Mapping[str, probes.Installed], pins: Mapping[str, Pin]) -> list[dict[str, str]]:
    """Like `pip check`, limited to our packages: installed Requires-Dist that installed versions break."""
    environment = default_environment()
    environment["extra"] = ""
    conflicts = []
    for key, installed in found.items():
        if installed.state != "installed":
            continue
        for line in installed.requires:
            if ";" in line and "extra" in line.split(";", 1)[1]:
                continue  # an extra's requirement: we never request extras here, and skipping saves ~0.2 s
            try:
                requirement = Requirement(line)
                if requirement.marker is not None and not requirement.marker.evaluate(environment):
                    continue
            except Exception:  # noqa: BLE001, S112 - a bad line in someone else's METADATA is not ours to report
                continue
            target = canonicalize_name(requirement.name)
            other = found.get(target)
            if other is None or other.state != "installed" or target == key:
                continue
            if version_satisfies(other.version, requirement.specifier) is False:
                package, wants, has = (f"{pins[key].name} {installed.version}", f"{requirement.name}"
                                       f"{requirement.specifier}", f"{pins[target].name} {other.version}")
                conflicts.append({"package": package, "requires": wants, "installed": has,
                                  "message": f"{package} requires {wants}, but {has} is installed"})
    return conflicts


def known_bad_applies(entry: KnownBad, facts: Mapping[str, str], missing: set[str]) -> bool:
    """Whether a known-bad entry applies, given installed versions (`facts`) and missing package keys.

    >>> bad = KnownBad("x", "error", "", "", when={"unsloth": ""}, unless={"trl": "<=1.15.0"})
    >>> known_bad_applies(bad, {"unsloth": "2026.10.9", "trl": "1.16.0"}, set())
    True
    >>> known_bad_applies(bad, {"unsloth": "2026.10.9"}, {"trl"})
    False
    """

    def key(name: str) -> str:
        return name if name.startswith("@") else canonicalize_name(name)

    for name, spec in entry.when.items():
        version = facts.get(key(name))
        if version is None or (spec and version_satisfies(version, spec) is not True):
            return False
    for name, spec in entry.unless.items():
        version = facts.get(key(name))
        if version is None or version_satisfies(version, spec) is not False:
            return False
    return all(key(name) in missing for name in entry.missing)


def _known_bad(entries, found: Mapping[str, probes.Installed], report: Mapping[str, Any]) -> list[dict[str, str]]:
    """The known-bad entries that apply, evaluated on the installed versions plus @python/@torch-cuda/@nvidia-driver."""
    gpu = report["gpu"]
    facts = {key: item.version for key, item in found.items() if item.state == "installed"}
    facts.update({"@python": report["python"].get("version"), "@torch-cuda": gpu.get("torch_cuda"),
                  "@nvidia-driver": gpu.get("driver")})
    missing = {key for key, item in found.items() if item.state == "missing"}
    return [{"id": entry.id, "severity": entry.severity, "why": entry.why, "fix": entry.fix} for entry in entries
            if known_bad_applies(entry, {key: str(value) for key, value in facts.items() if value}, missing)]


def _profile_section(profile: Profile, gpu: Mapping[str, Any]) -> dict[str, Any]:
    """The profile's settings plus mismatches between it and the GPU actually present."""
    section = {**dataclasses.asdict(profile), "env": dict(profile.env), "pins": dict(profile.pins)}
    mismatches = []
    devices = gpu.get("devices", [])
    if devices and profile.gpu_match:
        name = devices[0]["name"]
        if not any(token.lower() in name.lower() for token in profile.gpu_match):
            mismatches.append(f"profile {profile.id} is for {profile.title}, but this GPU is {name}")
        if profile.bf16 and not devices[0]["bf16"]:
            mismatches.append(f"profile {profile.id} uses bfloat16, which {name} does not support: use float16")
    elif gpu.get("probed") is False and profile.install == "gpu":  # the Unsloth + vLLM set
        mismatches.append(
            f"profile {profile.id} needs an NVIDIA GPU; none was probed ({gpu.get('reason', 'unknown')})"
        )
    section["mismatches"] = mismatches
    return section


def _suggest_profile(matrix: Matrix, report: Mapping[str, Any]) -> str | None:
    """The profile whose GPU name matches this machine's first GPU, preferring the detected platform."""
    devices = report["gpu"].get("devices", [])
    if not devices:
        return None
    name = devices[0]["name"].lower()
    matches = [p for p in matrix.profiles.values() if any(token.lower() in name for token in p.gpu_match)]
    matches.sort(key=lambda profile: not report["platform"].get(profile.platform))  # stable: file order otherwise
    return matches[0].id if matches else None


def _plain_usable_problems(matrix: Matrix, found: Mapping[str, probes.Installed]) -> list[str]:
    """Why the plain backend is not usable (a `core` package not installed or outside its pin); empty when it is."""
    problems = []
    for key, pin in matrix.plain.items():
        if not pin.core:
            continue
        item = found[key]
        if item.state != "installed":
            problems.append(f"{pin.name} is {item.state}" + (f": {item.detail}" if item.detail else ""))
        elif not version_satisfies(item.version, pin.spec):
            problems.append(f"{pin.name} {item.version} is outside {pin.spec}")
    return problems


def _unsloth_modes(matrix: Matrix, found: Mapping[str, probes.Installed], report: Mapping[str, Any]) -> list[dict]:
    """The three ways to train, from fastest to most portable: which this machine can run, each with the reason (what
    is missing, or what it uses)."""

    def not_installed(*keys: str) -> list[str]:
        return [f"{matrix.packages('gpu')[key].name} is {found[key].state}" for key in keys
                if key in found and found[key].state != "installed"]

    gpu = report["gpu"]
    devices = gpu.get("devices", [])
    no_gpu = [] if devices else [f"no usable NVIDIA GPU ({gpu.get('reason') or gpu.get('error') or 'not probed'})"]
    errors = [bad["id"] for bad in report["known_bad"] if bad["severity"] == "error"]
    old_gpu = []
    if devices:
        major = int(str(devices[0].get("compute_capability", "0")).split(".")[0] or 0)
        if major < 7:  # FastLanguageModel.from_pretrained switches fast_inference off below compute capability 7
            old_gpu = [f"compute capability {devices[0]['compute_capability']} < 7.0: vLLM does not run there"]
    without_vllm = (no_gpu + not_installed("unsloth", "unsloth-zoo", "bitsandbytes")
                    + [f"known-bad {i}" for i in errors if not i.startswith("vllm-")])
    with_vllm = (without_vllm + old_gpu + not_installed("vllm", "vllm-bnb-plugin")
                 + [f"known-bad {i}" for i in errors if i.startswith("vllm-")])
    modes = (
        ("unsloth+vllm", "Unsloth + vLLM (fast_inference: true)", with_vllm,
         "4-bit LoRA training with vLLM rollouts in-process (the fastest)"),
        ("unsloth", "Unsloth without vLLM (fast_inference: false)", without_vllm,
         "4-bit LoRA training; Unsloth generates through transformers (slower rollouts, no vLLM needed: Windows/WSL, "
         "older GPUs, images without vLLM)"),
        ("plain", "plain transformers + peft + TRL (backend: plain)", report["plain_backend_problems"],
         "runs " + ("on this GPU" if devices else "on CPU (slow)") + "; no 4-bit, generation through transformers"),
    )
    return [{"mode": mode, "title": title, "can_run": not why, "reason": "; ".join(why) or uses}
            for mode, title, why, uses in modes]


def _fix_command(matrix: Matrix, mode: str, rows: list[dict[str, Any]], profile: Profile | None) -> str | None:
    """The pip command that brings the mode's set back to the matrix, or None: plain mode installs only the drifted
    or missing packages; GPU mode the whole set, whose pins only hold together."""
    bad = [row["name"] for row in rows if row["status"] != "ok" and (mode == "gpu" or row["set"] == "plain")]
    if not bad:
        return None
    return pip_install_command(profile.id if profile else mode, matrix, only=bad if mode == "plain" else None)


def hubs_section(in_use: str) -> dict[str, Any]:
    """Each hub (`model_source`): its address, whether its client is installed, whether one TCP connect answers
    (side by side, 2 s timeout each: an offline machine waits 2 s at most)."""
    from concurrent.futures import ThreadPoolExecutor

    from grpo_pipeline.env.hubs import MODELSCOPE_INSTALL, SOURCES, endpoint, modelscope_installed, reachable

    addresses = {source: endpoint(source) for source in SOURCES}
    with ThreadPoolExecutor(max_workers=len(SOURCES)) as pool:
        answers = dict(zip(SOURCES, pool.map(reachable, addresses.values())))
    rows = []
    for source in SOURCES:
        installed = source == "hf" or modelscope_installed()
        rows.append({"source": source, "endpoint": addresses[source], "installed": installed,
                     "reachable": answers[source], "install": None if installed else MODELSCOPE_INSTALL})
    return {"in_use": in_use, "sources": rows}
