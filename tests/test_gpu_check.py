"""The GPU check kit (scripts/gpu_check/) cannot rot between lent GPU machines: its wheel list agrees
with env/known_good.toml and the carried roots' stored METADATA, its trimming and size check work, and its driver runs
end to end on CPU (--dry-run: the tiny model, the steps that need CUDA recorded as skipped).

Nothing here downloads: the wheel list is checked against scripts/gpu_check/roots-requires.json, the trimming on a wheel
built in the test.
"""

import doctest
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from grpo_pipeline.env.matrix import load_matrix, locked_versions

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "gpu_check"))

import benchmark  # noqa: E402
import cases  # noqa: E402
import chain_case  # noqa: E402
import check_report  # noqa: E402
import check_steps  # noqa: E402
import gpu_image  # noqa: E402
import parts  # noqa: E402
import run_check  # noqa: E402
import trim  # noqa: E402
import vllm_set  # noqa: E402
import wheels  # noqa: E402
from vllm_set import ROOTS_RECORD, requirement_applies, stored_records  # noqa: E402


@pytest.mark.parametrize("module", [run_check, cases, benchmark, wheels, parts],
                         ids=["run_check", "cases", "benchmark", "wheels", "parts"])
def test_docstring_examples_run(module):
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("module", [gpu_image, trim, vllm_set, check_report, check_steps, chain_case],
                         ids=["gpu_image", "trim", "vllm_set", "check_report", "check_steps", "chain_case"])
def test_the_kits_other_modules_docstring_examples_run(module):
    """The modules wheels.py, run_check.py and cases.py were split into (issue 52) keep their examples running."""
    result = doctest.testmod(module)
    assert result.failed == 0


def test_bad_options_are_one_clear_error_with_exit_code_2(tmp_path, capsys):
    assert run_check.main(["--only", "chain-plain,bogus", "--out", str(tmp_path)]) == 2
    assert "--only: unknown step(s) ['bogus']" in capsys.readouterr().err
    assert not (tmp_path / "gpu-report.json").exists()


def test_the_wheel_list_carries_the_known_good_pins():
    pins, locked = load_matrix().packages("gpu"), locked_versions("gpu")
    listed = {canonicalize_name(w.name): w.version for w in wheels.wanted_wheels()}
    for root in wheels.PINNED_ROOTS:
        key = canonicalize_name(root)
        assert listed[key] == locked[key] and listed[key] == (pins[key].exact or listed[key])
    assert listed["unsloth"] == "2026.10.9" and listed["trl"] == "1.15.0"
    # one version of each package: two stop the whole `pip install --no-deps`
    assert len(listed) == len(wheels.wanted_wheels())


def test_every_requirement_of_the_carried_roots_is_carried_present_or_left_out_with_a_reason():
    """For each root's METADATA (ROOTS_RECORD): each requirement that applies on Python 3.12 / linux
    x86_64 is in the set at a version that satisfies it, on the GPU image, or in LEFT_OUT."""
    listed = {canonicalize_name(w.name): w.version for w in wheels.wanted_wheels()}
    image = {canonicalize_name(name) for name in wheels.IMAGE_PACKAGES}
    left_out = {canonicalize_name(name) for name in wheels.LEFT_OUT}
    uncovered = []
    records = stored_records(ROOTS_RECORD)
    for wanted in wheels.wanted_wheels():
        if wanted.source != "known_good.toml":
            continue
        record = records.get(canonicalize_name(wanted.name))
        assert record is not None and record["version"] == wanted.version, f"no stored METADATA for {wanted.requirement}"
        for line in record["requires_dist"]:
            requirement = Requirement(line)
            if not requirement_applies(requirement, wheels.PYTHON_VERSION):
                continue
            key = canonicalize_name(requirement.name)
            if key in listed:
                assert requirement.specifier.contains(Version(listed[key]), prereleases=True), (
                    f"{wanted.requirement} needs {line}, the set carries {listed[key]}")
            elif key not in image and key not in left_out:
                uncovered.append(f"{wanted.requirement}: {line}")
    assert uncovered == []
    assert set(records) == {canonicalize_name(name) for name in wheels.PINNED_ROOTS}  # no stale record


def test_the_declared_dependency_pins_satisfy_each_other():
    # the pairs whose bounds are tight; a bump of one without the other breaks the offline install
    dependencies = {canonicalize_name(k): Version(v) for k, v in wheels.DEPENDENCIES.items()}
    assert dependencies["dill"] < Version("0.4.2") and dependencies["dill"] >= Version("0.4.1")
    assert dependencies["multiprocess"] < Version("0.70.20")
    assert Version("4.9.3") <= dependencies["antlr4-python3-runtime"] <= Version("4.13.2")


