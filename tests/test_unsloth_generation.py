"""GPU-boundary contract tests, output side: saving adapters, generating with vLLM or Unsloth's inference path,
exporting merged/GGUF models (see tests/test_unsloth_backend.py for what the fake is)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tests.fake_unsloth as fake_unsloth
from grpo_pipeline.env.adapters import verify_adapter_dir
from grpo_pipeline.env.paths import atomic_directory
from grpo_pipeline.pipeline.backends import unsloth as backend
from grpo_pipeline.pipeline.config import ConfigError
from tests.unsloth_helpers import IMPORT_ORDER_WARNINGS, STANDBY, make_cfg, only_call, train_and_save_adapter
from tests.unsloth_helpers import fake  # noqa: F401 (a fixture the tests take)

pytestmark = IMPORT_ORDER_WARNINGS


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


def test_token_id_prompts_go_to_vllm_as_tokens_prompts_and_the_generated_ids_come_back(fake):
    """The tool loop (pipeline/infer/tool_loop.py) prompts with token ids and parses the ids it gets back."""
    generator = backend.load_generator("unsloth/Qwen2.5-1.5B-Instruct", None, make_cfg())
    (done,) = generator.generate([[5, 6, 7]], max_tokens=8)
    (call,) = fake.calls_named("model.fast_generate")
    assert call.args[0] == [{"prompt_token_ids": [5, 6, 7]}]
    assert done.ids == (*fake.fake_completion({"prompt_token_ids": [5, 6, 7]}).encode(), 0) and done.tokens == len(
        done.ids)


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
        backend.export(adapter, "unsloth/Qwen2.5-1.5B-Instruct", "gguf", staging, cfg,
                       gguf_quantization="Q8_0")
    call = only_call(fake, "model.save_pretrained_gguf")
    assert call.args[0] == str(staging / backend.GGUF_MERGED_SUBDIR)
    assert call.kwargs == {"quantization_method": "q8_0"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "lora"]  # nothing leaked beside out_dir
    assert (tmp_path / "export" / "merged_gguf" / "model.Q8_0.gguf").is_file()


@pytest.mark.parametrize("method", ["gguf", "merged16", "merged4"])
def test_every_export_format_saves_a_chat_template_defaulting_to_the_trained_system_prompt(fake, tmp_path, method):
    """Put on the tokenizer BEFORE Unsloth saves: a GGUF's metadata is converted from the folder
    save_pretrained_gguf writes, so a template rewritten afterwards (as before) never reached the .gguf."""
    cfg = make_cfg(load_in_4bit=False)
    adapter = train_and_save_adapter(fake, cfg, tmp_path / "lora")
    fake.STATE.calls.clear()
    with atomic_directory(tmp_path / "export") as staging:
        backend.export(adapter, "unsloth/Qwen2.5-1.5B-Instruct", method, staging, cfg,
                       system_prompt="Answer in <answer> tags.")
    name = "model.save_pretrained_gguf" if method == "gguf" else "model.save_pretrained_merged"
    template = only_call(fake, name).args[1].chat_template
    assert '"Answer in <answer> tags."' in template and template.endswith("{{ fake }}")


def test_export_unknown_method_names_the_option(fake, tmp_path):
    adapter = train_and_save_adapter(fake, make_cfg(), tmp_path / "lora")
    with pytest.raises(ConfigError) as err:
        backend.export(adapter, "unsloth/Qwen2.5-1.5B-Instruct", "merged_4bit", tmp_path / "x",
                       make_cfg())
    assert err.value.field == "to" and "merged16" in str(err.value)

# ------------------------------------------------------------------------------------------ fast_inference: false


def no_vllm_cfg(**overrides):
    return make_cfg(fast_inference=False, vllm_standby="auto", **overrides)


@pytest.fixture
def real_tokenizer(fake, monkeypatch):
    """Unsloth returns the model's real tokenizer; the fake's is a stub, so hand back the tiny demo's."""
    from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer

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
    assert backend.grpo_config_kwargs(no_vllm_cfg(), model) == {"use_vllm": False, "bf16": True,
                                                                                 "fp16": False}


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


# ------------------------------------------------------------------ Unsloth turned vLLM off by itself


def test_when_unsloth_returns_no_vllm_engine_the_model_decides_use_vllm_and_the_generators(
        fake, real_tokenizer, tmp_path):
    """fast_inference: true, but Unsloth switched vLLM off (compute capability < 7, DGX Spark, vllm not
    importable): everything follows the model it returned, never the config, and the console says so."""
    fake.STATE.vllm_usable = False
    cfg = make_cfg(output_dir=str(tmp_path / "run"))
    model, tokenizer = backend.load_for_training(cfg)
    assert not hasattr(model, "vllm_engine")
    with pytest.warns(UserWarning, match="without a vLLM engine"):
        kwargs = backend.grpo_config_kwargs(cfg, model)
    assert kwargs["use_vllm"] is False and not [key for key in kwargs if key.startswith("vllm")]
    prompts = ["What is 1 + 1?"]
    assert backend.training_generator(model, tokenizer, cfg).generate(prompts,
                                                                                      max_tokens=4) == expected_texts(
        tokenizer, prompts, 4, with_adapter=True)
    with atomic_directory(tmp_path / "run" / "lora") as staging:
        backend.save_adapter(model, tokenizer, staging)
    adapter = verify_adapter_dir(tmp_path / "run" / "lora")
    fake.STATE.calls.clear()
    with pytest.warns(UserWarning, match="without a vLLM engine"):
        generator = backend.load_generator("unsloth/Qwen2.5-1.5B-Instruct", adapter, cfg)
    assert generator.generate(prompts, max_tokens=4) == expected_texts(real_tokenizer, prompts, 4, with_adapter=True)
    loads = [c.kwargs for c in fake.calls_named("FastLanguageModel.from_pretrained")]
    assert [(k["model_name"], k["fast_inference"]) for k in loads] == [
        ("unsloth/Qwen2.5-1.5B-Instruct", True), (str(tmp_path / "run" / "lora"), False)]
    assert fake.calls_named("unsloth_zoo.load_lora") == [] and fake.calls_named("model.fast_generate") == []
