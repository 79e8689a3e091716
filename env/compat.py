"""Check an install set against the packages' own declared METADATA, offline.

`env/metadata/<name>-<version>.json` holds {name, version, requires_python, requires_dist} for every
version the matrix vouches for (written by `env/fetch_metadata.py`). `check_set()` evaluates every
`Requires-Dist` of every package in a set (markers for linux x86_64 and each checked Python) against the
versions the set pins, which is what pip's resolver would do, without a network or a GPU.

For a range pin (torch >=2.5,<2.15) two versions are checked as targets: the `tested` one and the floor
(the `>=` bound), so a floor below what another package requires is caught too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from env.matrix import Matrix, Pin, load_matrix  # noqa: F401 (load_matrix: docstring example)

METADATA_DIR = Path(__file__).with_name("metadata")


@dataclass(frozen=True)
class Violation:
    """One declared constraint that the set breaks (or a check that could not run)."""

    kind: str  # "requires-dist", "requires-python", "missing-metadata", "tested-outside-spec", ...
    package: str  # the package whose metadata declares the constraint
    package_version: str
    message: str
    target: str | None = None  # the package the constraint is about
    target_version: str | None = None
    requirement: str | None = None
    pythons: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.message


def metadata_filename(name: str, version: str) -> str:
    """File name of a stored METADATA record.

    >>> metadata_filename("unsloth_zoo", "2026.10.9")
    'unsloth-zoo-2026.10.9.json'
    """
    return f"{canonicalize_name(name)}-{version}.json"


def load_metadata(name: str, version: str, metadata_dir: Path = METADATA_DIR) -> dict[str, Any] | None:
    """The stored METADATA record of `name==version`, or None when it was never fetched."""
    path = metadata_dir / metadata_filename(name, version)
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def marker_environment(python: str) -> dict[str, str]:
    """PEP 508 marker values for CPython `python` ("3.11") on linux x86_64: the platform this project targets."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{python}.0",
        "python_version": python,
        "sys_platform": "linux",
        "extra": "",
    }


def requirement_applies(requirement: Requirement, python: str, extras: Iterable[str] = ()) -> bool:
    """Whether a Requires-Dist line is active on linux x86_64 / `python`, with `extras` requested.

    A line guarded by `extra == "x"` applies only when "x" is in `extras`; every other marker is evaluated.
    """
    if requirement.marker is None:
        return True
    environment = marker_environment(python)
    for extra in ("", *extras):
        environment["extra"] = extra
        try:
            if requirement.marker.evaluate(environment):
                return True
        except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
            return False
    return False


def target_versions(pin: Pin, specifier: SpecifierSet) -> list[str]:
    """The concrete versions of `pin` a dependent must accept: the exact pin, else `tested` and the floor."""
    if pin.exact:
        return [pin.exact]
    versions = [pin.tested] if pin.tested else []
    floors = [spec.version for spec in specifier if spec.operator in (">=", "==", "~=")]
    for floor in floors:
        if floor not in versions and "*" not in floor:
            versions.append(floor)
    return versions


def check_set(
    matrix: Matrix,
    set_name: str,
    *,
    metadata_dir: Path = METADATA_DIR,
    extra_extras: Mapping[str, Iterable[str]] | None = None,
) -> list[Violation]:
    """Every declared constraint that the pins of `set_name` violate, as pip would see it.

    Args:
        matrix: the matrix (`load_matrix()`, or a mutated copy in tests).
        set_name: "plain" or "gpu".
        metadata_dir: where the `<name>-<version>.json` records live.
        extra_extras: extras to enable on top of each pin's `extras`, e.g. {"trl": ["vllm"]}.

    Returns:
        A list of `Violation`; empty when the set is consistent.

    >>> check_set(load_matrix(), "gpu")
    []
    """
    pins = matrix.packages(set_name)
    pythons = matrix.checked_pythons
    extra_extras = {canonicalize_name(k): tuple(v) for k, v in (extra_extras or {}).items()}
    violations: list[Violation] = []

    # 1. The set's own bookkeeping: a tested version inside its range, a gpu pin inside the plain range.
    for key, pin in pins.items():
        specifier = matrix.specifier(set_name, key)
        version = pin.version
        if version is not None and not specifier.contains(version, prereleases=True):
            violations.append(
                Violation(
                    kind="tested-outside-spec",
                    package=pin.name,
                    package_version=version,
                    message=f"{pin.name} {version} is outside the set's own specifier {specifier} for {set_name!r}",
                    target=pin.name,
                    target_version=version,
                )
            )

    # 2. Every Requires-Dist of every pinned package against the other pins.
    for key, pin in pins.items():
        version = pin.version
        record = load_metadata(pin.name, version, metadata_dir) if version else None
        if record is None:
            violations.append(
                Violation(
                    kind="missing-metadata",
                    package=pin.name,
                    package_version=str(version),
                    message=(
                        f"no stored METADATA for {pin.name} {version} in {metadata_dir}: "
                        f"run `python env/fetch_metadata.py` after changing a pin"
                    ),
                )
            )
            continue
        requires_python = record.get("requires_python") or ""
        bad_pythons = tuple(py for py in pythons if not SpecifierSet(requires_python).contains(f"{py}.0"))
        if bad_pythons:
            violations.append(
                Violation(
                    kind="requires-python",
                    package=pin.name,
                    package_version=version,
                    message=f"{pin.name} {version} requires Python {requires_python}, not {', '.join(bad_pythons)}",
                    pythons=bad_pythons,
                )
            )
        extras = (*pin.extras, *extra_extras.get(key, ()))
        violations.extend(_check_requires(record, pin, version, pins, matrix, set_name, pythons, extras))
    return violations