def _fake_wheel(path: Path, files: dict[str, bytes]) -> None:
    dist_info = path.name.split("-")[0] + "-" + path.name.split("-")[1] + ".dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        record = "".join(f"{name},sha256=x,{len(data)}\n" for name, data in files.items())
        archive.writestr(f"{dist_info}/RECORD", record + f"{dist_info}/RECORD,,\n")


def test_trimming_bitsandbytes_keeps_only_the_cuda13_library_and_rewrites_record(tmp_path):
    wheel = tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    _fake_wheel(wheel, {
        "bitsandbytes/__init__.py": b"x = 1\n",
        "bitsandbytes/libbitsandbytes_cuda128.so": b"\0" * 1000,
        "bitsandbytes/libbitsandbytes_cuda130.so": b"\1" * 100,
        "bitsandbytes/libbitsandbytes_rocm72.so": b"\2" * 500,
        "bitsandbytes/libbitsandbytes_cpu.so": b"\3" * 10,
        "bitsandbytes-0.50.2.dist-info/METADATA": b"Name: bitsandbytes\n",
    })
    kept, dropped = wheels.trim_wheel(wheel, "bitsandbytes")
    assert (kept, dropped) == (4, 2)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        record = archive.read("bitsandbytes-0.50.2.dist-info/RECORD").decode()
    assert "bitsandbytes/libbitsandbytes_cuda130.so" in names and "bitsandbytes/libbitsandbytes_cpu.so" in names
    assert not any("cuda128" in n or "rocm" in n for n in names)
    rows = {line.split(",")[0]: line for line in record.splitlines()}
    assert set(rows) == names  # RECORD lists exactly what is left, itself included
    assert rows["bitsandbytes/libbitsandbytes_cuda130.so"].endswith(",100")
    assert "sha256=x" not in record  # fresh hashes


def test_trimming_unsloth_drops_the_studio_ui_and_the_cli(tmp_path):
    wheel = tmp_path / "unsloth-2026.10.9-py3-none-any.whl"
    _fake_wheel(wheel, {"unsloth/__init__.py": b"", "studio/backend/app.py": b"", "unsloth_cli/main.py": b"",
                        "unsloth-2026.10.9.dist-info/METADATA": b""})
    wheels.trim_wheel(wheel, "unsloth")
    with zipfile.ZipFile(wheel) as archive:
        assert sorted(archive.namelist()) == ["unsloth-2026.10.9.dist-info/METADATA",
                                              "unsloth-2026.10.9.dist-info/RECORD", "unsloth/__init__.py"]


def test_the_size_check_refuses_a_set_that_would_pass_the_carry_limit():
    assert "of the 64.0 MiB" in wheels.check_size(16 * 2**20, 2 * 2**20)
    with pytest.raises(wheels.WheelSetError, match="over the 64.0 MiB"):
        wheels.check_size(63 * 2**20, 2 * 2**20)


def test_the_working_tree_size_counts_what_git_would_send():
    size = wheels.working_tree_bytes()
    assert 0 < size < wheels.CARRY_LIMIT_BYTES
    assert size >= (ROOT / "README.md").stat().st_size


def test_install_without_a_built_set_is_one_clear_error(tmp_path, capsys):
    assert wheels.install.__defaults__  # the folder is a parameter, so the test never touches .gpu-wheels
    with pytest.raises(wheels.WheelSetError, match="run `python scripts/gpu_check/wheels.py build` first"):
        wheels.install(tmp_path / "site", folder=tmp_path / "no-wheels")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """`run_check.py --dry-run` exactly as docs/gpu.md writes it (no --only, so every step runs), once for the tests
    that read what it made: the finished process, its $OUT (report, log) and its TMPDIR (the models step's folders)."""
    tmp = tmp_path_factory.mktemp("dry-run")
    out, work = tmp / "out", tmp / "work"
    work.mkdir()  # tempfile.gettempdir() takes TMPDIR only when it exists
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check" / "run_check.py"), "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OUT": str(out), "TMPDIR": str(work)})
    return done, out, work


def test_the_qwen25_shape_is_built_from_config_data_with_the_bundled_tokenizer(dry_run):
    """The folder the dry run's models step built (cases.build_shape in its child) and what the step recorded."""
    from transformers import AutoConfig, AutoTokenizer

    done, out, work = dry_run
    folder = work / "gpu-check-work" / "models" / "qwen2.5-0.5b"
    assert folder.is_dir(), done.stdout[-3000:] + done.stderr[-3000:]
    info = next(r for r in json.loads((out / "gpu-report.json").read_text())["steps"]
                if r["step"] == "models/qwen2.5-0.5b")["detail"]
    assert info["folder"] == str(folder)
    config = AutoConfig.from_pretrained(folder)
    assert config.vocab_size == 151936 and config.tie_word_embeddings and config.eos_token_id == 151645
    assert config.num_hidden_layers == info["shape"]["num_hidden_layers"] == 1  # the dry-run stand-in
    assert cases.QWEN25_SHAPES["qwen2.5-0.5b"]["num_hidden_layers"] == 24  # the GPU builds all 24 layers
    assert AutoTokenizer.from_pretrained(folder).eos_token == "<|im_end|>"


