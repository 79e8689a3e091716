"""TRL's GRPOConfig fields are options of ours, with TRL's meaning, derived from the installed dataclass.

Every field no section of ours owns is set through a recipe and through the CLI and reaches the trainer's
arguments (by construction for all of them; a real tiny run carries a dozen at once); the fields the run owns
are refused with the reason; the ones the backend decides are honoured when they fit and refused when not;
`--check` refuses what TRL would refuse, before anything loads.
"""

import dataclasses
import json
import typing
from typing import Any, Optional

import pytest
import yaml

from grpo_pipeline.pipeline.config import ConfigError, from_mapping, parse_config, trl_training_args
from grpo_pipeline.pipeline.config.fields import field_names
from grpo_pipeline.pipeline.config.trl_fields import (
    grpo_config_class,
    trainer_choices,
    trl_fields,
    trl_option_names,
    trl_section,
    trl_with,
)

RUN_OWNED, BACKEND_DECIDED = trl_with("run_owned"), trl_with("backend_decided")

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _plain(kind: Any) -> Any:
    args = typing.get_args(kind)
    if type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None))
    return kind


def _a_value(name: str) -> tuple[Any, Optional[str]]:
    """A value of the field's own type that is not its default, and how the CLI writes it (None: CLI-less)."""
    f = {f.name: f for f in dataclasses.fields(trl_section())}[name]
    kind, default = _plain(typing.get_type_hints(trl_section())[name]), f.default
    choices = trainer_choices().get(name) or tuple(f.metadata.get("choices") or ())
    if choices:
        value = next(c for c in choices if c != default)
        return value, str(value)
    if kind is bool:
        return (not default if isinstance(default, bool) else True), str(not default if isinstance(default, bool)
                                                                          else True)
    if kind is int:
        return (default or 0) + 3, str((default or 0) + 3)
    if kind is float:
        return 0.375, "0.375"
    if kind is str:
        return f"{name}-set", f"{name}-set"
    if typing.get_origin(kind) is list:
        return ["a", "b"], None
    if dict in typing.get_args(kind) or kind is dict:
        return {"key": 1}, None
    return None, None


def test_every_grpo_config_field_not_ours_is_an_option_and_none_is_missing():
    """Derived, not copied: the options are exactly GRPOConfig's init fields, minus ours and the run's own."""
    fields = [f.name for f in dataclasses.fields(grpo_config_class()) if f.init and not f.name.startswith("_")]
    ours = set(field_names())
    assert set(trl_option_names()) == set(fields) - ours - set(RUN_OWNED)
    assert set(RUN_OWNED) <= set(fields) and set(BACKEND_DECIDED) <= set(trl_option_names())
    # the ones users named in the field reports
    for name in ("scale_rewards", "importance_sampling_level", "num_iterations", "epsilon", "delta",
                 "steps_per_generation", "generation_batch_size", "repetition_penalty", "generation_kwargs",
                 "chat_template_kwargs", "top_entropy_quantile", "sync_ref_model", "vllm_gpu_memory_utilization",
                 "bf16", "warmup_steps", "lr_scheduler_kwargs", "gradient_checkpointing_kwargs",
                 "logging_first_step", "save_strategy"):
        assert name in trl_option_names(), name
    # TRL's type and default, unchanged
    section = {f.name: f for f in dataclasses.fields(trl_section())}
    for name in trl_option_names():
        assert section[name].default == trl_fields()[name].default, name
        assert section[name].metadata.get("help") == trl_fields()[name].metadata.get("help"), name


def test_every_trl_option_set_in_a_recipe_and_on_the_cli_reaches_trl_training_args(tmp_path):
    values = {name: _a_value(name) for name in trl_option_names()}
    recipe_values = {name: value for name, (value, _) in values.items() if value is not None}
    assert len(recipe_values) > 100  # the few left out have types with no YAML form (ParallelismConfig, ...)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(recipe_values), encoding="utf-8")
    from_recipe = parse_config(["--config", str(recipe)])
    assert from_recipe.trl == recipe_values
    args = trl_training_args(from_recipe)
    assert {name: args[name] for name in recipe_values} == recipe_values

    argv = [item for name, (_, text) in values.items() if text is not None for item in (f"--{name}", text)]
    from_cli = parse_config(argv)
    expected = {name: value for name, (value, text) in values.items() if text is not None}
    assert from_cli.trl == expected
    assert from_mapping(from_cli.to_dict()).trl == expected  # replace()/to_dict keep them


