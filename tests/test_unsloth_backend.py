"""Contract tests for the GPU boundary: pipeline/backends/unsloth.py against a recording fake.

The fake (tests/fake_unsloth.py) stands in for the pinned unsloth, unsloth_zoo and vLLM; every call binds
to the signatures tests/upstream_signatures.py read from those wheels (tests/upstream_signatures.json), and it
raises where they raise. These tests check OUR side: the calls and arguments we make, their order, and what
we do with the results. They do not show that Unsloth or vLLM work; that needs a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from grpo_pipeline.pipeline.backends import unsloth as backend
from grpo_pipeline.pipeline.config import ConfigError
from tests.unsloth_helpers import IMPORT_ORDER_WARNINGS, ROOT, STANDBY, make_cfg, only_call
from tests.unsloth_helpers import fake  # noqa: F401 (a fixture the tests take)

pytestmark = IMPORT_ORDER_WARNINGS


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
    model, _ = backend.load_for_training(make_cfg(lora_target_modules=["q_proj", "lm_head"],
                                                  fast_inference=False, vllm_standby="auto"))
    assert model.peft_config["default"]["modules_to_save"] == ["lm_head"]  # Unsloth trains it in full


def test_modules_to_save_without_vllm_reaches_get_peft_model(fake):
    backend.load_for_training(make_cfg(lora_modules_to_save=["lm_head"], fast_inference=False,
                                       vllm_standby="auto"))
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
    monkeypatch.setattr("grpo_pipeline.pipeline.backends.cuda_available", lambda: has_cuda)
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
    import grpo_pipeline.pipeline.backends.unsloth as backend
    cheap = sorted(m for m in ("unsloth", "vllm", "torch", "trl", "transformers", "peft") if m in sys.modules)
    import tests.fake_unsloth as fake
    fake.install()
    from grpo_pipeline.pipeline.config import PipelineConfig
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