def test_the_dry_run_as_the_docs_write_it_runs_every_step_on_cpu_and_writes_the_report(dry_run):
    assert "`run_check.py --dry-run`" in (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")  # the GPU check
    # Exactly that: no --only, so every step runs (the `models` step once crashed the driver, unseen).
    done, out, _ = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu-report.json").read_text())
    assert (out / "gpu-check.log").is_file()
    status = {record["step"]: record for record in report["steps"]}
    assert report["mode"] == "dry-run"
    assert status["env"]["status"] == "pass" and "packages" in status["env"]["detail"]
    assert {record["step"].split("/")[0] for record in report["steps"]} >= {"env", "models", "chain", "bench"}
    assert status["models/qwen2.5-0.5b"]["status"] == "pass", status.get("models/qwen2.5-0.5b")
    for sub in ("train", "resume", "generate", "export"):
        assert status[f"chain/plain/tiny-qwen2.5/bf16/{sub}"]["status"] == "pass", status.get(
            f"chain/plain/tiny-qwen2.5/bf16/{sub}")
    assert status["chain/plain/tiny-qwen2.5/bf16/resume"]["detail"]["logged_steps"] == [1, 2]
    for step in ("chain/plain/tiny-qwen2.5/nf4/train", "chain/unsloth/qwen2.5-0.5b/bf16/export",
                 "bench/unsloth/tiny-qwen2.5", *run_check.step_units("chain-unsloth-vllm"),
                 "bench/unsloth-vllm/tiny-qwen2.5"):
        assert status[step]["status"] == "skipped" and "CUDA" in status[step]["error"]
    bench = status["bench/plain/tiny-qwen2.5"]
    assert bench["status"] == "pass", bench
    # min_new_tokens forced every rollout to the full length, and TRL's own timing was tapped
    assert bench["detail"]["full_length"] is True
    assert bench["detail"]["completion_mean_lengths"] == [8.0, 8.0]
    assert len(bench["detail"]["generate_times_s"]) == 2 and bench["detail"]["rollout_tokens_per_s"] > 0
    assert report["summary"]["fail"] == 0
    # The product's own path first: the image's versions, then the Unsloth chain, the plain chain, the benchmark.
    order = [record["step"] for record in report["steps"]]
    assert order[0] == "image" and status["image"]["status"] == "pass"
    first = {kind: next(i for i, step in enumerate(order) if step.startswith(kind))
             for kind in ("chain/unsloth/", "chain/plain/", "bench/")}
    assert first["chain/unsloth/"] < first["chain/plain/"] < first["bench/"]
    image = status["image"]["detail"]
    assert {"peft", "accelerate", "pyarrow", "fsspec", "huggingface-hub", "transformers", "torch"} <= set(
        image["packages"])
    assert image["packages"]["peft"]["needs"] == "==0.21.2" and "<=2026.2.0" in image["packages"]["fsspec"]["needs"]
    assert set(image["outside"]) == {name for name, row in image["packages"].items() if not row["ok"]}
    # The adapter changes the greedy output against the base model; the merged export loads and generates.
    generated = status["chain/plain/tiny-qwen2.5/bf16/generate"]["detail"]
    assert generated["adapter_text"] != generated["base_text"]
    exported = status["chain/plain/tiny-qwen2.5/bf16/export"]["detail"]
    assert isinstance(exported["merged_text"], str) and exported["merged_text"] != generated["base_text"]
    rows = report["bench_rows"]
    assert rows and all(set(row) == {"figure", "value", "target", "holds"} for row in rows)
    assert all(isinstance(row["figure"], str) and isinstance(row["value"], str) and isinstance(row["target"], str)
               and row["holds"] in (True, False, None) for row in rows)
    assert "contract tests only" in report["not_covered"] and "fast_generate" in report["not_covered"]
    assert "90%" in report["anchor"]["claim"]


def test_the_main_path_runs_first_and_the_caps_add_up_to_the_budget():
    """Under the 480 s budget the Unsloth chain (the product's own path) must never be what the budget cuts: it
    runs right after the quick steps, and each step has its own share of the budget, restarts included."""
    assert run_check.STEPS[:3] == ("image", "env", "models")
    assert run_check.STEPS[3:] == ("chain-unsloth-vllm", "chain-unsloth", "chain-plain", "bench-plain",
                                   "bench-unsloth", "bench-unsloth-vllm")
    assert set(run_check.STEP_CAPS) == set(run_check.STEPS)
    # without vllm (the one-call set) the steps planned are the rest, and their shares are the seconds written
    assert sum(v for k, v in run_check.STEP_CAPS.items() if k not in run_check.VLLM_STEPS) == run_check.BUDGET_S == 480
    assert "--budget-s 480" in run_check.__doc__


def test_the_image_packages_are_checked_against_the_ranges_the_kit_needs():
    """The ranges come from env/known_good.toml's plain pins and the carried wheels' Requires-Dist (ROOTS_RECORD);
    the versions are the machine's. A version outside its range, or a missing package, is named."""
    needs = gpu_image.image_requirements()
    assert str(needs["peft"]["needs"]) == "==0.21.2" and "known_good.toml [plain]" in needs["peft"]["from"]
    assert needs["fsspec"]["from"] == ["datasets==4.8.5"] and Version("2026.2.0") in needs["fsspec"]["needs"]
    assert Version("2026.3.0") not in needs["fsspec"]["needs"]
    assert Version("2.11.0") in needs["torch"]["needs"]  # the lent machine's torch is inside every range
    assert "vllm" not in needs and "trl" not in needs  # carried or left out, not taken from the image
    versions = {name: "0" for name in needs}
    versions.update(peft="0.21.2", fsspec="2026.3.0", pyarrow=None)
    found = gpu_image.check_image(versions)
    assert found["packages"]["peft"]["ok"] and not found["packages"]["fsspec"]["ok"]
    assert {"fsspec", "pyarrow"} <= set(found["outside"]) and "peft" not in found["outside"]
    assert "needs <=2026.2.0" in found["outside"]["fsspec"] and "not installed" in found["outside"]["pyarrow"]


def test_what_a_lent_machine_can_and_cannot_prove_is_one_paragraph_in_the_kit_and_the_docs():
    paragraph = run_check.PROVES
    assert "fast_inference: true" in paragraph and "contract tests" in paragraph
    assert "320 MB" in paragraph and "torch 2.13" in paragraph and "torch 2.11" in paragraph and "64 MiB" in paragraph
    assert f"vLLM {wheels.VLLM_VERSION}" in paragraph and "not on the pinned 0.31.0" in paragraph
    assert f"at most {parts.PART_LIMIT_BYTES // 2**20} MiB" in paragraph
    assert " ".join(paragraph.split()) in " ".join(run_check.__doc__.split())
    assert " ".join(paragraph.split()) in " ".join((ROOT / "docs" / "gpu.md").read_text(encoding="utf-8").split())


def test_a_bench_row_holds_only_when_both_backends_did_equal_full_length_work():
    plain = {"backend": "plain", "peak_vram_gib": 4.0, "median_step_s": 2.0, "rollout_tokens_per_s": 100.0,
             "full_length": True, "completion_length_target": 128}
    fast = {**plain, "backend": "unsloth", "peak_vram_gib": 3.0, "median_step_s": 1.0, "rollout_tokens_per_s": 150.0}
    counts = {"pass": 1, "fail": 0, "skipped": 0}
    rows = {row["figure"].split(" (")[0] + " " + row["figure"].split(" (")[1][:12]: row
            for row in run_check.bench_rows({"plain/qwen2.5-0.5b": plain, "unsloth/qwen2.5-0.5b": fast}, counts)[1:]}
    vram = rows["peak VRAM, Unsloth / plain qwen2.5-0.5b"]
    assert vram["value"].startswith("0.75x") and vram["holds"] is True
    assert rows["GRPO step time, plain / Unsloth qwen2.5-0.5b"]["value"].startswith("2.00x")
    assert rows["rollout tokens/s, Unsloth / plain qwen2.5-0.5b"]["holds"] is True
    assert rows["peak VRAM, Unsloth / plain qwen2.5-1.5b"]["holds"] is None  # not measured
    cut_short = run_check.bench_rows({"plain/qwen2.5-0.5b": plain,
                                      "unsloth/qwen2.5-0.5b": {**fast, "full_length": False}}, counts)
    assert cut_short[1]["holds"] is None and "unequal lengths" in cut_short[1]["value"]


def test_the_device_command_is_the_same_in_the_docstring_and_docs_gpu_and_fits_the_device():
    command = next(line.strip() for line in run_check.__doc__.splitlines() if line.strip().startswith("set -o"))
    assert len(command) <= 2000  # the device tool's limit on one command
    assert command in (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")  # the GPU check lives there
    assert "wheels.py install --target /tmp/site" in command and "run_check.py --out $OUT" in command
    assert 'carry [".gpu-wheels"]' in run_check.__doc__ and wheels.WHEEL_DIR.name == ".gpu-wheels"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(wheels.WHEEL_DIR / "x.whl")], cwd=ROOT)
    assert ignored.returncode == 0  # the set never travels as tracked files, only as the carried folder