def test_unknown_keys_are_all_named_at_once_with_the_nearest_option_from_either_set(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("scael_rewards: none\ntorch_dtype: bfloat16\nlearning_rat: 1.0e-5\nnum_iteration: 2\n")
    with pytest.raises(ConfigError) as err:
        parse_config(["--config", str(recipe)])
    message = str(err.value)
    for name, nearest in (("scael_rewards", "scale_rewards"), ("torch_dtype", "dtype"),
                          ("learning_rat", "learning_rate"), ("num_iteration", "num_iterations")):
        assert f"`{name}`" in message and f"`{nearest}`" in message, (name, message)
    assert "4 unknown options" in message
    with pytest.raises(ConfigError, match="unknown option `use_vlm`.*`use_vllm`"):
        parse_config(["--use_vlm", "true"])


@pytest.mark.parametrize("name", sorted(RUN_OWNED))
def test_a_field_the_run_sets_itself_is_refused_with_the_reason(name, tmp_path):
    with pytest.raises(ConfigError) as err:
        from_mapping({name: True})
    assert err.value.field == name and RUN_OWNED[name] in str(err.value)


@pytest.mark.parametrize("report_to", [["none"], "none", ["tensorboard"], "tensorboard", "tensorboard,none"])
def test_report_to_takes_a_list_or_a_scalar_as_in_trl(report_to):
    cfg = from_mapping({"report_to": report_to})
    assert cfg.grpo.reporters() == ([] if report_to in (["none"], "none") else ["tensorboard"])


def _check(tmp_path, capsys, *options):
    from grpo_pipeline.pipeline.train import main

    code = main(["--config", "configs/cpu-demo.yaml", "--output_dir", str(tmp_path / "run"), "--check", *options])
    printed = capsys.readouterr().out
    report = json.loads(printed[printed.index("{"):])
    return code, {c["name"]: c for c in report["checks"]}


@pytest.mark.parametrize("name", sorted(trainer_choices()))
def test_check_refuses_a_value_trls_trainer_would_refuse_mid_step_naming_the_field(name, tmp_path, capsys):
    code, checks = _check(tmp_path, capsys, f"--{name}", "gpro")
    assert code == 2 and not checks["trl"]["ok"]
    message = checks["trl"]["message"]
    assert f"`{name}`" in message and all(choice in message for choice in trainer_choices()[name])


@pytest.mark.parametrize("options, field, ok", [
    (["--bf16", "true"], "bf16", False),         # never on a CPU: dtype decides
    (["--fp16", "true"], "fp16", False),
    (["--use_vllm", "true"], "use_vllm", False),  # vllm_mode none decides it
    (["--bf16", "false", "--use_vllm", "false"], None, True),  # what the backend would choose: honoured
    (["--scale_rewards", "none", "--loss_type", "dr_grpo", "--importance_sampling_level", "sequence",
      "--num_iterations", "2", "--epsilon", "0.3", "--delta", "2.0", "--warmup_steps", "5"], None, True),
])
def test_check_builds_trls_config_honouring_backend_fields_that_fit_and_naming_those_that_dont(
        options, field, ok, tmp_path, capsys):
    code, checks = _check(tmp_path, capsys, *options)
    assert checks["trl"]["ok"] is ok, checks["trl"]
    assert code == (0 if ok else 2)
    if field:
        assert f"`{field}`" in checks["trl"]["message"] and BACKEND_DECIDED[field].split(" ")[0] in \
            checks["trl"]["message"]


@pytest.mark.slow
def test_an_open_r1_style_recipe_with_trls_reward_trains_as_written_and_its_fields_reach_the_trainer(tmp_path):
    """A TRL-format dataset, trl.rewards.accuracy_reward, and a dozen TRL fields in one recipe; every completion
    clipped at 8 tokens with mask_truncated_completions: a step with no gradient, not a crash."""
    from transformers import TrainerCallback

    from grpo_pipeline.pipeline.train import run_training
    from tests.data_helpers import write_jsonl

    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}? Give \\boxed{{}}."}],
             "solution": f"${a + b}$"} for a in range(2, 8) for b in range(1, 3)]
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    trl_options = {"scale_rewards": "none", "loss_type": "dr_grpo", "importance_sampling_level": "sequence",
                   "num_iterations": 2, "epsilon": 0.3, "warmup_steps": 0.05,
                   "lr_scheduler_type": "cosine_with_min_lr",
                   "lr_scheduler_kwargs": {"min_lr_rate": 0.1}, "logging_first_step": True,
                   "repetition_penalty": 1.1, "top_entropy_quantile": 0.8, "mask_truncated_completions": True,
                   "generation_kwargs": {"do_sample": True}, "save_strategy": "steps"}
    recipe = {"model_name_or_path": "tiny-qwen2.5", "backend": "plain", "dataset_name": str(data),
              "reward_funcs": ["trl.rewards.accuracy_reward", "xmlcount"], "reward_weights": [1.0, 0.5],
              "num_generations": 4, "per_device_train_batch_size": 4, "max_steps": 2, "save_steps": 2,
              "max_seq_length": 256, "max_completion_length": "8", "report_to": ["none"], "lora_r": 8,
              "lora_alpha": 16, "lora_target_modules": ["q_proj", "v_proj"], "learning_rate": 5e-3,
              "data_cache_dir": str(tmp_path / "cache"), "output_dir": str(tmp_path / "run"), **trl_options}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    seen = {}

    class Remember(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            seen.update({name: getattr(args, name) for name in trl_options})

    result = run_training(parse_config(["--config", str(path)]), callbacks=[Remember()])
    assert result.status == "completed", result
    assert seen == {**trl_options, "lr_scheduler_type": seen["lr_scheduler_type"]}
    assert getattr(seen["lr_scheduler_type"], "value", None) == "cosine_with_min_lr"
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = records[0]
    assert "rewards/accuracy_reward/mean" in first
    assert first["completions/clipped_ratio"] == 1.0 and first["loss"] == 0.0 and first["grad_norm"] == 0.0


def test_every_numeric_trl_option_has_a_bound_with_its_reason():
    """A TRL upgrade that adds a numeric option fails here until TRL_BOUNDS gives it a bound (and a reason); a
    bound for an option TRL no longer has fails too."""
    from grpo_pipeline.pipeline.config.trl_fields import TRL_BOUNDS, trl_section

    def scalar(hint):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if type(None) in typing.get_args(hint) and len(args) == 1 else hint

    hints = typing.get_type_hints(trl_section())
    numeric = {name for name, hint in hints.items() if scalar(hint) in (int, float)}
    assert len(numeric) > 40
    assert sorted(numeric ^ set(TRL_BOUNDS)) == []
    assert all({"gt", "ge", "lt", "le"} & set(rules) and rules["why"] for rules in TRL_BOUNDS.values())
