"""The Unsloth path's refusals and switches, in Python and through the `grpo` CLI (exit code 2 + message).

Covers: lora_modules_to_save with vLLM, vllm_standby as a YAML/CLI boolean, VLLM_SLEEP_MODE with standby,
choosing the backend without importing torch, and a GPU recipe on a machine where CUDA is unusable (no device, or a
driver too old for the torch build), including the `nvidia-smi` driver fallback. Where a GPU or Unsloth
would be needed, the subprocess installs tests/fake_unsloth.py and a "usable CUDA" probe: only the GPU
boundary is replaced. The GPU-recipe refusals, which import torch before they stop, run the CLI's main in this
process (the same boundary replaced with monkeypatch).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_pipeline.env import probes
from tests import cli_helpers
from grpo_pipeline.pipeline import backends
from grpo_pipeline.pipeline.backends import BackendChoice, gpu_settings, refuse_gpu_recipe_without_cuda
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, parse_config, validate

ROOT = Path(__file__).resolve().parents[1]

# The CLI entry point, with the GPU boundary replaced when the environment asks for it.
CLI_WRAPPER = textwrap.dedent("""
    import os, sys
    if os.environ.get("TEST_FAKE_GPU") == "1":
        import tests.fake_unsloth as fake
        fake.install()
        import grpo_pipeline.env.probes as probes
        probes.cuda_usability = lambda: probes.CudaUsability(True, "test: a usable GPU", "580.65.06", "13.0")
    from grpo_pipeline.pipeline.cli import main
    raise SystemExit(main(sys.argv[1:]))