def test_only_takes_steps_or_units_and_shares_the_whole_budget_among_the_steps_chosen(tmp_path):
    """A rerun on a lent machine proves what the last one did not reach: every step and every unit of every step
    can be chosen alone, in STEPS order, and the chosen steps share the whole budget (one step gets all of it)."""
    import argparse

    every = {step: run_check.step_units(step) for step in run_check.STEPS}
    assert run_check.chosen_steps(None) == every
    for step, units in every.items():
        assert run_check.chosen_steps(step) == {step: units}
        for unit in units:
            assert run_check.chosen_steps(unit) == {step: [unit]}
    mixed = run_check.chosen_steps("bench-unsloth, chain/unsloth/qwen2.5-0.5b/nf4,chain/plain/tiny-qwen2.5/bf16")
    assert list(mixed) == ["chain-unsloth", "chain-plain", "bench-unsloth"]
    with pytest.raises(ValueError, match=r"\['chain/unsloth/qwen9/nf4'\]"):
        run_check.chosen_steps("chain-plain,chain/unsloth/qwen9/nf4")

    def caps(only):
        args = argparse.Namespace(only=only, dry_run=False, budget_s=480.0, out=tmp_path, work=tmp_path)
        driver = run_check.Driver(args)
        return {step: driver.cap(step) for step in driver.chosen}

    without_vllm = {k: v for k, v in run_check.STEP_CAPS.items() if k not in run_check.VLLM_STEPS}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_check, "vllm_installed", lambda: False)  # the one-call set: the vLLM steps take no share
        assert {k: v for k, v in caps(None).items() if k not in run_check.VLLM_STEPS} == without_vllm
        patch.setattr(run_check, "vllm_installed", lambda: True)  # the parts mode: every step shares the budget
        assert sum(caps(None).values()) == pytest.approx(480.0)
        assert caps(None)["chain-unsloth"] < without_vllm["chain-unsloth"]
    assert caps("chain/unsloth/qwen2.5-0.5b/nf4") == {"chain-unsloth": 480.0}
    # a case names its sub-steps: the vLLM chain's units are one process each
    assert run_check.chosen_steps("chain/unsloth-vllm/qwen2.5-0.5b/nf4") == {"chain-unsloth-vllm": [
        f"chain/unsloth-vllm/qwen2.5-0.5b/nf4/{sub}" for sub in cases.VLLM_CHAIN_SUBSTEPS]}
    shared = caps("chain-unsloth,bench-unsloth")
    assert sum(shared.values()) == pytest.approx(480.0) and shared["chain-unsloth"] > shared["bench-unsloth"]