@lru_cache(maxsize=4096)
def _parse_requirement(line: str) -> Requirement:
    """Parsing dominates the check (unsloth alone declares ~580 lines); the records never change at run time."""
    return Requirement(line)


def _check_requires(
    record: Mapping[str, Any],
    pin: Pin,
    version: str,
    pins: Mapping[str, Pin],
    matrix: Matrix,
    set_name: str,
    pythons: tuple[str, ...],
    extras: tuple[str, ...],
) -> list[Violation]:
    found: dict[tuple[str, str, str], Violation] = {}
    failing_pythons: dict[tuple[str, str, str], list[str]] = {}
    for line in record.get("requires_dist") or []:
        try:
            requirement = _parse_requirement(line)
        except InvalidRequirement as err:
            key = ("invalid", line, "")
            found[key] = Violation(
                kind="invalid-requirement",
                package=pin.name,
                package_version=version,
                message=f"{pin.name} {version} declares an unparsable requirement {line!r}: {err}",
            )
            continue
        target_key = canonicalize_name(requirement.name)
        if target_key not in pins:
            continue  # not pinned by us: pip resolves it freely
        target = pins[target_key]
        specifier = matrix.specifier(set_name, target_key)
        for python in pythons:
            if not requirement_applies(requirement, python, extras):
                continue
            for candidate in target_versions(target, specifier):
                if requirement.specifier.contains(candidate, prereleases=True):
                    continue
                key = (str(requirement), target_key, candidate)
                failing_pythons.setdefault(key, []).append(python)
                found[key] = Violation(
                    kind="requires-dist",
                    package=pin.name,
                    package_version=version,
                    target=target.name,
                    target_version=candidate,
                    requirement=str(requirement),
                    message=(
                        f"{pin.name} {version} requires {requirement} but the {set_name!r} set "
                        f"{'pins' if target.exact else 'allows'} {target.name} {candidate}"
                    ),
                )
    return [
        Violation(**{**violation.__dict__, "pythons": tuple(failing_pythons.get(key, ()))})
        for key, violation in found.items()
    ]


# --- pyproject.toml agreement -------------------------------------------------------------------


def _requirements_by_name(lines: Iterable[str], where: str) -> dict[str, SpecifierSet]:
    out: dict[str, SpecifierSet] = {}
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker is not None or requirement.extras:
            raise ValueError(f"{where}: {line!r} has a marker or extras; the matrix has no way to express them")
        out[canonicalize_name(requirement.name)] = requirement.specifier
    return out


def pyproject_disagreements(matrix: Matrix, pyproject: Mapping[str, Any]) -> list[str]:
    """Differences between pyproject's `dependencies` / `gpu` extra / requires-python and the matrix.

    Args:
        matrix: the known-good matrix.
        pyproject: the parsed pyproject.toml (a dict from tomllib).

    Returns:
        One readable line per difference; empty when they agree.
    """
    project = pyproject.get("project", {})
    problems: list[str] = []
    if SpecifierSet(project.get("requires-python", "")) != SpecifierSet(matrix.python):
        problems.append(
            f"requires-python: pyproject says {project.get('requires-python')!r}, matrix {matrix.python!r}"
        )
    sections = (
        ("dependencies", project.get("dependencies", []), matrix.plain),
        ("optional-dependencies.gpu", project.get("optional-dependencies", {}).get("gpu", []), matrix.gpu),
    )
    for where, lines, pins in sections:
        declared = _requirements_by_name(lines, where)
        for key, pin in pins.items():
            if key not in declared:
                problems.append(f"{where}: missing {pin.requirement!r} (in known_good.toml [{pin.group}])")
            elif declared[key] != SpecifierSet(pin.spec):
                problems.append(
                    f"{where}: {pin.name} is {str(declared[key])!r} in pyproject but {pin.spec!r} in known_good.toml"
                )
        for key in declared.keys() - pins.keys():
            problems.append(
                f"{where}: {key}{declared[key]} is not in known_good.toml [{'plain' if where == 'dependencies' else 'gpu'}]"
            )
    return problems


def version_satisfies(version: str | None, specifier: str | SpecifierSet) -> bool | None:
    """True/False, or None when `version` is missing or not PEP 440 (half-installed packages).

    Local labels are ignored the PEP 440 way ("2.14.0+cu130" satisfies "==2.14.0").

    >>> version_satisfies("2.14.0+cu130", "==2.14.0"), version_satisfies("garbage", ">=1"), version_satisfies("1.0", "")
    (True, None, True)
    """
    if version is None:
        return None
    try:
        parsed = Version(version)
    except InvalidVersion:
        return None
    specifier = specifier if isinstance(specifier, SpecifierSet) else SpecifierSet(specifier)
    return specifier.contains(parsed, prereleases=True)
