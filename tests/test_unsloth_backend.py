"""Contract tests for the GPU boundary: pipeline/backends/unsloth.py against a recording fake.

The fake (tests/fake_unsloth.py) stands in for the pinned unsloth, unsloth_zoo and vLLM; every call binds
to the signatures env/upstream_signatures.py read from those wheels (env/upstream_signatures.json), and it
raises where they raise. These tests check OUR side: the calls and arguments we make, their order, and what
we do with the results. They do not show that Unsloth or vLLM work; that needs a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tests.fake_unsloth as fake_unsloth
from env.adapters import verify_adapter_dir
from env.paths import atomic_directory
from pipeline.backends import gpu_settings
from pipeline.backends import unsloth as backend
from pipeline.backends import unsloth_setup
from pipeline.config import ConfigError, PipelineConfig

ROOT = Path(__file__).resolve().parents[1]

# In this pytest process trl/transformers are usually imported already, so both the fake's copy of
# Unsloth's import-order warning and ours fire; the import order itself is tested in a clean subprocess.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*Unsloth should be imported before.*:UserWarning",
    "ignore:Unsloth must be imported before.*:UserWarning",
)

STANDBY = "UNSLOTH_VLLM_STANDBY"
GPU_GIB = 22.5  # an L4: standby tier 0.825 * 0.95, no-standby share 0.55


@pytest.fixture
def fake(monkeypatch):
    """The fake unsloth/vllm on sys.meta_path, a 22.5 GiB CUDA GPU, and a clean standby variable."""
    monkeypatch.delenv(STANDBY, raising=False)
    monkeypatch.delenv("UNSLOTH_VLLM_STANDBY_UTIL_OVERRIDE", raising=False)
    monkeypatch.setattr(unsloth_setup, "_prepared", None)  # prepare_environment's memory
    monkeypatch.setattr("pipeline.backends.cuda_available", lambda: True)
    monkeypatch.setattr(gpu_settings, "gpu_total_gib", lambda device=0: GPU_GIB)
    handle = fake_unsloth.install()
    yield fake_unsloth
    handle.uninstall()


def make_cfg(**overrides) -> PipelineConfig:
    base = {"model_name_or_path": "unsloth/Qwen2.5-1.5B-Instruct", "vllm_standby": "true", "lora_r": 16,
            "lora_alpha": 32, "max_lora_rank": 32, "max_seq_length": 768, "seed": 1234,
            "output_dir": "unused"}
    return PipelineConfig().replace(**{**base, **overrides})


def only_call(fake, name):
    calls = fake.calls_named(name)
    assert len(calls) == 1, f"expected one {name}, got {len(calls)}: {calls}"
    return calls[0]


def train_and_save_adapter(fake, cfg, directory: Path):
    """load_for_training + save_adapter through atomic_directory, as pipeline/train.py does."""
    model, tokenizer = backend.load_for_training(cfg)
    with atomic_directory(directory) as staging:
        backend.save_adapter(model, tokenizer, staging)
    return verify_adapter_dir(directory)


# ------------------------------------------------------------------------------------------ loading


def test_load_for_training_builds_a_vllm_backed_lora_model_from_the_config(fake):
    import torch

    cfg = make_cfg(lora_target_modules=["q_proj", "v_proj"], lora_dropout=0.05)
    model, tokenizer = backend.load_for_training(cfg)

    # What came back: a LoRA model with the configured adapter, served by an in-process vLLM engine sized from
    # the config (max_lora_rank) and the GPU (standby tier for 22.5 GiB), in bf16 on a bf16 GPU.
    assert model.is_peft and model.peft_config["default"] == {
        "r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"], "modules_to_save": None}
    engine = model.vllm_engine
    assert (engine.max_lora_rank, engine.gpu_memory_utilization, engine.standby) == (32, 0.825 * 0.95, True)
    assert callable(model.load_lora) and model.fast_generate == engine.generate
    assert model.config.dtype is torch.bfloat16 and tokenizer.name == "unsloth/Qwen2.5-1.5B-Instruct"
    # The trainer must receive the LoRA model, not the base from_pretrained returned.
    peft_call = only_call(fake, "FastLanguageModel.get_peft_model")
    assert model is not peft_call.args[0] and model.base_model is peft_call.args[0]
    # Settings with no effect the double can show (the calls are bound to the real signatures, so a wrong
    # name would already have raised): each reaches its parameter.
    load = only_call(fake, "FastLanguageModel.from_pretrained").kwargs
    assert {k: load[k] for k in ("max_seq_length", "load_in_4bit", "random_state", "trust_remote_code",
                                 "float8_kv_cache", "use_gradient_checkpointing")} == {
        "max_seq_length": 768, "load_in_4bit": True, "random_state": 1234, "trust_remote_code": False,
        "float8_kv_cache": False, "use_gradient_checkpointing": "unsloth"}
    assert {k: peft_call.kwargs[k] for k in ("lora_dropout", "random_state", "use_gradient_checkpointing")} == {
        "lora_dropout": 0.05, "random_state": 1234, "use_gradient_checkpointing": "unsloth"}
    # The ordered log a train-level test can extend: import, load, LoRA (then the trainer).
    assert [c.name for c in fake.record_calls()] == [
        "import unsloth", "FastLanguageModel.from_pretrained", "FastLanguageModel.get_peft_model"]


def test_load_without_standby_dtype_and_checkpointing_options(fake):
    cfg = make_cfg(vllm_standby="false", dtype="float16", gradient_checkpointing=False, load_in_4bit=False,
                   float8_kv_cache=True)
    backend.load_for_training(cfg)
    import torch

    kwargs = only_call(fake, "FastLanguageModel.from_pretrained").kwargs
    assert "unsloth_vllm_standby" not in kwargs
    assert kwargs["gpu_memory_utilization"] == 0.55  # <= 24 GiB without standby
    assert kwargs["dtype"] is torch.float16  # a torch dtype: loader.py only converts float16/bfloat16 strings
    assert kwargs["load_in_4bit"] is False and kwargs["float8_kv_cache"] is True
    assert kwargs["use_gradient_checkpointing"] is False
    assert only_call(fake, "FastLanguageModel.get_peft_model").kwargs["use_gradient_checkpointing"] is False
    assert only_call(fake, "FastLanguageModel.get_peft_model").kwargs["modules_to_save"] is None


def test_modules_to_save_with_vllm_is_refused_before_anything_loads(fake):
    # FastLlamaModel.get_peft_model raises NotImplementedError for this once the model and vLLM are loaded.
    with pytest.raises(ConfigError) as err:
        backend.load_for_training(make_cfg(lora_modules_to_save=["lm_head"]))
    assert err.value.field == "lora_modules_to_save" and "fast_inference: false" in str(err.value)
    assert fake.record_calls() == []


@pytest.mark.parametrize(("overrides", "field"), [
    ({"lora_target_modules": ["q_proj", "embed_tokens"]}, "lora_target_modules"),  # moved, then refused
    ({"lora_target_modules": ["q_proj", "lm_head"]}, "lora_target_modules"),  # kept, never trained
    ({"lora_modules_to_save": ["q_proj"], "fast_inference": False, "vllm_standby": "auto"}, "lora_modules_to_save"),
])
def test_what_get_peft_model_refuses_or_ignores_is_refused_before_anything_loads(fake, overrides, field):
    with pytest.raises(ConfigError) as err:
        backend.load_for_training(make_cfg(**overrides))
    assert err.value.field == field
    assert fake.record_calls() == []


def test_embeddings_as_targets_without_vllm_reach_get_peft_model(fake):
    model, _ = backend.load_for_training(make_cfg(lora_target_modules=["q_proj", "lm_head"], fast_inference=False,
                                                  vllm_standby="auto"))
    assert model.peft_config["default"]["modules_to_save"] == ["lm_head"]  # Unsloth trains it in full


def test_modules_to_save_without_vllm_reaches_get_peft_model(fake):
    backend.load_for_training(make_cfg(lora_modules_to_save=["lm_head"], fast_inference=False, vllm_standby="auto"))
    assert only_call(fake, "FastLanguageModel.get_peft_model").kwargs["modules_to_save"] == ["lm_head"]


def test_peft_config_is_always_none():
    assert backend.peft_config(make_cfg()) is None
    assert backend.peft_config(make_cfg(lora_r=64, max_lora_rank=64)) is None


# ------------------------------------------------------------------------------------------ standby + import


@pytest.mark.parametrize(
    ("setting", "has_cuda", "expected"),
    [("true", False, "1"), ("auto", True, "1"), ("false", True, None), ("auto", False, None)],
)
def test_standby_variable_is_set_before_import_unsloth(fake, monkeypatch, setting, has_cuda, expected):
    monkeypatch.setattr("pipeline.backends.cuda_available", lambda: has_cuda)
    prepared = backend.prepare_environment(make_cfg(vllm_standby=setting))
    assert fake.import_state()["UNSLOTH_VLLM_STANDBY"] == expected
    assert prepared.standby is (expected == "1")


def test_standby_false_overrides_an_exported_variable(fake, monkeypatch):
    monkeypatch.setenv(STANDBY, "1")
    with pytest.warns(UserWarning, match="vllm_standby is false"):
        backend.prepare_environment(make_cfg(vllm_standby="false"))
    assert fake.import_state()["UNSLOTH_VLLM_STANDBY"] == "0"


def test_standby_requested_after_unsloth_was_imported_without_it_is_refused(fake):
    import unsloth  # noqa: F401  (the user imported it first, without the variable)

    with pytest.raises(RuntimeError, match="before UNSLOTH_VLLM_STANDBY=1 was set"):
        backend.prepare_environment(make_cfg(vllm_standby="true"))


def test_prepare_environment_is_idempotent_but_refuses_a_standby_change(fake):
    backend.prepare_environment(make_cfg(vllm_standby="true"))
    backend.prepare_environment(make_cfg(vllm_standby="true"))
    assert len(fake.calls_named("import unsloth")) == 1
    with pytest.raises(RuntimeError, match="fixed at import time"):
        backend.prepare_environment(make_cfg(vllm_standby="false"))


SUBPROCESS_SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    sys.path[:0] = [{root!r}]
    {pre_import}
    import pipeline.backends.unsloth as backend
    cheap = sorted(m for m in ("unsloth", "vllm", "torch", "trl", "transformers", "peft") if m in sys.modules)
    import tests.fake_unsloth as fake
    fake.install()
    from pipeline.config import PipelineConfig
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend.prepare_environment(PipelineConfig().replace(vllm_standby="true"))
    print(json.dumps({{"imported_by_backend_module": cheap, "at_import": fake.import_state(),
                       "warnings": [str(w.message) for w in caught]}}))
    """
)