# --- the parts mode: the set with vLLM (wheels.py build --vllm) travels in parts (parts.py) ----------------------


def _built_set(folder: Path, seed: int = 0) -> Path:
    """A small stand-in for a built set: manifest.json and two 'wheels' of incompressible bytes."""
    folder.mkdir(parents=True)
    (folder / wheels.MANIFEST_NAME).write_text(json.dumps({"wheels": [], "seed": seed}), encoding="utf-8")
    for index, size in enumerate((30_000, 7_000)):
        (folder / f"pkg{index}-1.0-py3-none-any.whl").write_bytes(os.urandom(size))
    return folder


def _archive_bytes(folder: Path, scratch: Path) -> int:
    parts.pack(folder, scratch / "probe.tar")
    return (scratch / "probe.tar").stat().st_size


def _store_all(manifest: dict, out: Path, dest: Path) -> None:
    for part in manifest["parts"]:
        parts.store(out / part["name"], dest)


def _missing(manifest, out, dest):
    (dest / "part02").unlink()


def _corrupted(manifest, out, dest):
    data = bytearray((dest / "part01").read_bytes())
    data[100] ^= 0xFF
    (dest / "part01").write_bytes(bytes(data))


def _recycled(manifest, out, dest):
    shutil.rmtree(dest)