""")


def run_cli(args, tmp_path, wrapper=False, **env_extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("VLLM_SLEEP_MODE", None)
    env.update(env_extra)
    command = [sys.executable, "-c", CLI_WRAPPER] if wrapper else [sys.executable, "-m", "grpo_pipeline.pipeline"]
    return subprocess.run([*command, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def write_recipe(tmp_path, text):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(text))
    return recipe


def fake_nvidia_smi(tmp_path, driver="535.104.05"):
    """An `nvidia-smi` that answers only the exact driver query the probe makes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--query-gpu=driver_version" ] && [ "$2" = "--format=csv,noheader" ]; then
            echo "{driver}"; exit 0
        fi
        echo "unexpected arguments: $*" >&2; exit 6
    """))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


# ------------------------------------------------------------------------------ lora_modules_to_save with vLLM


def test_modules_to_save_with_fast_inference_is_refused_by_validate():
    cfg = PipelineConfig().replace(lora_modules_to_save=["embed_tokens"], backend="unsloth")
    with pytest.raises(ConfigError) as err:
        validate(cfg, n_processes=1)
    assert err.value.field == "lora_modules_to_save"
    assert "fast_inference: false" in str(err.value) and "backend: plain" in str(err.value)
    # Resolved backend plain (e.g. auto on a CPU machine): allowed, as the tiny demo needs it.
    assert validate(PipelineConfig().replace(lora_modules_to_save=["norm"]), n_processes=1, backend="plain") == []
    assert validate(cfg.replace(fast_inference=False), n_processes=1) == []


def test_modules_to_save_with_fast_inference_cli_exit_2(tmp_path):
    recipe = write_recipe(tmp_path, """\
        model_name_or_path: tiny-demo
        backend: unsloth
        dataset_name: demo-arithmetic
        lora_modules_to_save: [lm_head]
    """)
    result = run_cli(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "run")], tmp_path,
                     wrapper=True, TEST_FAKE_GPU="1")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "config error in `lora_modules_to_save`" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "data_report.json").exists()  # refused before any data or model work


# ------------------------------------------------------------------------------ vllm_standby as a boolean


@pytest.mark.parametrize("yaml_value", ["true", "True", "false", "auto"])
def test_vllm_standby_yaml_boolean(tmp_path, yaml_value):
    recipe = write_recipe(tmp_path, f"vllm_standby: {yaml_value}\n")
    cfg = parse_config(["--config", str(recipe)])
    assert cfg.model.vllm_standby == yaml_value.lower()
    assert validate(cfg, n_processes=1) == []


@pytest.mark.parametrize(("given", "expected"), [("True", "true"), ("FALSE", "false"), ("Auto", "auto")])
def test_vllm_standby_cli_any_case(given, expected):
    cfg = parse_config(["--vllm_standby", given])
    assert cfg.model.vllm_standby == expected
    assert gpu_settings.standby_enabled(cfg, has_cuda=True) is (expected != "false")


def test_vllm_standby_nonsense_names_the_field():
    with pytest.raises(ConfigError, match="vllm_standby"):
        validate(PipelineConfig().replace(vllm_standby="maybe"), n_processes=1)


def test_vllm_standby_true_in_yaml_passes_the_cli(tmp_path):
    # num_generations: 1 is a later validate() error: reaching it shows vllm_standby: true was accepted.
    recipe = write_recipe(tmp_path, """\
        model_name_or_path: tiny-demo
        backend: plain
        vllm_standby: true
        num_generations: 1
    """)
    result = run_cli(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "run")], tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "vllm_standby" not in result.stderr and "config error in `num_generations`" in result.stderr
    result = run_cli(["train", "--config", str(recipe), "--vllm_standby", "True", "--output_dir",
                      str(tmp_path / "run")], tmp_path)
    assert result.returncode == 2 and "config error in `num_generations`" in result.stderr, result.stderr[-3000:]


# ------------------------------------------------------------------------------ fast_inference


def test_fast_inference_field_parses_and_refuses_vllm_only_options(tmp_path):
    assert PipelineConfig().model.fast_inference is True
    cfg = parse_config(["--fast_inference", "false"])
    assert cfg.model.fast_inference is False
    assert validate(cfg.replace(backend="unsloth"), n_processes=1) == []
    with pytest.raises(ConfigError) as err:
        validate(cfg.replace(vllm_sampling_params={"min_p": 0.1}), n_processes=1, backend="unsloth")
    assert err.value.field == "vllm_sampling_params"
    with pytest.raises(ConfigError) as err:
        validate(cfg.replace(vllm_standby="true"), n_processes=1, backend="unsloth")
    assert err.value.field == "vllm_standby"


# ------------------------------------------------------------------------------ VLLM_SLEEP_MODE


def test_vllm_sleep_mode_refused_only_with_standby(monkeypatch):
    monkeypatch.setenv("VLLM_SLEEP_MODE", "1")
    gpu_settings.refuse_vllm_sleep_mode(standby=False)
    with pytest.raises(ConfigError) as err:
        gpu_settings.refuse_vllm_sleep_mode(standby=True)
    assert err.value.field == "VLLM_SLEEP_MODE" and "'1'" in str(err.value)
    monkeypatch.delenv("VLLM_SLEEP_MODE")
    gpu_settings.refuse_vllm_sleep_mode(standby=True)


def test_vllm_sleep_mode_with_standby_cli_exit_2(tmp_path):
    recipe = write_recipe(tmp_path, """\
        model_name_or_path: tiny-demo
        backend: unsloth
        dataset_name: demo-arithmetic
        vllm_standby: true
    """)
    result = run_cli(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "run")], tmp_path,
                     wrapper=True, TEST_FAKE_GPU="1", VLLM_SLEEP_MODE="2")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "config error in `VLLM_SLEEP_MODE`" in result.stderr and "Traceback" not in result.stderr
    assert "unset VLLM_SLEEP_MODE" in result.stderr
    assert not (tmp_path / "run").exists()  # refused before any data or model work


# ------------------------------------------------------------------------------ choosing without torch


def test_choose_backend_imports_no_torch():
    code = textwrap.dedent("""
        import sys
        from grpo_pipeline.pipeline.backends import choose_backend
        for requested in ("auto", "plain"):
            choose_backend(requested)
        print(sorted(m for m in ("torch", "transformers", "trl", "peft") if m in sys.modules))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_auto_without_vllm_picks_unsloth_without_fast_inference(monkeypatch):
    monkeypatch.setattr(backends, "cuda_available", lambda: True)
    real_find_spec = backends.importlib.util.find_spec
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "unsloth" else (None if name == "vllm" else
                                                                             real_find_spec(name, *a)))
    choice = backends.choose_backend("auto")
    assert (choice.name, choice.fast_inference) == ("unsloth", False)
    assert "vllm is not installed" in choice.reason and "fast_inference: false" in choice.reason
    with pytest.raises(ConfigError, match="fast_inference: false"):
        backends.choose_backend("unsloth")  # explicit unsloth with vLLM wanted: say how to go without it
    assert backends.choose_backend("unsloth", fast_inference=False).fast_inference is False


# ------------------------------------------------------------------------------ no usable CUDA


