"""The GPU image's side of the kit: the packages the image already has (IMAGE_PACKAGES), what the kit needs of
them (`image_requirements`), and whether an image meets that (`check_image`: run_check.py's image step)."""

from __future__ import annotations

from vllm_set import PYTHON_VERSION, ROOTS_RECORD, canonical, requirement_applies, stored_records
from wheels import IMAGE_PACKAGES, wanted_wheels




def image_requirements(matrix=None, vllm: bool = False) -> dict[str, dict]:
    """What the kit needs of each package it takes from the GPU image instead of carrying it: canonical name ->
    {"needs": SpecifierSet, "from": [where each part comes from]}.

    The parts: env/known_good.toml's [plain] pin (the GPU image runs the plain backend too; [gpu] torch's
    ==2.13.0 is the vLLM build, not run there), and each Requires-Dist line of the carried roots' stored
    METADATA (ROOTS_RECORD) that applies on Python 3.12 / linux x86_64, for a package in IMAGE_PACKAGES;
    with `vllm` also those of vllm VLLM_VERSION and the packages carried for it (VLLM_RECORD).
    """
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    from grpo_pipeline.env.matrix import load_matrix

    matrix = matrix or load_matrix()
    image = {canonical(name) for name in IMAGE_PACKAGES}
    parts: dict[str, list[tuple[str, str]]] = {}
    records = {"known_good.toml": stored_records(ROOTS_RECORD), "vllm": stored_records() if vllm else {}}
    for wanted in wanted_wheels(vllm):
        record = records.get(wanted.source, {}).get(canonical(wanted.name))
        for line in (record or {}).get("requires_dist", []):
            requirement = Requirement(line)
            key = canonical(requirement.name)
            if key in image and requirement_applies(requirement, PYTHON_VERSION):
                parts.setdefault(key, []).append((wanted.requirement, str(requirement.specifier)))
    for key, pin in matrix.packages("plain").items():
        if key in image:
            parts.setdefault(key, []).append(("known_good.toml [plain]", pin.spec))
    return {key: {"needs": _narrowest(SpecifierSet(",".join(spec for _, spec in found if spec))),
                  "from": sorted({source for source, _ in found})} for key, found in sorted(parts.items())}


def _narrowest(specifier):
    """An exact pin that satisfies every other part stands for the whole set.

    >>> from packaging.specifiers import SpecifierSet
    >>> str(_narrowest(SpecifierSet(">=0.18.0,==0.21.2,!=0.11.0"))), str(_narrowest(SpecifierSet(">=1,<2")))
    ('==0.21.2', '<2,>=1')
    """
    from packaging.specifiers import SpecifierSet

    exact = [spec.version for spec in specifier if spec.operator == "==" and "*" not in spec.version]
    if len(exact) == 1 and specifier.contains(exact[0], prereleases=True):
        return SpecifierSet(f"=={exact[0]}")
    return specifier


def check_image(versions: dict[str, str | None], needs: dict[str, dict] | None = None) -> dict:
    """The image's version of each package in image_requirements against what the kit needs of it.

    Returns {"packages": {name: {"version", "needs", "from", "ok"}}, "outside": {name: why}}: `outside` names
    every package that is missing or whose version lies outside its range.
    """
    from packaging.version import InvalidVersion, Version

    needs = image_requirements() if needs is None else needs
    packages, outside = {}, {}
    for name, need in needs.items():
        version = versions.get(name)
        try:
            ok = version is not None and need["needs"].contains(Version(version), prereleases=True)
        except InvalidVersion:
            ok = False
        packages[name] = {"version": version, "needs": str(need["needs"]), "from": need["from"], "ok": ok}
        if not ok:
            outside[name] = (f"not installed; needs {need['needs'] or 'any version'}" if version is None else
                             f"{version}, needs {need['needs']}") + f" ({', '.join(need['from'])})"
    return {"packages": packages, "outside": outside}


def installed_versions(names) -> dict[str, str | None]:
    """This machine's version of each distribution (None: not installed)."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found
