"""The parts mode: a wheel set over the device's 64 MiB carry limit (the set with vLLM, wheels.py build --vllm)
travels to the lent machine in parts, one part per `run` call, and is put together there by the last call.

    python scripts/gpu_check/wheels.py build --vllm        # here: the set with vLLM, trimmed, in .gpu-wheels-vllm/
    python scripts/gpu_check/parts.py split                # here: .gpu-parts/partNN/ (<= 55 MiB each) + manifest.json
    python scripts/gpu_check/parts.py commands             # here: print the device calls again

    python3 scripts/gpu_check/parts.py store .gpu-parts/part01   # device call k: only stores its part under /tmp
    python3 scripts/gpu_check/parts.py assemble --target /tmp/site   # the last device call: verify, join, install

A warm lent machine keeps /tmp between calls made within 30 s of each other, so the store calls go back to back
and return in seconds, and the last call carries only the manifest. A part that is missing there (the machine was
recycled), corrupted, or left by another build is named with the call that stores it again: one message, exit 2.

The set is packed as one uncompressed tar (the wheels are compressed already) with sorted names and zero times, so
the same set gives the same bytes and the same build id (the first 12 hex digits of its sha256), then cut into
parts. Each part folder holds the part and a small JSON beside it (build, index, count, size, sha256), so a part
that another build left under /tmp is told apart from a corrupted one. The tar, hashlib, shutil and pip do the
work; what is written here is the cutting, the checks and their messages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tarfile
from pathlib import Path

# wheels.py and vllm_set.py live beside this file (this folder is sys.path[0] when it runs as a script).
from vllm_set import WheelSetError
from wheels import CARRY_LIMIT_BYTES, MANIFEST_NAME, REPO_ROOT, VLLM_WHEEL_DIR, install, working_tree_bytes
from checkout import checkout_site  # beside this file: sys.path[0] as a script

PART_LIMIT_BYTES = 55 * 2**20  # each part plus the working tree must stay under the 64 MiB the device carries
PARTS_DIR = REPO_ROOT / ".gpu-parts"  # git-ignored (.gitignore); each partNN/ is one call's carry
PARTS_MANIFEST = "manifest.json"
DEVICE_PARTS = Path("/tmp/gpu-parts")  # where the store calls leave the parts on the lent machine
DEVICE_WHEELS = Path("/tmp/gpu-wheels")  # where the last call unpacks the set
DEVICE_TARGET = "/tmp/site"
CHUNK = 4 * 2**20
# The last device call: verify and install (its log kept in $OUT), then the check; what the set with vLLM exists
# for (the Unsloth chain with fast_inference: true and the benchmark's three rows on the 0.5B shape, which the
# models step builds), sharing the budget.
FINAL_STEPS = ("models,chain/unsloth-vllm/qwen2.5-0.5b/nf4,bench/plain/qwen2.5-0.5b,bench/unsloth/qwen2.5-0.5b,"
               "bench/unsloth-vllm/qwen2.5-0.5b")
FINAL_BUDGET_S = 480  # of the call's 560 s: assembling and installing the set take 7 s on CPU here
FINAL_COMMAND = (
    "set -o pipefail; export PYTHONUNBUFFERED=1; python3 scripts/gpu_check/parts.py assemble "
    f"--target {DEVICE_TARGET} > $OUT/install.log 2>&1 || {{ rc=$?; tail -20 $OUT/install.log; exit $rc; }}; "
    f"PYTHONPATH={DEVICE_TARGET} python3 scripts/gpu_check/run_check.py --out $OUT --budget-s {FINAL_BUDGET_S} "
    f"--only {FINAL_STEPS} 2>&1 | tee $OUT/console.log")


def part_name(index: int) -> str:
    """The name of a part (and of its folder), in the order the parts join.

    >>> part_name(3), part_name(12)
    ('part03', 'part12')
    """
    return f"part{index:02d}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def pack(folder: Path, archive: Path) -> list[str]:
    """One uncompressed tar of the set's manifest.json and wheels, byte-identical for the same files. Returns the
    names packed."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and (p.suffix == ".whl" or p.name == MANIFEST_NAME))
    if MANIFEST_NAME not in names or len(names) < 2:
        raise WheelSetError(f"{folder} holds no built set (manifest.json and wheels): run "
                            "`python scripts/gpu_check/wheels.py build --vllm` first")

    def plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
        return info

    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            tar.add(folder / name, arcname=name, filter=plain)
    return names