def test_driver_from_nvidia_smi_when_proc_is_absent(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(probes, "Path", lambda p: tmp_path / "no-proc" if p == "/proc/driver/nvidia/version"
                        else Path(p))
    assert probes.nvidia_smi_driver_version() == "535.104.05"
    assert probes.nvidia_driver_version() == "535.104.05"


def test_driver_too_old_for_the_torch_build(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(probes, "torch_build", lambda: {"version": "2.14.0", "cuda": "13.0"})
    monkeypatch.setattr(probes, "nvidia_driver_version", lambda: "535.104.05")
    status = probes.cuda_usability()
    assert not status.usable and (status.driver, status.torch_cuda, status.driver_needed) == (
        "535.104.05", "13.0", "580.65.06")
    assert "535.104.05" in status.reason and "CUDA 13.0" in status.reason and ">= 580.65.06" in status.reason
    monkeypatch.setattr(probes, "nvidia_driver_version", lambda: "580.95.05")
    assert probes.cuda_usability().usable
    monkeypatch.setattr(probes, "nvidia_driver_version", lambda: None)
    assert "no NVIDIA device" in probes.cuda_usability().reason


def test_gpu_recipe_without_cuda_is_refused_with_reason_and_fix(monkeypatch):
    monkeypatch.setattr(probes, "cuda_usability", lambda: probes.CudaUsability(
        False, "NVIDIA driver 535.104.05 is too old ...", "535.104.05", "13.0", "580.65.06"))
    plain = BackendChoice("plain", "auto: no usable CUDA GPU")
    recipe = PipelineConfig()  # unsloth/Qwen2.5-1.5B-Instruct, backend auto
    with pytest.raises(ConfigError) as err:
        refuse_gpu_recipe_without_cuda(recipe, plain)
    message = str(err.value)
    assert err.value.field == "model_name_or_path" and "535.104.05" in message
    assert "update the NVIDIA driver to >= 580.65.06" in message and "backend: plain" in message
    # Not GPU-sized: the tiny demo (CPU demo, tests), or backend: plain chosen on purpose.
    refuse_gpu_recipe_without_cuda(recipe.replace(model_name_or_path="tiny-demo"), plain)
    refuse_gpu_recipe_without_cuda(recipe.replace(backend="plain"), plain)


# These two stop in `grpo train`'s checks, after torch is imported (~10 s for a process of their own): they run
# through the CLI's main in this process (tests/cli_helpers.py); the cases above show the `grpo` process's own exit 2.


def run_cli_here(args, tmp_path, monkeypatch, capsys) -> tuple[int, str]:
    """`grpo ARGS` in this process as run_cli runs it in a subprocess: in tmp_path, offline, no VLLM_SLEEP_MODE."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("VLLM_SLEEP_MODE", raising=False)
    return cli_helpers.run_cli(args, capsys)


def test_gpu_recipe_on_cpu_cli_exit_2(tmp_path, monkeypatch, capsys):
    recipe = ROOT / "configs" / "qwen2.5-0.5b-gsm8k.yaml"
    code, output = run_cli_here(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "run")], tmp_path,
                                monkeypatch, capsys)
    assert code == 2, output[-3000:]
    assert "config error in `model_name_or_path`" in output and "CUDA is not usable" in output
    assert "Fix:" in output and "Traceback" not in output
    assert not (tmp_path / "run" / "data_report.json").exists()


def test_gpu_recipe_with_old_driver_cli_exit_2(tmp_path, monkeypatch, capsys):
    recipe = ROOT / "configs" / "qwen2.5-1.5b-gsm8k.yaml"
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    build = probes.torch_build()  # the GPU boundary: a torch built for CUDA 13.0
    monkeypatch.setattr(probes, "torch_build", lambda: {**build, "cuda": "13.0"})
    code, output = run_cli_here(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "run")], tmp_path,
                                monkeypatch, capsys)
    assert code == 2, output[-3000:]
    assert "NVIDIA driver 535.104.05 is too old" in output and "CUDA 13.0" in output
    assert "update the NVIDIA driver to >= 580.65.06" in output and "Traceback" not in output


def test_gpu_recipe_is_refused_when_torch_disagrees_with_the_probe(monkeypatch):
    monkeypatch.setattr(probes, "cuda_usability", lambda: probes.CudaUsability(
        True, "NVIDIA driver 580.95.05, torch built for CUDA 13.0", "580.95.05", "13.0", "580.65.06"))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ConfigError) as err:
        refuse_gpu_recipe_without_cuda(PipelineConfig(), BackendChoice("plain", "auto"))
    assert "sees no CUDA device although NVIDIA driver 580.95.05" in str(err.value)
    assert "nvidia-smi" in str(err.value)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    refuse_gpu_recipe_without_cuda(PipelineConfig(), BackendChoice("plain", "auto"))