@pytest.mark.parametrize("limit_delta, damage, expected", [
    (0, None, ["part01"]),                      # the archive exactly at the part limit: one part, full
    (-1, None, ["part01", "part02"]),           # one byte over the limit: a second part of one byte
    (-1, _missing, "part02: missing from"),
    (-1, _corrupted, "part01: corrupted"),
    (-1, "other build", "part02: from build"),
    (-1, _recycled, "none is there: the machine was recycled"),
], ids=["at-the-limit", "one-byte-over", "missing-part", "corrupted-part", "part-of-another-build", "recycled"])
def test_split_store_assemble_round_trip(tmp_path, limit_delta, damage, expected):
    folder = _built_set(tmp_path / "set")
    size = _archive_bytes(folder, tmp_path)
    out, dest, into = tmp_path / ".gpu-parts", tmp_path / "device" / "gpu-parts", tmp_path / "device" / "wheels"
    manifest = parts.split(folder, out, limit=size + limit_delta, tree_bytes=0)
    assert all(p["bytes"] <= size + limit_delta for p in manifest["parts"])
    assert sum(p["bytes"] for p in manifest["parts"]) == manifest["archive_bytes"] == size
    _store_all(manifest, out, dest)
    if damage == "other build":  # an earlier split's part02 is still in /tmp: same name, other bytes
        other = parts.split(_built_set(tmp_path / "other", seed=1), tmp_path / "other-parts", limit=size - 1,
                            tree_bytes=0)
        assert other["build"] != manifest["build"]
        parts.store(tmp_path / "other-parts" / "part02", dest)
    elif damage is not None:
        damage(manifest, out, dest)
    if isinstance(expected, list):
        assert [p["name"] for p in manifest["parts"]] == expected
        names = parts.assemble(out / parts.PARTS_MANIFEST, dest, into)
        assert names == sorted(p.name for p in folder.iterdir())
        for name in names:  # the set arrives byte for byte
            assert (into / name).read_bytes() == (folder / name).read_bytes()
        return
    with pytest.raises(wheels.WheelSetError) as err:
        parts.assemble(out / parts.PARTS_MANIFEST, dest, into)
    message = str(err.value)
    assert expected in message and "Traceback" not in message
    bad = [line.split(":", 1)[0].strip() for line in message.splitlines() if line.startswith("  part")]
    for name in bad:  # each part named comes with the call that stores it again, and only those
        assert f'run carry [".gpu-parts/{name}"] command: python3 scripts/gpu_check/parts.py store .gpu-parts/{name}' \
            in message
    assert message.count("parts.py store") == len(bad) and not into.exists()


