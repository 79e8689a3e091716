"""The known-good matrix (`env/known_good.toml`) as typed, read-only objects, and the install sets' lock files
(`env/pylock.<set>.toml`, PEP 751, written by uv's resolver from pyproject.toml). Stdlib + `packaging` only, so
`grpo env` and `grpo --help` stay fast.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

MATRIX_PATH = Path(__file__).with_name("known_good.toml")

# The two install sets: "plain" is the base install, "gpu" is base + the `gpu` extra.
SET_NAMES = ("plain", "gpu")
LOCK_PATHS = {name: Path(__file__).with_name(f"pylock.{name}.toml") for name in SET_NAMES}

_EXACT = re.compile(r"^==\s*([0-9][^,*;\s]*)$")


class MatrixError(ValueError):
    """`known_good.toml` is malformed; the message names the table and field."""


@dataclass(frozen=True)
class Pin:
    """One package of an install set, as written in `known_good.toml`."""

    name: str  # as written, e.g. "unsloth_zoo"; compare with `key`
    spec: str  # PEP 440 specifier without the name, e.g. "==1.15.0" or ">=2.5,<2.15"
    group: str  # "plain" or "gpu": the table it came from
    why: str
    disables: str
    module: str  # import name, e.g. "yaml" for pyyaml
    core: bool = False  # the plain backend cannot run without it
    note: str = ""
    evidence: Mapping[str, str] = field(default_factory=dict)  # where the pin comes from, source by source
    risk: str = ""  # what this pin has NOT been shown to do, with the evidence (`grpo env` lists every one)

    @property
    def key(self) -> str:
        """Canonical (PEP 503) name, used for every comparison: "unsloth-zoo", "math-verify"."""
        return canonicalize_name(self.name)

    @property
    def exact(self) -> str | None:
        """The pinned version when `spec` is a single "==X", else None.

        >>> Pin("trl", "==1.15.0", "plain", "", "", "trl").exact
        '1.15.0'
        """
        match = _EXACT.match(self.spec.strip())
        return match.group(1) if match else None

    @property
    def requirement(self) -> str:
        return f"{self.name}{self.spec}"


@dataclass(frozen=True)
class KnownBad:
    """A combination that breaks; the comment above `[[known_bad]]` in the TOML has the semantics."""

    id: str
    severity: str  # "error" or "warn"
    why: str
    fix: str
    when: Mapping[str, str] = field(default_factory=dict)
    unless: Mapping[str, str] = field(default_factory=dict)
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class Profile:
    """Runtime settings for one platform (Colab T4, AutoDL 4090, ...)."""

    id: str
    title: str
    platform: str  # "colab" or "autodl"
    backend: str  # "unsloth" or "plain"
    install: str  # which install set: "gpu" or "plain"
    dtype: str
    recipe: str
    bf16: bool
    standby: bool
    float8_kv_cache: bool
    data_dir: str
    cache_dir: str
    output_dir: str
    compute_capability: str
    gpu_match: tuple[str, ...] = ()
    memory_gib: float | None = None
    smaller_recipe: str | None = None
    gpu_memory_utilization: float | None = None
    torch_index: str | None = None
    pins: Mapping[str, str] = field(default_factory=dict)  # exact pins over the install set's (a CUDA 12 torch)
    env: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Matrix:

    schema: int
    python: str
    plain: Mapping[str, Pin]  # keyed by canonical name
    gpu: Mapping[str, Pin]
    known_bad: tuple[KnownBad, ...]
    profiles: Mapping[str, Profile]

    def packages(self, set_name: str) -> dict[str, Pin]:
        """The pins of an install set ("plain" or "gpu"), keyed by canonical name, in file order.

        "plain" is the base install; "gpu" is plain plus the gpu extra, where a gpu pin replaces the plain
        entry of the same package for display and pip commands (both specifiers still apply: see `specifier`).
        """
        return {**self.plain, **(self.gpu if set_name == "gpu" else {})}

    def specifier(self, set_name: str, key: str) -> SpecifierSet:
        """Every specifier that applies to the package `key` in `set_name` (torch in "gpu": plain range AND ==2.13.0)."""
        pins = (self.plain.get(key), self.gpu.get(key) if set_name == "gpu" else None)
        return SpecifierSet(",".join(pin.spec for pin in pins if pin))

    def gpu_only(self) -> dict[str, Pin]:
        """Packages that only the gpu extra installs (unsloth, vllm, ...): not torch, which both sets have."""
        return {key: pin for key, pin in self.gpu.items() if key not in self.plain}


def pip_install_command(target: str, matrix: Matrix | None = None, *, only: list[str] | None = None) -> str:
    """The exact pip command that installs an install set (`target` "plain" / "gpu") or a profile's set ("colab-t4"),
    or `only` the packages named of it (the drifted ones, say).

    >>> pip_install_command("plain", only=["trl"])
    'python -m pip install "trl==1.15.0"'
    >>> 'vllm==0.31.0' in pip_install_command("colab-t4")
    True
    >>> '"torch==2.12.1+cu126"' in pip_install_command("autodl-cuda12")
    True
    """
    matrix = matrix or load_matrix()
    profile = matrix.profiles.get(target)
    if profile is None and target not in SET_NAMES:
        raise MatrixError(
            f"unknown install target {target!r}; expected one of {SET_NAMES} or a profile: {sorted(matrix.profiles)}"
        )
    set_name = profile.install if profile else target
    overrides = profile.pins if profile else {}  # e.g. autodl-cuda12's CUDA 12 torch build
    pins = {key: f"{pin.name}{overrides.get(key, pin.spec)}" for key, pin in matrix.packages(set_name).items()}
    if only is not None:
        wanted = {canonicalize_name(name) for name in only}
        if wanted - set(pins):
            raise MatrixError(f"{sorted(wanted - set(pins))} are not in the {set_name!r} set")
        pins = {key: pin for key, pin in pins.items() if key in wanted}
    # An extra index, not --index-url: the rest still comes from PyPI, and pip prefers the index's "+cu126" local
    # version over the plain PyPI release of the same number.
    extra_args = ["--extra-index-url", profile.torch_index] if profile and profile.torch_index else []
    # Double quotes, not shlex.quote: they work the same in bash, zsh, a Colab `!` cell and Windows cmd.
    return " ".join(["python", "-m", "pip", "install", *map(shlex.quote, extra_args), *(f'"{r}"' for r in pins.values())])


@lru_cache(maxsize=2)
def locked_versions(set_name: str) -> dict[str, str]:
    """The version of every package in an install set's lock file (`env/pylock.<set>.toml`), by canonical name.

    >>> locked_versions("gpu")["torch"], locked_versions("plain")["trl"]
    ('2.13.0', '1.15.0')
    """
    if set_name not in LOCK_PATHS:
        raise MatrixError(f"unknown install set {set_name!r}; expected one of {SET_NAMES}")
    return {canonicalize_name(p["name"]): p["version"] for p in _read_toml(LOCK_PATHS[set_name])["packages"]}


@lru_cache(maxsize=4)
def load_matrix(path: str | Path = MATRIX_PATH) -> Matrix:
    """Load and validate `env/known_good.toml` (or `path`). Cached per path.

    >>> m = load_matrix()
    >>> m.plain["trl"].exact, m.gpu["vllm"].exact
    ('1.15.0', '0.31.0')
    """
    return matrix_from_dict(_read_toml(Path(path)))


def _read_toml(path: Path) -> dict[str, Any]:
    with open(path, "rb") as handle:
        try:
            return tomllib.load(handle)
        except tomllib.TOMLDecodeError as err:
            raise MatrixError(f"{path}: invalid TOML: {err}") from err


# --- validation: hand-written because the schema is small and the errors must name the field -----------


def _require(table: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    if key not in table:
        raise MatrixError(f"{where}: missing field {key!r}")
    value = table[key]
    if not isinstance(value, kind):
        raise MatrixError(f"{where}.{key}: expected {kind}, got {type(value).__name__} {value!r}")
    return value


def _check_spec(spec: str, where: str) -> str:
    try:
        SpecifierSet(spec)
    except InvalidSpecifier as err:
        raise MatrixError(f"{where}: invalid version specifier {spec!r}: {err}") from err
    return spec


_TYPES = {"str": str, "bool": bool, "int": int}


def _record(cls: type, table: Any, where: str, **given: Any) -> Any:
    """`table` as a `cls` (with the fields the caller `given`): only its fields, every required one, each of the
    type it declares; lists become tuples."""
    if not isinstance(table, Mapping):
        raise MatrixError(f"{where}: expected a table")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in given}
    extra = set(table) - set(fields)
    if extra:
        raise MatrixError(f"{where}: unknown field(s) {sorted(extra)}; allowed: {sorted(fields)}")
    for name, f in fields.items():
        if name in table or f.default is f.default_factory is dataclasses.MISSING:
            _require(table, name, where, _TYPES.get(str(f.type), object))
    tuples = {name: tuple(value) for name, value in table.items() if str(fields[name].type).startswith("tuple")}
    return cls(**given, **{**table, **tuples})


def _parse_pins(tables: Mapping[str, Any], group: str) -> dict[str, Pin]:
    pins: dict[str, Pin] = {}
    for name, table in tables.items():
        where = f"[{group}.{name}]"
        pin = _record(Pin, table, where, name=name, group=group)
        _check_spec(pin.spec, f"{where}.spec")
        if pin.key in pins:
            raise MatrixError(f"{where}: duplicate package (same canonical name as {pins[pin.key].name!r})")
        pins[pin.key] = pin
    return pins


def _parse_known_bad(entries: list[Any]) -> tuple[KnownBad, ...]:
    out = []
    for index, entry in enumerate(entries):
        where = f"[[known_bad]] #{index + 1}"
        bad = _record(KnownBad, entry, where)
        if bad.severity not in ("error", "warn"):
            raise MatrixError(f"{where}.severity: {bad.severity!r} is not one of ('error', 'warn')")
        for part in ("when", "unless"):
            for name, spec in getattr(bad, part).items():
                if spec:
                    _check_spec(spec, f"{where}.{part}.{name}")
        out.append(bad)
    ids = [bad.id for bad in out]
    if len(ids) != len(set(ids)):
        raise MatrixError(f"[[known_bad]]: duplicate ids in {ids}")
    return tuple(out)


def _parse_profiles(tables: Mapping[str, Any]) -> dict[str, Profile]:
    profiles = {}
    for profile_id, table in tables.items():
        where = f"[profiles.{profile_id}]"
        profile = profiles[profile_id] = _record(Profile, table, where, id=profile_id)
        if profile.install not in SET_NAMES:
            raise MatrixError(f"{where}.install: {profile.install!r} is not one of {SET_NAMES}")
        utilization = profile.gpu_memory_utilization
        if utilization is not None and not 0.0 < float(utilization) < 1.0:
            raise MatrixError(f"{where}.gpu_memory_utilization: {utilization} must be in (0, 1)")
    return profiles


def _check_profile_pins(profile: Profile, pins: Mapping[str, Pin]) -> None:
    for name, spec in profile.pins.items():
        where = f"[profiles.{profile.id}].pins.{name}"
        key = canonicalize_name(name)
        if key != name or key not in pins:
            raise MatrixError(f"{where}: not a package of the {profile.install!r} set (use its canonical name)")
        match = _EXACT.match(_check_spec(spec, where).strip())
        if match is None:
            raise MatrixError(f"{where}: must be an exact '==' pin, got {spec!r}")
        if match.group(1) not in SpecifierSet(pins[key].spec, prereleases=True):
            raise MatrixError(f"{where}: {spec} is outside the set's {pins[key].requirement}")


def matrix_from_dict(data: Mapping[str, Any]) -> Matrix:
    """Build a `Matrix` from the parsed TOML (tests use this to check mutated copies)."""
    plain = _parse_pins(_require(data, "plain", "known_good.toml", Mapping), "plain")
    gpu = _parse_pins(_require(data, "gpu", "known_good.toml", Mapping), "gpu")
    for key, pin in gpu.items():
        if key in plain and pin.exact is None:
            raise MatrixError(f"[gpu.{pin.name}]: a gpu entry that overrides [plain] must be an exact '==' pin")
    profiles = _parse_profiles(data.get("profiles", {}))
    for profile in profiles.values():
        _check_profile_pins(profile, plain if profile.install == "plain" else {**plain, **gpu})
    return Matrix(
        schema=_require(data, "schema", "known_good.toml", int),
        python=_check_spec(_require(data, "python", "known_good.toml", str), "python"),
        plain=plain,
        gpu=gpu,
        known_bad=_parse_known_bad(data.get("known_bad", [])),
        profiles=profiles,
    )
