"""GPU-boundary contract tests, trainer side: the GRPO/SFT config kwargs, vLLM sampling params, GPU memory
share and warm-up precision we hand Unsloth (see tests/test_unsloth_backend.py for what the fake is)."""

from __future__ import annotations

import json

import pytest

from grpo_pipeline.pipeline.backends import unsloth as backend
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig
from tests.unsloth_helpers import IMPORT_ORDER_WARNINGS, make_cfg, only_call
from tests.unsloth_helpers import fake  # noqa: F401 (a fixture the tests take)

pytestmark = IMPORT_ORDER_WARNINGS


# ------------------------------------------------------------------------------------------ trainer config


def test_grpo_config_kwargs_bf16_gpu(fake):
    model, _ = backend.load_for_training(make_cfg())
    assert backend.grpo_config_kwargs(make_cfg(), model) == {
        "use_vllm": True, "bf16": True, "fp16": False, "vllm_importance_sampling_correction": True}


@pytest.mark.parametrize("value", [True, False])
def test_importance_sampling_correction_is_passed_explicitly_by_both_backends(fake, value, monkeypatch):
    # Unsloth's GRPOConfig defaults it to False and TRL's to True: neither default may decide silently.
    from grpo_pipeline.pipeline.backends import plain

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


def test_vllm_sampling_params_without_vllm_are_refused_not_dropped(fake):
    """A direct caller (no validate()) with fast_inference false: the sampling params would reach no engine."""
    cfg = make_cfg(fast_inference=False, vllm_standby="false", vllm_sampling_params={"min_p": 0.1})
    model, _ = backend.load_for_training(make_cfg(fast_inference=False, vllm_standby="false"))
    with pytest.raises(ConfigError, match="fast_inference: false") as err:
        backend.grpo_config_kwargs(cfg, model)
    assert err.value.field == "vllm_sampling_params"

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
    assert backend.resolve_gpu_memory_utilization(cfg, total_gib=total_gib,
                                                  standby=standby) == expected


@pytest.mark.parametrize("value", ["abc", "0", "-0.2", "1.5", "nan", ""])
def test_invalid_gpu_memory_utilization_names_the_field(value):
    with pytest.raises(ConfigError) as err:
        backend.resolve_gpu_memory_utilization(make_cfg(gpu_memory_utilization=value),
                                               total_gib=24.0, standby=False)
    assert err.value.field == "gpu_memory_utilization"


def test_explicit_gpu_memory_utilization(monkeypatch):
    monkeypatch.delenv("UNSLOTH_VLLM_STANDBY_UTIL_OVERRIDE", raising=False)
    cfg = make_cfg(gpu_memory_utilization="1")
    assert backend.resolve_gpu_memory_utilization(cfg, total_gib=24.0, standby=False) == 1.0
    with pytest.warns(UserWarning, match="replaced by Unsloth's standby tier"):
        assert backend.resolve_gpu_memory_utilization(make_cfg(gpu_memory_utilization="0.6"), 24.0,
                                                      True) == 0.6

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

    from grpo_pipeline.pipeline.data.run_data import warmup_examples
    from grpo_pipeline.pipeline.trainer import warmup
    from grpo_pipeline.pipeline.trainer.agents import resolve_agents

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
    assert warmup.run_format_warmup(model, tokenizer, cfg, prepared, warmup_examples(cfg, prepared),
                                    resolve_agents(cfg.grpo).tools, None, tmp_path) is model
    assert (made["args"].bf16, made["args"].fp16) == expected
