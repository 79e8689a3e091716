"""Dev tool: refresh `env/metadata/*.json` from PyPI after changing a pin in `env/known_good.toml`.

For every version the matrix vouches for (each pin, each range's `tested` version, and the notebook's pins
it is compared with) this runs

    python -m pip --isolated install --dry-run --ignore-installed --no-deps --only-binary=:all: \\
        --index-url https://pypi.org/simple --report - NAME==VERSION

and stores {name, version, requires_python, requires_dist, source} as `env/metadata/<name>-<version>.json`.
With a modern pip (>= 23) and PyPI's PEP 658 metadata files, only the METADATA is downloaded, not the
multi-GB CUDA wheels. Needs network access to PyPI; the tests that read these files are offline.

Usage:
    python env/fetch_metadata.py                      # all targets, with this interpreter's pip
    python env/fetch_metadata.py --python /tmp/pipvenv/bin/python --only vllm trl
    python env/fetch_metadata.py --from-report /tmp/gpu/*.json   # import existing `pip --report` files
    python env/fetch_metadata.py --check              # list targets with no stored record; exit 1 if any
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packaging.utils import canonicalize_name
from packaging.version import Version

from env.compat import METADATA_DIR, metadata_filename
from env.matrix import Matrix, load_matrix

MIN_PIP = Version("23.0")
PYPI = "https://pypi.org/simple"


def metadata_targets(matrix: Matrix) -> list[tuple[str, str]]:
    """(name, version) pairs whose METADATA the offline checks need, sorted and without duplicates.

    >>> ("vllm", "0.31.0") in metadata_targets(load_matrix())
    True
    """
    targets: set[tuple[str, str]] = set()
    for set_name in ("plain", "gpu"):
        for pin in matrix.packages(set_name).values():
            if pin.version:
                targets.add((pin.name, pin.version))
    for table in ("pins", "t4_pins"):
        for name, version in matrix.notebook.get(table, {}).items():
            targets.add((name, version))
    return sorted(targets, key=lambda item: (canonicalize_name(item[0]), Version(item[1])))


def record_from_report(report: dict) -> list[dict]:
    """The stored records (one per installed item) from a `pip install --report` JSON document."""
    records = []
    for item in report.get("install", []):
        metadata = item["metadata"]
        download = item.get("download_info", {})
        records.append(
            {
                "name": metadata["name"],
                "version": metadata["version"],
                "requires_python": metadata.get("requires_python"),
                "requires_dist": metadata.get("requires_dist", []),
                "source": {
                    "file": download.get("url", "").rsplit("/", 1)[-1],
                    "sha256": download.get("archive_info", {}).get("hashes", {}).get("sha256"),
                    "pip": report.get("pip_version"),
                },
            }
        )
    return records


def write_record(record: dict, metadata_dir: Path = METADATA_DIR) -> Path:
    """Write one record as pretty, stable JSON (sorted requires_dist keeps diffs readable)."""
    metadata_dir.mkdir(parents=True, exist_ok=True)
    record = {**record, "requires_dist": sorted(record["requires_dist"])}
    path = metadata_dir / metadata_filename(record["name"], record["version"])
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def pip_report(python: str, name: str, version: str, index_url: str = PYPI) -> dict:
    """Run pip's resolver in dry-run mode for exactly `name==version` and return its JSON report.

    `--isolated` and an explicit index keep local pip config (find-links, mirrors, constraint files)
    out of it, so the record is PyPI's METADATA and not, say, a local "+cpu" torch wheel's.
    """
    command = [
        python, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed", "--no-deps",
        "--only-binary=:all:", "--index-url", index_url, "--quiet", "--report", "-", f"{name}=={version}",
    ]  # fmt: skip
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


def pip_version(python: str) -> Version:
    result = subprocess.run(
        [python, "-m", "pip", "--version"], check=False, capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        raise RuntimeError(f"{python} has no working pip: {result.stderr.strip()}")
    return Version(result.stdout.split()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="interpreter whose pip runs the dry runs")
    parser.add_argument("--index-url", default=PYPI, help="package index to read METADATA from (default: PyPI)")
    parser.add_argument("--only", nargs="*", help="only these package names")
    parser.add_argument("--from-report", nargs="*", type=Path, help="import existing `pip --report` JSON files")
    parser.add_argument("--check", action="store_true", help="only list targets without a stored record")
    args = parser.parse_args(argv)

    matrix = load_matrix()
    targets = metadata_targets(matrix)
    if args.only:
        wanted = {canonicalize_name(name) for name in args.only}
        targets = [(n, v) for n, v in targets if canonicalize_name(n) in wanted]

    if args.from_report:
        for path in args.from_report:
            for record in record_from_report(json.loads(path.read_text())):
                print(f"{path} -> {write_record(record)}")
        return 0

    missing = [(n, v) for n, v in targets if not (METADATA_DIR / metadata_filename(n, v)).is_file()]
    if args.check:
        for name, version in missing:
            print(f"missing: {name}=={version}")
        return 1 if missing else 0

    found = pip_version(args.python)
    if found < MIN_PIP:
        print(f"pip {found} is too old for metadata-only dry runs; need >= {MIN_PIP}", file=sys.stderr)
        return 2
    for name, version in targets:
        report = pip_report(args.python, name, version, args.index_url)
        for record in record_from_report(report):
            print(f"{name}=={version} -> {write_record(record)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
