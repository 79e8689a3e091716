"""The strict vLLM double (tests/fake_vllm.py, which the Unsloth tests run against) held to the real engine on every
call both support, so that it cannot drift: vLLM's CPU build of the pinned release runs here.

One engine, built with the arguments unsloth_zoo 2026.10.9's `load_vllm` passes for a 16-bit LoRA training model
(unsloth_zoo/vllm_utils.py `engine_args = dict(...)`, after its own filter by `EngineArgs`' signature); then:
SamplingParams with the fields our code passes and their range checks, LoRARequest by position, `generate` with a
TokensPrompt and `prompt_logprobs` (the rollout probe's `score_with_vllm`), a LoRARequest naming a saved adapter.

What the double covers and the CPU build cannot run: sleep / wake_up (vLLM's sleep mode needs CUDA's memory pool:
`current_platform.is_sleep_mode_available()` is False here) and unsloth_zoo's in-memory LoRARequest
(`lora_tensors`, its own request class and worker manager, imported with Unsloth, which needs a GPU).
"""

from __future__ import annotations

import inspect
import math

import pytest

import tests.fake_vllm as fake
from tests.fake_signatures import LORA_REQUEST_FIELDS
from tests.vllm_helpers import REAL_VLLM

pytestmark = REAL_VLLM

MAX_LORA_RANK = 16


def unsloth_zoo_engine_args(model: str) -> dict:
    """unsloth_zoo.vllm_utils.load_vllm's engine_args for a bf16 LoRA training model (no bitsandbytes, no fp8 KV
    cache, no standby), with the values it computes for a small GPU, filtered as it filters them."""
    import torch
    from vllm import EngineArgs

    args = dict(model=model, gpu_memory_utilization=0.5, max_model_len=256, quantization=None, load_format="auto",
                kv_cache_dtype="auto", dtype=torch.bfloat16, max_num_batched_tokens=2048, max_num_seqs=16,
                max_logprobs=0 + 1, logprobs_mode="processed_logprobs", seed=3407, enable_lora=True,
                max_lora_rank=MAX_LORA_RANK, max_loras=1, disable_log_stats=True, enable_prefix_caching=True,
                enable_chunked_prefill=True, compilation_config=0, enforce_eager=True, swap_space=4, device="auto",
                enable_sleep_mode=False)
    accepted = inspect.signature(EngineArgs).parameters
    return {key: value for key, value in args.items() if key in accepted}


@pytest.fixture(scope="module")
def engine():
    import os

    from vllm import LLM

    from grpo_pipeline.pipeline.demo.registry import builtin_model

    # In-process, as Unsloth's colocated engine (a spawned engine core would re-import pytest's __main__)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return LLM(**unsloth_zoo_engine_args(str(builtin_model("tiny-demo-vllm").folder())))


def test_the_loaders_engine_arguments_build_a_real_engine(engine):
    dropped = {"swap_space", "device"}  # unsloth_zoo prints "not supported in vLLM. Skipping." for these on 0.31
    from grpo_pipeline.pipeline.demo.registry import builtin_model

    kept = unsloth_zoo_engine_args(str(builtin_model("tiny-demo-vllm").folder()))
    assert dropped.isdisjoint(kept) and {"enable_lora", "max_lora_rank", "logprobs_mode", "enable_sleep_mode"} <= set(kept)
    assert engine.llm_engine.vllm_config.lora_config.max_lora_rank == MAX_LORA_RANK


# What our code hands SamplingParams (pipeline/backends/unsloth_infer.py, score_with_vllm, vllm_engine.py).
SAMPLING = [dict(temperature=0.0, top_p=1.0, max_tokens=8), dict(temperature=0.7, top_p=0.9, max_tokens=8, top_k=20,
                                                                 min_p=0.1),
            dict(max_tokens=1, temperature=1.0, prompt_logprobs=1)]
BAD_SAMPLING = [dict(temperature=-0.5), dict(temperature=float("nan")), dict(top_p=0.0), dict(top_p=1.5),
                dict(top_k=-2), dict(min_p=1.5), dict(max_tokens=0), dict(prompt_logprobs=-2),
                dict(repetition_penalty=0.0), dict(min_pp=0.1)]


@pytest.mark.parametrize("given", SAMPLING)
def test_sampling_params_keep_every_field_as_the_real_class_does(given):
    from vllm import SamplingParams

    real, double = SamplingParams(**given), fake.SamplingParams(**given)
    differ = {name: (getattr(double, name), getattr(real, name)) for name in fake.SAMPLING_FIELDS
              if hasattr(real, name) and not callable(getattr(real, name))
              and getattr(double, name) != getattr(getattr(real, name), "name", getattr(real, name))}
    assert differ == {}


