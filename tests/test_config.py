"""Config: TrlParser YAML + CLI overrides, and every validation error with its message."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from grpo_pipeline.pipeline.config import (
    ConfigError,
    PipelineConfig,
    from_mapping,
    parse_config,
    peek_option,
    validate,
)

ROOT = Path(__file__).resolve().parents[1]


def check(**overrides):
    return validate(PipelineConfig().replace(**overrides), n_processes=1)


def test_defaults_validate_cleanly():
    assert check() == []


def test_yaml_then_cli_override(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("num_generations: 4\nper_device_train_batch_size: 4\nlora_target_modules: [q_proj]\n"
                      "vllm_sampling_params: {min_p: 0.1}\n")
    cfg = parse_config(["--config", str(recipe), "--num_generations", "2", "--beta", "0.04"])
    assert cfg.grpo.num_generations == 2  # CLI beats YAML
    assert cfg.grpo.per_device_train_batch_size == 4  # YAML beats default
    assert cfg.grpo.beta == 0.04
    assert cfg.lora.lora_target_modules == ["q_proj"]
    assert cfg.grpo.vllm_sampling_params == {"min_p": 0.1}


def test_unknown_yaml_key_names_it(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_prompt_lenght: 256\n")
    with pytest.raises(ConfigError, match="max_prompt_lenght"):
        parse_config(["--config", str(recipe)])


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        parse_config(["--config", str(tmp_path / "nope.yaml")])


def test_every_recipe_parses_and_validates():
    recipes = sorted((ROOT / "configs").glob("qwen2.5-*.yaml"))
    assert [p.name for p in recipes] == ["qwen2.5-0.5b-gsm8k.yaml", "qwen2.5-1.5b-gsm8k-zh.yaml",
                                         "qwen2.5-1.5b-gsm8k.yaml", "qwen2.5-3b-gsm8k.yaml", "qwen2.5-7b-gsm8k.yaml"]
    for recipe in recipes:
        cfg = parse_config(["--config", str(recipe)])
        assert validate(cfg, n_processes=1) == []
        assert cfg.model.model_name_or_path.startswith("unsloth/Qwen2.5-")


def test_num_generations_at_least_two():
    with pytest.raises(ConfigError, match=r"`num_generations`: got 1; it must be >= 2.*GRPO compares"):
        check(num_generations=1, per_device_train_batch_size=1)


def test_batch_must_divide_by_num_generations_and_explains_completions():
    with pytest.raises(ConfigError) as err:
        check(num_generations=8, per_device_train_batch_size=1, gradient_accumulation_steps=1)
    message = str(err.value)
    assert err.value.field == "per_device_train_batch_size"
    assert "= 1 is not divisible by num_generations (8)" in message
    assert "TRL counts completions" in message
    assert "Unsloth would silently rewrite" in message


def test_world_size_counts_in_the_batch():
    cfg = PipelineConfig().replace(num_generations=8, per_device_train_batch_size=4, gradient_accumulation_steps=1)
    with pytest.raises(ConfigError, match=r"processes \(1\) = 4"):
        validate(cfg, n_processes=1)
    assert validate(cfg, n_processes=2) == []  # 4 x 1 x 2 = 8


@pytest.mark.parametrize("per_device", [2, 4, 8])
@pytest.mark.parametrize("accumulation", [1, 2, 3])
@pytest.mark.parametrize("processes", [1, 2])
def test_gradient_accumulation_steps_counts_in_the_batch_divisibility(per_device, accumulation, processes):
    """The batch TRL splits into groups is per_device x gradient_accumulation_steps x processes, all three."""
    cfg = PipelineConfig().replace(num_generations=8, per_device_train_batch_size=per_device,
                                   gradient_accumulation_steps=accumulation)
    total = per_device * accumulation * processes
    if total % 8 == 0:
        assert validate(cfg, n_processes=processes) == []
    else:
        with pytest.raises(ConfigError, match=rf"x gradient_accumulation_steps \({accumulation}\) x processes "
                                              rf"\({processes}\) = {total} is not divisible"):
            validate(cfg, n_processes=processes)


def test_prompt_plus_completion_within_max_seq_length():
    with pytest.raises(ConfigError, match=r"max_prompt_length \(512\) \+ max_completion_length \(600\) = 1112 "
                                          r"exceeds max_seq_length \(1024\)"):
        check(max_prompt_length="512", max_completion_length="600")
    assert check(max_prompt_length="512", max_completion_length="512") == []


def test_limits_must_be_positive_or_auto():
    with pytest.raises(ConfigError, match="`max_prompt_length`: got 'lots'"):
        check(max_prompt_length="lots")
    with pytest.raises(ConfigError, match="`max_completion_length`: got -5"):
        check(max_completion_length="-5")


def test_lora_rank_within_max_lora_rank():
    with pytest.raises(ConfigError, match=r"`lora_r`: .*rank r=128, above max_lora_rank=64.*Raise max_lora_rank to "
                                          r"128"):
        check(lora_r=128)
    assert check(lora_r=128, max_lora_rank=128) == []


def test_temperature_positive():
    with pytest.raises(ConfigError, match="`temperature`: got 0; it must be >= 1e-05.*rollouts need sampling"):
        check(temperature=0.0)


def test_a_value_past_a_bound_exits_2_naming_the_field(tmp_path):
    """Through the command line: `temperature: 1e-40` (it once passed, then crashed at the first rollout) is one
    message and exit 2, before anything loads."""
    out = subprocess.run([sys.executable, "-m", "grpo_pipeline.pipeline", "train", "--temperature", "1e-40", "--output_dir",
                          str(tmp_path / "run")], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2, out.stderr[-2000:]
    assert "`temperature`: got 1e-40; it must be >= 1e-05" in out.stderr
    assert "Traceback" not in out.stderr


def test_generation_max_tokens_within_trained_length_unless_overridden():
    with pytest.raises(ConfigError, match=r"gen_max_tokens \(900\) exceeds the trained max_completion_length \(256\)"):
        check(max_completion_length="256", gen_max_tokens=900)
    assert check(max_completion_length="256", gen_max_tokens=900, allow_longer_generation=True) == []


def test_learning_rate_outside_range_warns_but_passes():
    with pytest.warns(UserWarning, match="learning_rate 0.01 is outside 1e-7..1e-3"):
        notes = check(learning_rate=1e-2)
    assert len(notes) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check(learning_rate=5e-6) == []


def test_unsloth_overridden_sampling_fields_are_refused():
    with pytest.raises(ConfigError, match="`temperature` is ignored there.*set `temperature` instead"):
        check(vllm_sampling_params={"temperature": 0.7})
    with pytest.raises(ConfigError, match="`max_tokens` is ignored there.*set `max_completion_length`"):
        check(vllm_sampling_params='{"max_tokens": 100}')
    assert check(vllm_sampling_params='{"min_p": 0.1}') == []


def test_choices_and_reward_weights():
    with pytest.raises(ConfigError, match="`backend`: got 'tpu'"):
        check(backend="tpu")
    with pytest.raises(ConfigError, match="`reward_weights`: 2 weights for 5 reward functions"):
        check(reward_weights=[1.0, 2.0])
    with pytest.raises(ConfigError, match="adaptive_beta.*needs beta > 0"):
        check(adaptive_beta=True, beta=0.0)


def test_from_mapping_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="unknown option"):
        from_mapping({"max_prompt_lenght": 1})


def test_peek_option_reads_cli_then_yaml(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("backend: plain\n")
    assert peek_option(["--config", str(recipe)], "backend") == "plain"
    assert peek_option(["--config", str(recipe), "--backend", "unsloth"], "backend") == "unsloth"
    assert peek_option(["--backend=auto"], "backend") == "auto"
    assert peek_option([], "backend", "auto") == "auto"


def test_cli_help_does_not_import_torch():
    code = ("import sys, grpo_pipeline.pipeline.cli as c; assert 'torch' not in sys.modules; c.main(['--help']); "
            "assert 'torch' not in sys.modules, 'torch imported by --help'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "train" in out.stdout and out.stdout.strip().endswith("ok")


def test_python_m_pipeline_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "grpo_pipeline.pipeline", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    for command in ("env", "data", "train", "generate", "eval", "export"):
        assert command in out.stdout


def test_every_numeric_field_is_type_checked_by_one_mechanism():
    """No per-field list: each int field refuses 1.5 and each float field refuses NaN, naming the field."""
    import dataclasses
    import typing

    from grpo_pipeline.pipeline.config import SECTIONS, PipelineConfig, check_field_values

    checked = 0
    for section in SECTIONS:
        hints = typing.get_type_hints(section)
        for f in dataclasses.fields(section):
            kind = hints[f.name]
            kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
            bad = {int: 1.5, float: float("nan"), bool: "maybe"}.get(kind)
            if bad is None:
                continue
            with pytest.raises(ConfigError) as caught:
                check_field_values(PipelineConfig().replace(**{f.name: bad}))
            assert caught.value.field == f.name
            checked += 1
    assert checked > 40


def test_bounds_come_with_the_default_as_the_fix():
    from grpo_pipeline.pipeline.config import check_field_values

    for name, value in (("learning_rate", -1e-5), ("top_p", 0), ("warmup_ratio", 1.0), ("save_steps", 0)):
        with pytest.raises(ConfigError, match=f"`{name}`.*must be.*the default is"):
            check_field_values(PipelineConfig().replace(**{name: value}))


def test_config_with_equals_sign_is_read(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_steps: 7\n")
    assert parse_config([f"--config={recipe}"]).grpo.max_steps == 7
    assert peek_option([f"--config={recipe}"], "max_steps") == 7


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("beta: 0\nmax_steps: [1\nlr: 2\n")
    with pytest.raises(ConfigError, match=r"r\.yaml line 3, column \d+: YAML syntax error"):
        parse_config(["--config", str(recipe)])


def test_unknown_key_suggests_the_closest_field(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("num_generation: 4\n")
    with pytest.raises(ConfigError, match="did you mean `num_generations`"):
        parse_config(["--config", str(recipe)])
    with pytest.raises(ConfigError, match="did you mean `max_steps`"):
        parse_config(["--max-step", "3"])
    assert parse_config(["--max-steps", "3", "--no_load_in_4bit"]).grpo.max_steps == 3


def test_fields_marked_trl_reach_grpo_config_under_trls_names(tmp_path):
    import trl

    from grpo_pipeline.pipeline.config import trl_training_args

    cfg = PipelineConfig().replace(learning_rate=1e-5, warmup_ratio=0.2, top_k=5, adam_beta2=0.95, save_steps=7,
                                   log_completions=True, loss_type="grpo")
    forwarded = trl_training_args(cfg)
    assert "warmup_ratio" not in forwarded and forwarded["warmup_steps"] == 0.2  # transformers 5: a ratio
    args = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **forwarded)
    for name, value in forwarded.items():
        assert getattr(args, name) == value, name
    assert (args.learning_rate, args.top_k, args.save_steps, args.loss_type) == (1e-5, 5, 7, "grpo")


def test_choice_fields_are_refused_with_the_choices_from_yaml_and_cli(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("overlong_policy: truncate\n")
    with pytest.raises(ConfigError, match="`overlong_policy`: got 'truncate'; choose one of drop, error"):
        validate(parse_config(["--config", str(recipe)]))
    with pytest.raises(ConfigError, match="`backend`: got 'cuda'; choose one of auto, unsloth, plain"):
        validate(parse_config(["--backend", "cuda"]))
    assert parse_config(["--vllm_standby", "True"]).model.vllm_standby == "true"  # normalised, then accepted


# ---------------------------------------------------------------------------------------- optim without bitsandbytes


def test_the_bitsandbytes_optimizer_list_is_transformers_own():
    from transformers.trainer_optimizer import _BITSANDBYTES_OPTIMIZERS

    from grpo_pipeline.pipeline.config.validate import BITSANDBYTES_OPTIMIZERS

    assert BITSANDBYTES_OPTIMIZERS == {str(name.value) for name in _BITSANDBYTES_OPTIMIZERS}


def _every_optimizer_name():
    from transformers.training_args import OptimizerNames

    return [name.value for name in OptimizerNames]


@pytest.mark.parametrize("optim", _every_optimizer_name())
def test_a_bitsandbytes_optim_without_bitsandbytes_becomes_adamw_torch_with_a_note_and_others_stay(
        optim, monkeypatch):
    import importlib.util

    from grpo_pipeline.pipeline.config import resolve_optim
    from grpo_pipeline.pipeline.config.validate import BITSANDBYTES_OPTIMIZERS

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real_find_spec(name, *a))
    cfg, note = resolve_optim(PipelineConfig().replace(optim=optim))
    if optim in BITSANDBYTES_OPTIMIZERS:
        assert cfg.grpo.optim == "adamw_torch"
        assert f"optim: {optim}" in note and "pip install bitsandbytes==0.50.2" in note
    else:
        assert cfg.grpo.optim == optim and note is None
    # with bitsandbytes installed, nothing changes
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "bitsandbytes" else real_find_spec(name, *a))
    assert resolve_optim(PipelineConfig().replace(optim=optim)) == (PipelineConfig().replace(optim=optim), None)


def test_every_gpu_recipe_optim_is_covered_by_the_fallback():
    from grpo_pipeline.pipeline.config.validate import BITSANDBYTES_OPTIMIZERS

    for recipe in sorted((ROOT / "configs").glob("qwen2.5-*.yaml")):
        optim = parse_config(["--config", str(recipe)]).grpo.optim
        assert optim == "adamw_torch" or optim in BITSANDBYTES_OPTIMIZERS, (recipe.name, optim)