def run_fresh_interpreter(pre_import: str = "") -> dict:
    """prepare_environment in a new interpreter, so sys.modules starts clean."""
    script = SUBPROCESS_SCRIPT.format(root=str(ROOT), pre_import=pre_import)
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    env.pop(STANDBY, None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fresh_process_imports_unsloth_before_trl_with_standby_set():
    result = run_fresh_interpreter()
    # Importing the backend module is cheap: no unsloth, vllm, torch, trl, transformers or peft.
    assert result["imported_by_backend_module"] == []
    assert result["at_import"] == {"UNSLOTH_VLLM_STANDBY": "1", "already_imported": []}
    assert result["warnings"] == []


def test_trl_imported_first_is_reported_with_the_module_and_the_fix():
    result = run_fresh_interpreter(pre_import="import trl")
    assert result["at_import"]["already_imported"] == ["trl"]
    ours = [w for w in result["warnings"] if w.startswith("Unsloth must be imported before")]
    assert len(ours) == 1 and "trl" in ours[0] and "prepare_environment" in ours[0]


# ------------------------------------------------------------------------------------------ trainer config


def test_grpo_config_kwargs_bf16_gpu(fake):
    model, _ = backend.load_for_training(make_cfg())
    assert backend.grpo_config_kwargs(make_cfg(), model) == {
        "use_vllm": True, "bf16": True, "fp16": False, "vllm_importance_sampling_correction": True}


@pytest.mark.parametrize("value", [True, False])
def test_importance_sampling_correction_is_passed_explicitly_by_both_backends(fake, value, monkeypatch):
    # Unsloth's GRPOConfig defaults it to False and TRL's to True: neither default may decide silently.
    from pipeline.backends import plain

    cfg = make_cfg(vllm_importance_sampling_correction=value, vllm_mode="colocate")
    model, _ = backend.load_for_training(cfg)
    assert backend.grpo_config_kwargs(cfg, model)["vllm_importance_sampling_correction"] is value
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.is_bf16_supported", lambda *a, **k: True)
    assert plain.grpo_config_kwargs(cfg)["vllm_importance_sampling_correction"] is value
    assert PipelineConfig().grpo.vllm_importance_sampling_correction is True  # the one documented default


def test_grpo_config_kwargs_gpu_without_bf16_uses_fp16(fake):
    fake.STATE.bf16_supported = False  # a T4: Unsloth loads dtype=None as float16
    model, _ = backend.load_for_training(make_cfg())
    kwargs = backend.grpo_config_kwargs(make_cfg(), model)
    assert (kwargs["bf16"], kwargs["fp16"]) == (False, True)


def test_grpo_config_kwargs_float32_model_leaves_precision_to_unsloth(fake):
    model, _ = backend.load_for_training(make_cfg(dtype="float32"))
    kwargs = backend.grpo_config_kwargs(make_cfg(dtype="float32"), model)
    assert (kwargs["bf16"], kwargs["fp16"]) == (False, False)


def test_vllm_sampling_params_mapping_reaches_rollouts_and_serialises(fake):
    mapping = {"min_p": 0.1, "top_k": -1, "stop": ["</answer>"], "include_stop_str_in_output": True}
    cfg = make_cfg(vllm_sampling_params=json.dumps(mapping))
    model, _ = backend.load_for_training(cfg)
    params = backend.grpo_config_kwargs(cfg, model)["vllm_sampling_params"]
    # Checked by vLLM's SamplingParams through Unsloth's own helper before training starts.
    assert only_call(fake, "unsloth.vLLMSamplingParams").kwargs == mapping
    # What Unsloth's trainer builds for a rollout (grpo_update_SamplingParams): GRPOConfig's fields, then ours,
    # applied exactly (top_k=-1 as well), except the ones GRPOConfig owns.
    trl_kwargs = {"n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "max_tokens": 64}
    applied = fake.grpo_update_SamplingParams(fake.SamplingParams, trl_kwargs, params)
    assert applied == {**trl_kwargs, **mapping}
    assert json.loads(json.dumps(params)) == mapping


def test_grpo_config_with_sampling_params_serialises_for_tensorboard(fake):
    """TensorBoard/wandb call args.to_json_string() at train start; UnslothGRPOConfig declares
    vllm_sampling_params as a dataclass field, so the value must survive json.dumps(to_dict())."""
    import dataclasses
    from typing import Any, Optional

    import trl

    @dataclasses.dataclass
    class UnslothLikeGRPOConfig(trl.GRPOConfig):  # the field as unsloth/models/rl.py declares it
        vllm_sampling_params: Optional[Any] = dataclasses.field(default=None)

    cfg = make_cfg(vllm_sampling_params={"min_p": 0.1, "stop": ["</answer>"]})
    model, _ = backend.load_for_training(cfg)
    kwargs = backend.grpo_config_kwargs(cfg, model)
    args = UnslothLikeGRPOConfig(output_dir="unused", use_cpu=True, bf16=False, fp16=False, report_to="none",
                                 vllm_sampling_params=kwargs["vllm_sampling_params"])
    written = json.loads(args.to_json_string())
    assert written["vllm_sampling_params"] == {"min_p": 0.1, "stop": ["</answer>"]}


@pytest.mark.parametrize("mapping", [
    {"min_pp": 0.1},  # msgspec: TypeError
    {"top_k": -5},  # SamplingParams._verify_args: VLLMValidationError, which is not a ValueError
    {"min_p": 1.5},
])
def test_vllm_sampling_params_rejected_by_vllm_names_the_field(fake, mapping):
    cfg = make_cfg(vllm_sampling_params=json.dumps(mapping))
    model, _ = backend.load_for_training(cfg)
    with pytest.raises(ConfigError) as err:
        backend.grpo_config_kwargs(cfg, model)
    (bad,) = mapping
    assert err.value.field == "vllm_sampling_params" and bad in str(err.value)


def test_vllm_sampling_params_fields_unsloth_overrides_are_refused(fake):
    cfg = make_cfg(vllm_sampling_params={"seed": 1, "min_p": 0.1})
    model, _ = backend.load_for_training(make_cfg())
    with pytest.raises(ConfigError, match="seed"):
        backend.grpo_config_kwargs(cfg, model)


# ------------------------------------------------------------------------------------------ saving


def test_save_adapter_writes_to_the_absolute_temp_sibling(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = make_cfg()
    model, tokenizer = backend.load_for_training(cfg)
    with atomic_directory("run/lora") as staging:  # relative, as a user would type it
        backend.save_adapter(model, tokenizer, staging)
    (save_call,) = fake.calls_named("model.save_lora")
    saved_to = Path(save_call.args[0])
    assert saved_to.is_absolute()
    assert saved_to.parent == tmp_path / "run" and saved_to.name.startswith(".lora.tmp-")
    assert [Path(c.args[0]) for c in fake.calls_named("tokenizer.save_pretrained")] == [saved_to]
    info = verify_adapter_dir(tmp_path / "run" / "lora")
    assert info.r == 16 and info.base_model_name_or_path == "unsloth/Qwen2.5-1.5B-Instruct"


# ------------------------------------------------------------------------------------------ generation


def test_generator_loads_the_absolute_adapter_once_and_reuses_the_request(fake, tmp_path, monkeypatch):
    cfg = make_cfg()
    train_and_save_adapter(fake, cfg, tmp_path / "run" / "lora")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    adapter = verify_adapter_dir("../run/lora")  # relative, from another working directory
    fake.STATE.calls.clear()

    generator = backend.load_generator("unsloth/Qwen2.5-1.5B-Instruct", adapter, cfg)
    batches = [["What is 1 + 1?"], ["a", "bb"], ["ccc"]]
    results = [generator.generate(p, max_tokens=200, temperature=0.7, top_p=0.9) for p in batches]

    load_kwargs = only_call(fake, "FastLanguageModel.from_pretrained").kwargs
    assert load_kwargs["model_name"] == "unsloth/Qwen2.5-1.5B-Instruct"
    assert load_kwargs["fast_inference"] is True and load_kwargs["max_lora_rank"] == 32
    (load_lora_call,) = fake.calls_named("unsloth_zoo.load_lora")
    assert load_lora_call.args[1] == str(tmp_path / "run" / "lora")
    assert load_lora_call.kwargs == {"load_tensors": False}
    generate_calls = fake.calls_named("model.fast_generate")
    assert [c.args[0] for c in generate_calls] == batches
    requests = [c.kwargs["lora_request"] for c in generate_calls]
    assert requests[0] is not None and all(r is requests[0] for r in requests)
    assert requests[0].lora_path == str(tmp_path / "run" / "lora")
    assert [c.kwargs["sampling_params"].given for c in generate_calls] == [
        {"temperature": 0.7, "top_p": 0.9, "max_tokens": 200}] * 3
    assert results == [[fake.fake_completion(p) for p in batch] for batch in batches]
    assert generator.tokenizer is not None


def test_base_generator_passes_lora_request_none_explicitly(fake):
    generator = backend.load_generator("unsloth/Qwen2.5-1.5B-Instruct", None, make_cfg())
    assert generator.generate(["x", "yy"], max_tokens=8, temperature=0.0, top_p=1.0) == [
        fake.fake_completion("x"), fake.fake_completion("yy")]
    (call,) = fake.calls_named("model.fast_generate")
    assert "lora_request" in call.kwargs and call.kwargs["lora_request"] is None
    assert fake.calls_named("unsloth_zoo.load_lora") == []
    assert call.kwargs["sampling_params"].given == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 8}


def test_adapter_rank_above_max_lora_rank_is_refused_before_any_load(fake, tmp_path):
    adapter = train_and_save_adapter(fake, make_cfg(lora_r=64, max_lora_rank=64), tmp_path / "lora")
    fake.STATE.calls.clear()
    with pytest.raises(ConfigError) as err:
        backend.load_generator("unsloth/Qwen2.5-1.5B-Instruct", adapter, make_cfg(max_lora_rank=32))
    assert err.value.field == "max_lora_rank"
    assert "r=64" in str(err.value) and "max_lora_rank=32" in str(err.value) and "--max_lora_rank 64" in str(err.value)
    assert fake.record_calls() == []


def test_adapter_trained_on_another_base_warns(fake, tmp_path):
    adapter = train_and_save_adapter(fake, make_cfg(), tmp_path / "lora")
    # The 4-bit repo name Unsloth records is the same model; a different size is not.
    backend.load_generator("unsloth/qwen2.5-1.5b-instruct-unsloth-bnb-4bit", adapter, make_cfg())
    with pytest.warns(UserWarning, match="was trained on 'unsloth/Qwen2.5-1.5B-Instruct'"):
        backend.load_generator("Qwen/Qwen2.5-3B-Instruct", adapter, make_cfg())


def test_training_generator_uses_live_weights_and_restores_standby_sleep(fake, tmp_path):
    cfg = make_cfg(output_dir=str(tmp_path / "out"))
    model, tokenizer = backend.load_for_training(cfg)
    model.vllm_engine.sleeping = True  # the trainer leaves the standby engine asleep between rollouts
    generator = backend.training_generator(model, tokenizer, cfg)
    assert generator.generate(["q1"], max_tokens=5) == [fake.fake_completion("q1")]
    assert generator.generate(["q2"], max_tokens=5) == [fake.fake_completion("q2")]

    (load_call,) = fake.calls_named("unsloth_zoo.load_lora")
    assert load_call.kwargs == {"load_tensors": True}
    assert load_call.args[1] == str(tmp_path / "out" / backend.LIVE_LORA_SUBDIR)
    names = [c.name for c in fake.record_calls() if c.name.startswith(("vllm.LLM", "model.fast_generate"))]
    assert names == ["vllm.LLM.wake_up", "model.fast_generate", "vllm.LLM.sleep"] * 2
    assert model.vllm_engine.sleeping is True
    requests = [c.kwargs["lora_request"] for c in fake.calls_named("model.fast_generate")]
    assert requests[0] is requests[1] and requests[0].live


# ------------------------------------------------------------------------------------------ gpu memory


@pytest.mark.parametrize(
    ("total_gib", "standby", "expected"),
    [
        (79.2, True, 0.925 * 0.95), (40.0, True, 0.925 * 0.95), (31.4, True, 0.9 * 0.95),
        (22.5, True, 0.825 * 0.95), (14.7, True, 0.8 * 0.95), (11.0, True, 0.775 * 0.95), (7.6, True, 0.75 * 0.95),
        (14.7, False, 0.5), (16.0, False, 0.5), (22.5, False, 0.55), (24.0, False, 0.55), (39.4, False, 0.6),
        (48.0, False, 0.6), (79.2, False, 0.7),
    ],
)
def test_auto_gpu_memory_utilization_table(total_gib, standby, expected):
    assert backend.choose_gpu_memory_utilization(total_gib, standby) == expected
    cfg = make_cfg(gpu_memory_utilization="auto")
    assert backend.resolve_gpu_memory_utilization(cfg, total_gib=total_gib, standby=standby) == expected


@pytest.mark.parametrize("value", ["abc", "0", "-0.2", "1.5", "nan", ""])
def test_invalid_gpu_memory_utilization_names_the_field(value):
    with pytest.raises(ConfigError) as err:
        backend.resolve_gpu_memory_utilization(make_cfg(gpu_memory_utilization=value), total_gib=24.0, standby=False)
    assert err.value.field == "gpu_memory_utilization"


def test_explicit_gpu_memory_utilization(monkeypatch):
    monkeypatch.delenv("UNSLOTH_VLLM_STANDBY_UTIL_OVERRIDE", raising=False)
    cfg = make_cfg(gpu_memory_utilization="1")
    assert backend.resolve_gpu_memory_utilization(cfg, total_gib=24.0, standby=False) == 1.0
    with pytest.warns(UserWarning, match="replaced by Unsloth's standby tier"):
        assert backend.resolve_gpu_memory_utilization(make_cfg(gpu_memory_utilization="0.6"), 24.0, True) == 0.6


# ------------------------------------------------------------------------------------------ export


@pytest.mark.parametrize(
    ("method", "save_method", "load_in_4bit"),
    [("merged16", "merged_16bit", False), ("merged4", "merged_4bit_forced", True)],
)
def test_export_merged(fake, tmp_path, method, save_method, load_in_4bit):
    cfg = make_cfg(load_in_4bit=False)
    adapter = train_and_save_adapter(fake, cfg, tmp_path / "lora")
    fake.STATE.calls.clear()
    with atomic_directory(tmp_path / "export") as staging:
        backend.export(adapter, "unsloth/Qwen2.5-1.5B-Instruct", method, staging, cfg)
    load_kwargs = only_call(fake, "FastLanguageModel.from_pretrained").kwargs
    assert load_kwargs["model_name"] == str(tmp_path / "lora")  # base + adapter via adapter_config.json
    assert load_kwargs["fast_inference"] is False and load_kwargs["load_in_4bit"] is load_in_4bit
    assert "gpu_memory_utilization" not in load_kwargs and "unsloth_vllm_standby" not in load_kwargs
    call = only_call(fake, "model.save_pretrained_merged")
    assert call.args[0] == str(staging) and call.args[1].name == "unsloth/Qwen2.5-1.5B-Instruct"
    assert call.kwargs == {"save_method": save_method}
    assert (tmp_path / "export" / "config.json").is_file()


def test_export_gguf_keeps_every_file_inside_out_dir(fake, tmp_path):
    cfg = make_cfg()
    adapter = train_and_save_adapter(fake, cfg, tmp_path / "lora")
    with atomic_directory(tmp_path / "export") as staging:
        backend.export(adapter, "unsloth/Qwen2.5-1.5B-Instruct", "gguf", staging, cfg, gguf_quantization="Q8_0")
    call = only_call(fake, "model.save_pretrained_gguf")
    assert call.args[0] == str(staging / backend.GGUF_MERGED_SUBDIR)
    assert call.kwargs == {"quantization_method": "q8_0"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "lora"]  # nothing leaked beside out_dir
    assert (tmp_path / "export" / "merged_gguf" / "model.Q8_0.gguf").is_file()


def test_export_unknown_method_names_the_option(fake, tmp_path):
    adapter = train_and_save_adapter(fake, make_cfg(), tmp_path / "lora")
    with pytest.raises(ConfigError) as err:
        backend.export(adapter, "unsloth/Qwen2.5-1.5B-Instruct", "merged_4bit", tmp_path / "x", make_cfg())
    assert err.value.field == "to" and "merged16" in str(err.value)


# ------------------------------------------------------------------------------------------ the double itself
# The fake is only worth something if it is as strict as the real packages: these pin that it is bound to
# the snapshot read from the pinned wheels, and that it raises where they raise.


def test_signature_snapshot_was_made_from_the_pinned_versions():
    from env.matrix import load_matrix

    matrix = load_matrix()
    pins = {pin.name.replace("-", "_"): pin.version
            for set_name in ("plain", "gpu") for pin in matrix.packages(set_name).values()}
    snapshot = fake_unsloth.SNAPSHOT["versions"]
    assert set(snapshot) == {"unsloth", "unsloth_zoo", "vllm", "trl", "transformers"}
    assert snapshot == {name: pins[name] for name in snapshot}, (
        "env/upstream_signatures.json is stale: run `python env/upstream_signatures.py` after changing a pin")


def test_every_boundary_callable_is_in_the_snapshot():
    names = set(fake_unsloth.SNAPSHOT["callables"])
    for required in ("FastLanguageModel.from_pretrained", "FastLanguageModel.get_peft_model",
                     "FastLanguageModel.for_inference", "model.fast_generate[fast_inference=True]",
                     "model.fast_generate[fast_inference=False]", "model.load_lora",
                     "model.save_lora[fast_inference=True]", "model.save_lora[fast_inference=False]",
                     "model.save_pretrained_merged", "model.save_pretrained_gguf", "LLM.sleep", "LLM.wake_up"):
        assert required in names, required
    assert {"max_tokens", "min_p", "top_k", "stop"} <= set(fake_unsloth.SAMPLING_FIELDS)
    assert {"vllm_sampling_params", "unsloth_num_chunks", "use_vllm", "beta", "report_to"} <= \
        fake_unsloth.GRPO_CONFIG_FIELDS


@pytest.mark.parametrize(("call", "match"), [
    (lambda f: f.FastLanguageModel.from_pretrained(model_name="m", fast_inferense=True), "fast_inferense"),
    (lambda f: f.FastLanguageModel.from_pretrained("m", max_lora_ranks=8), "max_lora_ranks"),
    (lambda f: f.FastLanguageModel.get_peft_model(r=8), "model"),  # the model is required
    (lambda f: f.FastLanguageModel.get_peft_model(object(), lora_modules_to_save=["lm_head"]), "lora_modules_to_save"),
    (lambda f: f.SamplingParams(min_pp=0.1), "min_pp"),
    (lambda f: f.UnslothGRPOConfig(output_dir="x", vllm_sampling_param=None), "vllm_sampling_param"),
])
def test_the_double_refuses_keywords_the_real_api_does_not_have(fake, call, match):
    with pytest.raises(TypeError, match=match):
        call(fake)


def test_the_double_raises_where_unsloth_and_vllm_raise(fake, tmp_path):
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained("m", fast_inference=True)
    # FastLlamaModel.get_peft_model: any modules_to_save (even []) or a bias with a vLLM engine
    for extra in ({"modules_to_save": ["lm_head"]}, {"modules_to_save": []}, {"bias": "all"},
                  {"target_modules": ["q_proj", "embed_tokens"]}):
        with pytest.raises(NotImplementedError, match="fast inference does not work"):
            FastLanguageModel.get_peft_model(model, **extra)
    # ... but lm_head stays a LoRA target that never trains (_vllm_unmovable_embedding_modules)
    dead = FastLanguageModel.get_peft_model(model, target_modules=["q_proj", "lm_head"])
    assert dead.peft_config["default"]["target_modules"] == ["q_proj", "lm_head"]
    with pytest.raises(TypeError, match="not allowed"):
        FastLanguageModel.get_peft_model(model, modules_to_save=["q_proj"])
    lora = FastLanguageModel.get_peft_model(model)
    # vLLM's LLMEngine.sleep compares `level >= 1`: a level read from the environment must be an int
    with pytest.raises(TypeError):
        lora.vllm_engine.sleep("1")
    with pytest.raises(TypeError):
        lora.vllm_engine.sleep(levle=1)
    lora.vllm_engine.sleep(1)
    with pytest.raises(RuntimeError, match="sleeping"):
        lora.fast_generate(["x"])
    with pytest.raises(RuntimeError, match="merged_4bit_forced"):
        lora.save_pretrained_merged(str(tmp_path / "m4"), tokenizer, save_method="merged_4bit")
    with pytest.raises(ValueError, match="tokenizer"):
        lora.save_pretrained_gguf(str(tmp_path / "g"))
    with pytest.raises(NotImplementedError, match="trust_remote_code"):
        FastLanguageModel.from_pretrained("m", fast_inference=True, trust_remote_code=True)
    with pytest.raises(RuntimeError, match="UNSLOTH_VLLM_STANDBY"):
        FastLanguageModel.from_pretrained("m", fast_inference=True, unsloth_vllm_standby=True)


def test_the_double_without_vllm_refuses_fast_inference(monkeypatch):
    handle = fake_unsloth.install(vllm_installed=False)
    try:
        from unsloth import FastLanguageModel

        with pytest.raises(ImportError, match="install vLLM"):
            FastLanguageModel.from_pretrained("m", fast_inference=True)
        with pytest.raises(ImportError):
            import vllm  # noqa: F401
        model, _ = FastLanguageModel.from_pretrained("m", fast_inference=False)
        assert not hasattr(model, "vllm_engine")
    finally:
        handle.uninstall()


def test_the_double_with_fast_inference_false_is_unsloth_without_vllm(fake, tmp_path):
    """What Unsloth does with fast_inference=False: no engine, no load_lora; fast_generate is HF generate
    (vLLM arguments raise), modules_to_save is allowed, save_lora is save_pretrained over the adapter."""
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained("m", fast_inference=False)
    assert not hasattr(model, "vllm_engine")
    lora = FastLanguageModel.get_peft_model(model, modules_to_save=["lm_head"])
    assert not hasattr(lora, "vllm_engine") and not hasattr(lora, "load_lora")
    with pytest.raises(ValueError, match="sampling_params"):
        lora.fast_generate([[1, 2]], sampling_params=fake.SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="lora_request"):
        lora.fast_generate(input_ids=[[1, 2]], lora_request=None)
    with pytest.raises(ValueError, match="vLLM-style prompts"):
        lora.fast_generate(["What is 1 + 1?"])
    import torch

    out = lora.fast_generate(input_ids=torch.tensor([[1, 2]]), max_new_tokens=4)
    assert out.tolist() == [[1, 2] + [fake.fake_generated_token(2, with_adapter=True)] * 2]
    lora.save_lora(str(tmp_path / "adapter"))
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["modules_to_save"] == ["lm_head"] and saved["r"] == 16
    assert FastLanguageModel.for_inference(lora) is lora and lora.training is False


def test_grpo_config_with_sampling_params_cannot_be_serialised(fake):
    """transformers' to_json_string (called by TensorBoardCallback.on_train_begin) json-dumps every field."""
    params = fake.vLLMSamplingParams(min_p=0.1)
    config = fake.UnslothGRPOConfig(output_dir="x", vllm_sampling_params=params, report_to=["tensorboard"])
    with pytest.raises(TypeError, match="not JSON serializable"):
        config.to_json_string()
    assert json.loads(fake.UnslothGRPOConfig(output_dir="x").to_json_string())["output_dir"] == "x"
    # Unsloth's GRPO default, not TRL's: the two backends differ unless it is passed explicitly
    assert fake.UnslothGRPOConfig(output_dir="x").vllm_importance_sampling_correction is False


def test_the_double_checks_trainer_precision_against_the_model_dtype(fake):
    """Unsloth's generated trainers raise when bf16/fp16 disagree with the model's dtype (the SFT warm-up too)."""
    import torch
    from unsloth import FastLanguageModel

    fp16_model, _ = FastLanguageModel.from_pretrained("m", dtype=torch.float16)
    with pytest.raises(TypeError, match="Model is in float16 precision but you want to use bfloat16"):
        fake.check_trainer_precision(fp16_model, fake.UnslothSFTConfig(output_dir="x", bf16=True))
    fake.check_trainer_precision(fp16_model, fake.UnslothSFTConfig(output_dir="x", fp16=True))
    bf16_model, _ = FastLanguageModel.from_pretrained("m")  # dtype=None on a bf16 GPU
    with pytest.raises(TypeError, match="bfloat16 precision but you want to use float16"):
        fake.check_trainer_precision(bf16_model, fake.UnslothGRPOConfig(output_dir="x", fp16=True))
    with pytest.raises(TypeError, match="num_generations"):  # a GRPO field is not an SFT one
        fake.UnslothSFTConfig(output_dir="x", num_generations=4)
    assert fake.UnslothSFTConfig(output_dir="x").report_to == "none"  # Unsloth's default, not TRL's


# ------------------------------------------------------------------------------------------ VLLM_SLEEP_MODE


def test_eval_puts_a_standby_engine_back_to_sleep_with_an_int_level(fake, tmp_path):
    cfg = make_cfg(output_dir=str(tmp_path / "out"))
    model, tokenizer = backend.load_for_training(cfg)
    model.vllm_engine.sleeping = True  # as the trainer leaves it between rollouts
    generator = backend.training_generator(model, tokenizer, cfg)
    assert generator.generate(["q1"], max_tokens=5) == [fake.fake_completion("q1")]
    assert [c.args for c in fake.calls_named("vllm.LLM.sleep")] == [(1,)]  # the double raises for a str
    assert model.vllm_engine.sleeping


@pytest.mark.parametrize("raw", ["1", "2", "deep"])
def test_vllm_sleep_mode_with_standby_is_refused_before_unsloth_is_imported(fake, monkeypatch, raw):
    """Unsloth's trainer patch would hand the variable to vLLM's sleep() as a str; TRL 1.15 ignores it."""
    monkeypatch.setenv("VLLM_SLEEP_MODE", raw)
    with pytest.raises(ConfigError) as err:
        backend.load_for_training(make_cfg())
    assert err.value.field == "VLLM_SLEEP_MODE" and "unset VLLM_SLEEP_MODE" in str(err.value)
    assert fake.record_calls() == []


def test_vllm_sleep_mode_without_standby_is_irrelevant(fake, monkeypatch):
    monkeypatch.setenv("VLLM_SLEEP_MODE", "2")
    model, _ = backend.load_for_training(make_cfg(vllm_standby="false"))
    assert not model.vllm_engine.standby


# ------------------------------------------------------------------------------------------ SFT warm-up precision


@pytest.mark.parametrize(("dtype", "expected"), [("float16", (False, True)), ("bfloat16", (True, False)),
                                                 ("float32", (False, False)), ("auto", (True, False))])
def test_warmup_precision_follows_the_model_not_the_gpu(fake, monkeypatch, tmp_path, dtype, expected):
    """dtype: float16 on an Ampere-or-newer card: Unsloth's SFTTrainer raises "Model is in float16 precision but
    you want to use bfloat16" if the warm-up takes bf16 from the GPU. The double's UnslothSFTConfig (only the
    fields Unsloth's generated class has) and its trainers' precision check stand in for Unsloth's."""
    import datasets
    import torch
    import trl

    from pipeline.trainer import warmup

    made = {}

    class PrecisionCheckingSFTTrainer:  # UnslothSFTTrainer.__init__: the mixed-precision check, then train()
        def __init__(self, model, args, **kwargs):
            fake.check_trainer_precision(model, args)
            self.model, made["args"] = model, args

        def remove_callback(self, callback):
            pass

        def train(self):
            pass

    monkeypatch.setattr(trl, "SFTConfig", fake.UnslothSFTConfig)
    monkeypatch.setattr(trl, "SFTTrainer", PrecisionCheckingSFTTrainer)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # an Ampere-or-newer GPU
    cfg = make_cfg(dtype=dtype, dataset_name="demo-arithmetic", sft_warmup_steps=2)
    model, tokenizer = backend.load_for_training(cfg)
    prepared = type("Prepared", (), {"dataset": datasets.Dataset.from_list([{"prompt": "p"}]), "fingerprint": "test"})()
    assert warmup.run_format_warmup(model, tokenizer, cfg, prepared, None, tmp_path) is model
    assert (made["args"].bf16, made["args"].fp16) == expected


# ------------------------------------------------------------------------------------------ fast_inference: false


def no_vllm_cfg(**overrides):
    return make_cfg(fast_inference=False, vllm_standby="auto", **overrides)


@pytest.fixture
def real_tokenizer(fake, monkeypatch):
    """Unsloth returns the model's real tokenizer; the fake's is a stub, so hand back the tiny demo's."""
    from pipeline.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("tiny-demo")
    original = fake.FastLanguageModel.from_pretrained

    def from_pretrained(*args, **kwargs):
        return original(*args, **kwargs)[0], tokenizer

    monkeypatch.setattr(fake.FastLanguageModel, "from_pretrained", staticmethod(from_pretrained))
    return tokenizer


def expected_texts(tokenizer, prompts, max_tokens, with_adapter):
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    return [tokenizer.decode([fake_unsloth.fake_generated_token(n, with_adapter)] * min(max_tokens, 2),
                             skip_special_tokens=True) for n in lengths]


def test_no_vllm_loads_without_vllm_options_and_trains_without_vllm_fields(fake, monkeypatch):
    monkeypatch.setenv(STANDBY, "1")  # an exported standby must not leak into a run without vLLM
    with pytest.warns(UserWarning, match="fast_inference: false runs without vLLM"):
        model, _ = backend.load_for_training(no_vllm_cfg())
    assert os.environ[STANDBY] == "0"
    kwargs = only_call(fake, "FastLanguageModel.from_pretrained").kwargs
    assert kwargs["fast_inference"] is False
    assert not {"max_lora_rank", "gpu_memory_utilization", "float8_kv_cache", "unsloth_vllm_standby"} & set(kwargs)
    assert not hasattr(model, "vllm_engine") and not hasattr(model, "load_lora") and hasattr(model, "save_lora")
    assert backend.grpo_config_kwargs(no_vllm_cfg(), model) == {"use_vllm": False, "bf16": True, "fp16": False}


def test_no_vllm_training_generator_uses_unsloths_inference_path(fake, real_tokenizer, tmp_path):
    cfg = no_vllm_cfg(output_dir=str(tmp_path / "out"))
    model, tokenizer = backend.load_for_training(cfg)
    prompts = ["What is 1 + 1?", "a much longer question about apples and pears"]
    texts = backend.training_generator(model, tokenizer, cfg).generate(prompts, max_tokens=8)
    assert texts == expected_texts(tokenizer, prompts, 8, with_adapter=True)
    names = [c.name for c in fake.record_calls()][-3:]
    assert names == ["FastLanguageModel.for_inference", "model.generate", "FastLanguageModel.for_training"]
    (gen,) = fake.calls_named("model.generate")
    assert gen.kwargs["for_inference"] is True and gen.kwargs["do_sample"] is False
    assert gen.kwargs["max_new_tokens"] == 8
    assert model.training is True  # handed back to the trainer in training mode
    assert fake.calls_named("unsloth_zoo.load_lora") == [] and not (tmp_path / "out").exists()


def test_no_vllm_generate_with_the_saved_adapter(fake, real_tokenizer, tmp_path):
    adapter = train_and_save_adapter(fake, no_vllm_cfg(), tmp_path / "run" / "lora")
    fake.STATE.calls.clear()
    generator = backend.load_generator("unsloth/Qwen2.5-1.5B-Instruct", adapter, no_vllm_cfg())
    texts = generator.generate(["2 + 2?"], max_tokens=4, temperature=0.7, top_p=0.9)
    assert texts == expected_texts(real_tokenizer, ["2 + 2?"], 4, with_adapter=True)
    load = only_call(fake, "FastLanguageModel.from_pretrained").kwargs
    # Unsloth's documented way: from_pretrained on the adapter folder loads its base and applies the LoRA.
    assert load["model_name"] == str(tmp_path / "run" / "lora") and load["fast_inference"] is False
    gen = only_call(fake, "model.generate").kwargs
    assert gen["for_inference"] is True and (gen["do_sample"], gen["temperature"], gen["top_p"]) == (True, 0.7, 0.9)
    assert fake.calls_named("FastLanguageModel.for_training") == []
    # --base is the only way to get the base model, and it is visibly different.
    base = backend.load_generator("unsloth/Qwen2.5-1.5B-Instruct", None, no_vllm_cfg())
    assert base.generate(["2 + 2?"], max_tokens=4) == expected_texts(real_tokenizer, ["2 + 2?"], 4, False) != texts


def test_no_vllm_never_falls_back_to_the_base_model(fake, real_tokenizer, tmp_path, monkeypatch):
    adapter = train_and_save_adapter(fake, no_vllm_cfg(), tmp_path / "lora")
    original = fake.FastLanguageModel.from_pretrained

    def loses_the_adapter(*args, **kwargs):
        model, tokenizer = original(*args, **kwargs)
        return getattr(model, "base_model", model), tokenizer

    monkeypatch.setattr(fake.FastLanguageModel, "from_pretrained", staticmethod(loses_the_adapter))
    with pytest.raises(RuntimeError, match="without its LoRA adapter"):
        backend.load_generator("unsloth/Qwen2.5-1.5B-Instruct", adapter, no_vllm_cfg())
