"""The fake GPU boundary (tests/fake_unsloth.py) itself: bound to the pinned wheels' snapshot, and raising
where unsloth and vLLM raise (see tests/test_unsloth_backend.py for how the contract tests use it)."""

from __future__ import annotations

import json

import pytest

import tests.fake_unsloth as fake_unsloth
from tests.unsloth_helpers import IMPORT_ORDER_WARNINGS
from tests.unsloth_helpers import fake  # noqa: F401 (a fixture the tests take)

pytestmark = IMPORT_ORDER_WARNINGS


# ------------------------------------------------------------------------------------------ the double itself
# The fake is only worth something if it is as strict as the real packages: these pin that it is bound to
# the snapshot read from the pinned wheels, and that it raises where they raise.


def test_signature_snapshot_was_made_from_the_pinned_versions():
    from grpo_pipeline.env.matrix import load_matrix

    matrix = load_matrix()
    pins = {pin.name.replace("-", "_"): pin.exact
            for set_name in ("plain", "gpu") for pin in matrix.packages(set_name).values()}
    snapshot = fake_unsloth.SNAPSHOT["versions"]
    assert set(snapshot) == {"unsloth", "unsloth_zoo", "vllm", "trl", "transformers"}
    assert snapshot == {name: pins[name] for name in snapshot}, (
        "tests/upstream_signatures.json is stale: run `python tests/upstream_signatures.py` after changing a pin")


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