def split(folder: Path = VLLM_WHEEL_DIR, out: Path = PARTS_DIR, limit: int = PART_LIMIT_BYTES,
          tree_bytes: int | None = None) -> dict:
    """Pack the set in `folder` and cut it into parts of at most `limit` bytes under `out` (emptied first); write
    out/manifest.json and return it. Refuses a limit that would not fit the device's carry beside the tree."""
    tree = working_tree_bytes() if tree_bytes is None else tree_bytes
    if limit + tree > CARRY_LIMIT_BYTES:
        raise WheelSetError(f"a part of {limit / 2**20:.1f} MiB + the working tree's {tree / 2**20:.1f} MiB would "
                            f"pass the {CARRY_LIMIT_BYTES / 2**20:.0f} MiB the device carries; lower the part size")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    archive = out / "set.tar"
    packed = pack(folder, archive)
    whole = _sha256(archive)
    build, size = whole[:12], archive.stat().st_size
    count = -(-size // limit)
    parts = []
    with open(archive, "rb") as source:
        for index in range(1, count + 1):
            name = part_name(index)
            (out / name).mkdir()
            data, digest, written = out / name / name, hashlib.sha256(), 0
            with open(data, "wb") as sink:
                while written < limit:
                    block = source.read(min(CHUNK, limit - written))
                    if not block:
                        break
                    sink.write(block)
                    digest.update(block)
                    written += len(block)
            entry = {"name": name, "index": index, "count": count, "build": build, "bytes": written,
                     "sha256": digest.hexdigest()}
            (out / name / f"{name}.json").write_text(json.dumps(entry, indent=1) + "\n", encoding="utf-8")
            parts.append(entry)
    archive.unlink()
    manifest = {"build": build, "archive_bytes": size, "archive_sha256": whole, "part_limit_bytes": limit,
                "files": packed, "parts": parts}
    (out / PARTS_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def store_command(name: str) -> str:
    return f"python3 scripts/gpu_check/parts.py store .gpu-parts/{name}"


def device_calls(manifest: dict) -> list[dict]:
    """The device `run` calls, in order: one per part, then the one that verifies, installs and runs the check."""
    calls = [{"carry": [f".gpu-parts/{p['name']}"], "timeout_s": 60, "command": store_command(p["name"])}
             for p in manifest["parts"]]
    calls.append({"carry": [f".gpu-parts/{PARTS_MANIFEST}"], "timeout_s": 560, "command": FINAL_COMMAND})
    return calls


def store(part_dir: Path, dest: Path = DEVICE_PARTS) -> dict:
    """Copy one carried part folder's part into `dest`, hashing it on the way, with its JSON beside it."""
    name = part_dir.name
    sidecar = part_dir / f"{name}.json"
    if not sidecar.is_file() or not (part_dir / name).is_file():
        raise WheelSetError(f"{part_dir} was not carried into this call: run it with carry "
                            f"[\".gpu-parts/{name}\"] (built here by `python scripts/gpu_check/parts.py split`)")
    entry = json.loads(sidecar.read_text(encoding="utf-8"))
    dest.mkdir(parents=True, exist_ok=True)
    partial = dest / f"{name}.partial"
    digest = hashlib.sha256()
    with open(part_dir / name, "rb") as source, open(partial, "wb") as sink:
        for block in iter(lambda: source.read(CHUNK), b""):
            digest.update(block)
            sink.write(block)
    if digest.hexdigest() != entry["sha256"]:
        partial.unlink()
        raise WheelSetError(f"{name} arrived corrupted (sha256 {digest.hexdigest()[:12]}, expected "
                            f"{entry['sha256'][:12]}): run this call again")
    partial.replace(dest / name)
    (dest / f"{name}.json").write_text(json.dumps(entry, indent=1) + "\n", encoding="utf-8")
    return entry


def check_parts(manifest: dict, dest: Path = DEVICE_PARTS) -> list[str]:
    """One line per part of `manifest` that `dest` lacks or holds wrong (another build's, or corrupted)."""
    problems = []
    for part in manifest["parts"]:
        name, data, sidecar = part["name"], dest / part["name"], dest / f"{part['name']}.json"
        if not data.is_file() or not sidecar.is_file():
            problems.append(f"{name}: missing from {dest}")
            continue
        build = json.loads(sidecar.read_text(encoding="utf-8")).get("build")
        if build != manifest["build"]:
            problems.append(f"{name}: from build {build}, not {manifest['build']} (a part of an earlier split)")
        elif data.stat().st_size != part["bytes"] or _sha256(data) != part["sha256"]:
            problems.append(f"{name}: corrupted ({data.stat().st_size} bytes, sha256 {_sha256(data)[:12]}; "
                            f"expected {part['bytes']} bytes, {part['sha256'][:12]})")
    return problems


def rerun_message(manifest: dict, problems: list[str], dest: Path = DEVICE_PARTS) -> str:
    """The one message for parts that are not there as they should be: each part, and the calls that fix it."""
    bad = [line.split(":", 1)[0] for line in problems]
    recycled = len(bad) == len(manifest["parts"]) and all("missing" in line for line in problems)
    lines = [f"{len(bad)} of the {len(manifest['parts'])} parts of build {manifest['build']} are not in {dest} "
             "as they should be" + (" (none is there: the machine was recycled and /tmp emptied)" if recycled else "")
             + ":", *[f"  {line}" for line in problems],
             "Store them again, back to back (a warm machine keeps /tmp only between calls less than 30 s apart), "
             "then run this call again:"]
    lines += [f"  run carry [\".gpu-parts/{name}\"] command: {store_command(name)}" for name in bad]
    return "\n".join(lines)


def assemble(manifest_path: Path, dest: Path = DEVICE_PARTS, into: Path = DEVICE_WHEELS,
             target: Path | None = None) -> list[str]:
    """Verify every part in `dest` against the manifest, join them, check the whole, unpack the set into `into`
    and, with `target`, pip install it there (wheels.install). Returns the files unpacked."""
    if not manifest_path.is_file():
        raise WheelSetError(f"{manifest_path} was not carried: run this call with carry [\".gpu-parts/{PARTS_MANIFEST}\"] "
                            "(written by `python scripts/gpu_check/parts.py split`)")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    problems = check_parts(manifest, dest)
    if problems:
        raise WheelSetError(rerun_message(manifest, problems, dest))
    archive = dest / f"set-{manifest['build']}.tar"
    with open(archive, "wb") as sink:
        for part in manifest["parts"]:
            with open(dest / part["name"], "rb") as source:
                shutil.copyfileobj(source, sink, CHUNK)
    if _sha256(archive) != manifest["archive_sha256"]:
        archive.unlink()
        raise WheelSetError(f"the joined parts do not give build {manifest['build']}'s archive although each part "
                            "matches: split again here and store every part again")
    if into.exists():
        shutil.rmtree(into)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
        names = sorted(tar.getnames())
    archive.unlink()
    if target is not None:
        install(target, into)
    return names


def print_calls(manifest: dict) -> None:
    mib = 2**20
    sizes = ", ".join(f"{part['bytes'] / mib:.1f}" for part in manifest["parts"])
    print(f"build {manifest['build']}: {manifest['archive_bytes'] / mib:.1f} MiB in {len(manifest['parts'])} parts "
          f"of at most {manifest['part_limit_bytes'] / mib:.0f} MiB ({sizes} MiB)")
    print("device `run` calls, in this order, each within 30 s of the one before (a warm machine keeps /tmp):")
    for number, call in enumerate(device_calls(manifest), 1):
        print(f"{number}. carry: {json.dumps(call['carry'])}, timeout_s: {call['timeout_s']}, command:\n"
              f"   {call['command']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="parts.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    split_parser = sub.add_parser("split", help=f"cut {VLLM_WHEEL_DIR.name}/ into {PARTS_DIR.name}/partNN/ and print "
                                  "the device calls")
    split_parser.add_argument("--folder", type=Path, default=VLLM_WHEEL_DIR)
    sub.add_parser("commands", help="print the device calls for the parts in .gpu-parts/")
    store_parser = sub.add_parser("store", help=f"device: copy one carried part into {DEVICE_PARTS} and verify it")
    store_parser.add_argument("part_dir", type=Path)
    store_parser.add_argument("--dest", type=Path, default=DEVICE_PARTS)
    assemble_parser = sub.add_parser("assemble", help="device: verify every part, join, unpack, install")
    assemble_parser.add_argument("--manifest", type=Path, default=PARTS_DIR / PARTS_MANIFEST)
    assemble_parser.add_argument("--dest", type=Path, default=DEVICE_PARTS)
    assemble_parser.add_argument("--into", type=Path, default=DEVICE_WHEELS)
    assemble_parser.add_argument("--target", type=Path, default=None, help="pip install the set there")
    args = parser.parse_args(argv)
    try:
        if args.command == "split":
            print_calls(split(args.folder))
        elif args.command == "commands":
            path = PARTS_DIR / PARTS_MANIFEST
            if not path.is_file():
                raise WheelSetError(f"{path} is missing: run `python scripts/gpu_check/parts.py split` first")
            print_calls(json.loads(path.read_text(encoding="utf-8")))
        elif args.command == "store":
            entry = store(args.part_dir, args.dest)
            print(f"stored {entry['name']} ({entry['index']} of {entry['count']}) of build {entry['build']} in "
                  f"{args.dest}: {entry['bytes'] / 2**20:.1f} MiB, sha256 verified")
        else:
            names = assemble(args.manifest, args.dest, args.into, args.target)
            where = f" and installed into {args.target}" if args.target else ""
            print(f"verified every part, unpacked {len(names)} files into {args.into}{where}")
    except WheelSetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    checkout_site()  # grpo_pipeline from this checkout, installed or not
    raise SystemExit(main())