def test_a_missing_part_is_one_message_naming_it_and_the_rerun_with_exit_code_2(tmp_path, capsys):
    folder = _built_set(tmp_path / "set")
    size = _archive_bytes(folder, tmp_path)
    out, dest = tmp_path / ".gpu-parts", tmp_path / "gpu-parts"
    manifest = parts.split(folder, out, limit=-(-size // 3), tree_bytes=0)
    assert len(manifest["parts"]) == 3
    for name in ("part01", "part03"):
        assert parts.main(["store", str(out / name), "--dest", str(dest)]) == 0
    code = parts.main(["assemble", "--manifest", str(out / parts.PARTS_MANIFEST), "--dest", str(dest),
                       "--into", str(tmp_path / "wheels")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: 1 of the 3 parts of build")
    assert "part02: missing" in err and "part01:" not in err and "Traceback" not in err
    assert 'carry [".gpu-parts/part02"] command: python3 scripts/gpu_check/parts.py store .gpu-parts/part02' in err
    # a store call whose part was not carried says which carry it needs
    assert parts.main(["store", str(tmp_path / "nowhere" / "part02"), "--dest", str(dest)]) == 2
    assert 'carry [".gpu-parts/part02"]' in capsys.readouterr().err


def test_split_refuses_a_part_that_would_not_fit_beside_the_tree_and_assemble_installs(tmp_path, monkeypatch):
    folder = _built_set(tmp_path / "set")
    with pytest.raises(wheels.WheelSetError, match="would pass the 64 MiB the device carries"):
        parts.split(folder, tmp_path / "p", limit=parts.PART_LIMIT_BYTES, tree_bytes=10 * 2**20)
    assert parts.PART_LIMIT_BYTES + wheels.working_tree_bytes() <= wheels.CARRY_LIMIT_BYTES  # this tree fits
    manifest = parts.split(folder, tmp_path / "p", tree_bytes=0)
    _store_all(manifest, tmp_path / "p", tmp_path / "d")
    installed = []
    monkeypatch.setattr(parts, "install", lambda target, where: installed.append((target, where)))
    parts.assemble(tmp_path / "p" / parts.PARTS_MANIFEST, tmp_path / "d", tmp_path / "w", target=tmp_path / "site")
    assert installed == [(tmp_path / "site", tmp_path / "w")]
    (tmp_path / "empty-set").mkdir()
    with pytest.raises(wheels.WheelSetError, match="no built set"):
        parts.split(tmp_path / "empty-set", tmp_path / "q", tree_bytes=0)


def test_the_device_calls_store_one_part_each_then_one_call_installs_and_runs_the_check(tmp_path):
    manifest = {"build": "abc", "parts": [{"name": "part01"}, {"name": "part02"}]}
    calls = parts.device_calls(manifest)
    assert [c["carry"] for c in calls] == [[".gpu-parts/part01"], [".gpu-parts/part02"], [".gpu-parts/manifest.json"]]
    assert all(len(c["command"]) <= 2000 and c["timeout_s"] <= 600 for c in calls)
    assert calls[0]["command"] == "python3 scripts/gpu_check/parts.py store .gpu-parts/part01"
    final = calls[-1]["command"]
    assert "parts.py assemble --target /tmp/site" in final and "--only models," in final
    assert f"--budget-s {parts.FINAL_BUDGET_S}" in final and parts.FINAL_BUDGET_S + 60 <= calls[-1]["timeout_s"]
    chosen = run_check.chosen_steps(parts.FINAL_STEPS)  # every entry is a step or unit the check knows
    assert chosen["bench-unsloth-vllm"] == ["bench/unsloth-vllm/qwen2.5-0.5b"] and len(chosen) == 5
    dry = run_check.chosen_steps(parts.FINAL_STEPS, dry_run=True)  # and the dry run of the same call, on CPU
    assert dry["bench-unsloth-vllm"] == ["bench/unsloth-vllm/tiny-qwen2.5"] and list(dry) == list(chosen)
    docs = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    assert final in docs and "parts.py store .gpu-parts/part01" in docs  # the GPU check section says the sequence
    for folder in (wheels.VLLM_WHEEL_DIR, parts.PARTS_DIR):  # generated, never committed
        assert subprocess.run(["git", "check-ignore", "-q", str(folder / "x")], cwd=ROOT).returncode == 0


def test_the_vllm_set_covers_every_requirement_of_vllm_and_of_what_it_carries():
    """vllm 0.26.0's Requires-Dist and those of each package carried for it (VLLM_RECORD, from pip's resolution):
    each applying requirement is carried at a version that satisfies it, on the image, or left out with a reason;
    every reason is for a requirement vllm really has."""
    records = vllm_set.stored_records()
    listed = {canonicalize_name(w.name): w.version for w in wheels.wanted_wheels(vllm=True)}
    image = {canonicalize_name(name) for name in wheels.IMAGE_PACKAGES}
    left_out = {canonicalize_name(name) for name in {**wheels.LEFT_OUT, **wheels.VLLM_LEFT_OUT}}
    assert records["vllm"]["version"] == wheels.VLLM_VERSION == "0.26.0"
    uncovered = []
    for name, version in listed.items():
        if name not in records:
            continue  # a root of the one-call set: checked against ROOTS_RECORD above
        assert records[name]["version"] == version, name
        for line in records[name]["requires_dist"]:
            requirement = Requirement(line)
            if not requirement_applies(requirement, wheels.PYTHON_VERSION):
                continue
            key = canonicalize_name(requirement.name)
            if key in listed:
                assert requirement.specifier.contains(Version(listed[key]), prereleases=True), (name, line)
            elif key not in image and key not in left_out:
                uncovered.append(f"{name}: {line}")
    assert uncovered == []
    assert set(wheels.VLLM_DEPENDENCIES) <= set(records)  # each carried dependency was resolved with vllm
    needed = {canonicalize_name(Requirement(line).name) for line in records["vllm"]["requires_dist"]}
    assert {canonicalize_name(name) for name in wheels.VLLM_LEFT_OUT} <= needed
    # the torch vLLM 0.26.0 pins is the image's: the image step checks it there
    needs = gpu_image.image_requirements(vllm=True)
    assert str(needs["torch"]["needs"]) == "==2.11.0" and f"vllm=={wheels.VLLM_VERSION}" in needs["torch"]["from"]
    assert "vllm" not in gpu_image.image_requirements()["torch"]["from"][0]


def test_trimming_vllm_drops_what_a_dense_model_on_sm90_never_loads(tmp_path):
    wheel = tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    kept = {"vllm/__init__.py", "vllm/_C_stable_libtorch.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
            "vllm/vllm_flash_attn/flash_attn_interface.py", "vllm/third_party/pynvml.py",
            "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so", "vllm/cumem_allocator.abi3.so",
            "vllm-0.26.0.dist-info/METADATA"}
    dropped = {*wheels.VLLM_DROPPED, "vllm/third_party/deep_gemm/include/cute/tensor.hpp",
               "vllm/third_party/fmha_sm100/cutlass/include/cutlass/matrix.h",
               "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so"}
    _fake_wheel(wheel, {name: b"x" for name in kept | dropped})
    assert wheels.trim_wheel(wheel, "vllm") == (len(kept), len(dropped))
    with zipfile.ZipFile(wheel) as archive:
        assert set(archive.namelist()) == kept | {"vllm-0.26.0.dist-info/RECORD"}


def test_the_vllm_steps_are_skipped_with_their_reason_where_they_cannot_run(tmp_path, monkeypatch):
    import argparse

    def skipped(dry_run: bool) -> dict:
        args = argparse.Namespace(only="chain-unsloth-vllm,bench-unsloth-vllm", dry_run=dry_run, budget_s=480.0,
                                  out=tmp_path, work=tmp_path)
        driver = run_check.Driver(args)
        for step, units in driver.chosen.items():
            for unit in units:
                assert driver._dry_run_skip(unit)  # recorded without starting a child
        return {r["step"]: r["error"] for r in driver.records}

    monkeypatch.setattr(run_check, "vllm_installed", lambda: False)
    on_gpu = skipped(dry_run=False)
    assert set(on_gpu) == {*run_check.step_units("chain-unsloth-vllm"), *run_check.step_units("bench-unsloth-vllm")}
    assert all("the parts mode installs it" in why for why in on_gpu.values())
    monkeypatch.setattr(run_check, "vllm_installed", lambda: True)
    on_cpu = skipped(dry_run=True)
    assert set(on_cpu) == {*run_check.step_units("chain-unsloth-vllm"), "bench/unsloth-vllm/tiny-qwen2.5"}
    assert all("CUDA" in why for why in on_cpu.values())


def test_the_bench_rows_compare_unsloth_with_vllm_to_the_other_two_rows():
    row = {"peak_vram_gib": 3.0, "median_step_s": 2.0, "rollout_tokens_per_s": 200.0, "full_length": True,
           "completion_length_target": 128}
    bench = {"plain/qwen2.5-0.5b": {**row, "rollout_tokens_per_s": 100.0, "median_step_s": 4.0},
             "unsloth/qwen2.5-0.5b": row,
             f"{cases.VLLM_LABEL}/qwen2.5-0.5b": {**row, "rollout_tokens_per_s": 2000.0, "median_step_s": 0.5,
                                                  "gpu_memory_utilization": 0.3, "device_used_peak_gib": 44.0}}
    rows = {r["figure"]: r for r in run_check.bench_rows(bench, {"pass": 3, "fail": 0, "skipped": 0})}
    where = "(qwen2.5-0.5b shape, 4-bit QLoRA GRPO, 128-token completions)"
    assert rows[f"rollout tokens/s, Unsloth + vLLM / Unsloth without vLLM {where}"]["value"].startswith("10.00x")
    assert rows[f"rollout tokens/s, Unsloth + vLLM / plain {where}"]["holds"] is True
    assert rows[f"GRPO step time, Unsloth without vLLM / Unsloth + vLLM {where}"]["value"].startswith("4.00x")
    vram = rows[f"peak VRAM, Unsloth + vLLM at gpu_memory_utilization 0.3 {where}"]
    assert "44.0 GiB in use on the card" in vram["value"] and vram["holds"] is None
    assert not any("Unsloth + vLLM" in figure for figure in rows if "1.5b" in figure)  # no vLLM row measured there


@pytest.mark.parametrize("lines, error", [
    ([{"step": 1, "health/rollout_logp_gap": 0.01, "health/rollout_weights_step": 1.0},
      {"step": 2, "reward": 0.0, "health/rollout_logp_gap": 0.0, "health/rollout_weights_step": 2.0}], None),
    ([{"step": 1, "health/rollout_logp_gap": 0.01}], "missing or above 0.05 at steps {2: None}"),
    ([{"step": 1, "health/rollout_logp_gap": 0.2}, {"step": 2, "health/rollout_logp_gap": 0.0}], "{1: 0.2}"),
    ([{"step": 1, "health/rollout_logp_gap": float("nan")}, {"step": 2, "health/rollout_logp_gap": 0.0}], "{1: nan}"),
    ([{"step": 1, "health/rollout_logp_gap": 0.0, "health/rollout_weights_step": 1.0},
      {"step": 2, "health/rollout_logp_gap": 0.0, "health/rollout_weights_step": 1.0}], "older weights than the step's own: {2: 1.0}"),
], ids=["fresh", "missing", "above-floor", "not-finite", "stale"])
def test_the_vllm_chain_reads_the_stale_rollout_probe_at_every_step(tmp_path, lines, error):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if error is None:
        assert chain_case.probe_gaps(tmp_path, [1, 2])["rollout_logp_gap"] == {1: 0.01, 2: 0.0}
    else:
        with pytest.raises(RuntimeError, match=re.escape(error)):
            chain_case.probe_gaps(tmp_path, [1, 2])


def test_vllm_calls_counts_the_engines_and_the_generate_calls_and_restores_the_class(monkeypatch):
    import types

    class LLM:  # the shape of vllm.LLM that VllmCalls relies on: outputs[i].outputs[j].token_ids
        def __init__(self, model):
            self.model = model

        def generate(self, prompts, sampling_params=None, lora_request=None):
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[1, 2, 3])]) for _ in prompts]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    original = LLM.generate
    with cases.VllmCalls() as calls:
        engine = LLM("m")
        fast_generate = engine.generate  # Unsloth binds it once, at load: the patched method is what it holds
        fast_generate(["a", "b"])
        fast_generate(["c"], lora_request=object())
    assert calls.summary() == {"engines": 1, "generate_calls": 2, "with_lora": 1, "output_tokens": 9}
    assert LLM.generate is original and len(engine.generate(["d"])) == 1 and calls.summary()["generate_calls"] == 2