@pytest.mark.parametrize("given", BAD_SAMPLING, ids=lambda g: ",".join(f"{k}={v}" for k, v in g.items()))
def test_sampling_params_refuse_what_the_real_class_refuses(given):
    from vllm import SamplingParams

    with pytest.raises(Exception) as real:
        SamplingParams(**given)
    with pytest.raises(Exception) as double:
        fake.SamplingParams(**given)
    assert type(double.value).__name__ == type(real.value).__name__
    assert isinstance(double.value, TypeError) == isinstance(real.value, TypeError)


def test_lora_request_takes_its_fields_in_the_real_order(tmp_path):
    from vllm.lora.request import LoRARequest

    real, double = LoRARequest("a", 3, str(tmp_path)), fake.LoRARequest("a", 3, str(tmp_path))
    assert (real.lora_name, real.lora_int_id, real.lora_path) == (double.lora_name, double.lora_int_id,
                                                                  double.lora_path)
    assert LORA_REQUEST_FIELDS == list(LoRARequest.__struct_fields__)
    for bad in (0, -1):
        with pytest.raises(ValueError):
            LoRARequest("a", bad, str(tmp_path))
        with pytest.raises(ValueError):
            fake.LoRARequest("a", bad, str(tmp_path))


def test_generate_answers_in_the_doubles_shape(engine):
    """RequestOutput.outputs[0].token_ids and prompt_logprobs: None first, then {token id: Logprob} per prompt token
    holding the token itself; the double's `score_with_vllm` reading works on both."""
    from vllm import SamplingParams

    from grpo_pipeline.pipeline.backends.vllm_engine import score_with_vllm

    ids = [60, 97, 110, 115, 119, 101, 114, 62]
    params = dict(max_tokens=4, temperature=1.0, prompt_logprobs=1)
    (real,) = engine.generate([{"prompt_token_ids": ids}], SamplingParams(**params), use_tqdm=False)
    (double,) = fake.FakeLLM(MAX_LORA_RANK, 0.5, False).generate([{"prompt_token_ids": ids}],
                                                                 sampling_params=fake.SamplingParams(**params))
    for output in (real, double):
        assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(ids)
        assert all(token in row and isinstance(row[token].logprob, float)
                   for row, token in zip(output.prompt_logprobs[1:], ids[1:]))
        assert isinstance(output.outputs[0].token_ids, list) and output.outputs[0].token_ids
    scores = score_with_vllm(engine.generate, ids[:3], ids[3:])  # the probe's reading of that shape
    assert len(scores) == len(ids) - 3 and all(math.isfinite(s) and s <= 0 for s in scores)


def test_a_lora_request_naming_a_saved_adapter_changes_the_scores_on_both(engine, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from vllm.lora.request import LoRARequest

    from grpo_pipeline.pipeline.backends import plain
    from grpo_pipeline.pipeline.backends.vllm_engine import score_with_vllm
    from train_helpers import demo_config

    cfg = demo_config(tmp_path, model_name_or_path="tiny-demo-vllm")
    model = get_peft_model(plain.load_model("tiny-demo-vllm", cfg, for_training=False),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                      init_lora_weights=False))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(50.0)
    model.save_pretrained(tmp_path / "lora")
    prompt, continuation = [60, 97, 110], [115, 119, 101, 114, 62]
    base = score_with_vllm(engine.generate, prompt, continuation)
    adapted = score_with_vllm(engine.generate, prompt, continuation,
                              lora_request=LoRARequest("lora", 1, str(tmp_path / "lora")))
    assert base != adapted
    double, params = fake.FakeLLM(MAX_LORA_RANK, 0.5, False).generate, fake.SamplingParams(prompt_logprobs=1)
    tokens = [{"prompt_token_ids": prompt + continuation}]
    assert double(tokens, sampling_params=params)[0].prompt_logprobs != double(
        tokens, sampling_params=params, lora_request=fake.LoRARequest("lora", 1, str(tmp_path / "lora")))[0].prompt_logprobs
    # the engine's adapter scores match the adapter's own transformers scores (bf16 engine, fp32 model)
    from grpo_pipeline.pipeline.health.rollout import mean_gap, trainer_logprobs

    assert mean_gap(adapted, trainer_logprobs(model, prompt, continuation)) < 0.05


def test_the_cpu_build_has_no_sleep_mode_so_the_double_alone_covers_sleep_and_wake_up():
    """When a build with sleep mode runs these tests, this fails and says what to add: the double's sleep/wake_up
    held to the real engine's. Until then they are held to the pinned wheel's signatures only (docs/gpu.md)."""
    from vllm.platforms import current_platform

    assert current_platform.is_cpu() and not current_platform.is_sleep_mode_available()
