"""effective_config.json and the backends' config rewrites (pipeline/trainer/effective.py, backends/unsloth_config.py).

The Unsloth prediction is a pure function; the strict double's UnslothGRPOConfig (tests/fake_unsloth.py) is a
separate transcription of the lines the wheel generates, bound to the wheel's field list and replaced defaults
(tests/upstream_signatures.json). The two must agree on every field, over a table of recipes.
"""

from __future__ import annotations

import itertools

import pytest

import tests.fake_unsloth as fake_unsloth
from grpo_pipeline.pipeline.backends import plain
from grpo_pipeline.pipeline.backends.unsloth_config import UNSLOTH_GRPO_DEFAULTS, config_rewrites
from grpo_pipeline.pipeline.config import PipelineConfig
from grpo_pipeline.pipeline.trainer.effective import (
    EFFECTIVE_CONFIG_NAME,
    effective_record,
    predicted_changes,
    predicted_values,
    trl_defaults,
)


def test_unsloth_defaults_are_the_pinned_wheels():
    wheel = {k: d["value"] for k, d in fake_unsloth.SNAPSHOT["UnslothGRPOConfig"]["unsloth_default_overrides"].items()}
    fields = set(fake_unsloth.SNAPSHOT["UnslothGRPOConfig"]["fields"])
    assert {k: v for k, v in UNSLOTH_GRPO_DEFAULTS.items() if k in fields} == wheel


# Every branch of UnslothGRPOConfig's generated lines: loss_type (unset / each kind), beta (unset / set),
# scale_rewards, the DAPO paper's fields, top_k under vLLM, a batch that is not a multiple of the group.
RECIPES = [
    dict(zip(("loss_type", "beta", "use_vllm", "top_k", "per_device_train_batch_size"), combo))
    for combo in itertools.product((None, "dapo", "grpo", "dr_grpo", "cispo"), (None, 0.04), (True, False),
                                   (0, 5), (8, 6))
]
RECIPES += [{"loss_type": "dr_grpo", "scale_rewards": s} for s in (None, True, False, "group", "batch")]
RECIPES += [{"loss_type": "dapo", "mask_truncated_completions": m, "epsilon_high": e}
            for m in (None, False) for e in (None, 0.3)]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: ",".join(f"{k}={v}" for k, v in r.items()))
def test_the_prediction_is_what_the_double_of_the_wheel_builds(recipe):
    kwargs = {k: v for k, v in recipe.items() if v is not None}
    built = fake_unsloth.UnslothGRPOConfig(**kwargs).to_dict()
    predicted = predicted_values("unsloth", kwargs, trl_defaults())
    assert {k: predicted[k] for k in built if k in predicted} == {k: v for k, v in built.items() if k in predicted}
    assert set(built) - set(predicted) == {"vllm_sampling_params", "unsloth_num_chunks", "unsloth_grpo_mini_batch",
                                           "unsloth_logit_chunk_multiplier"}  # Unsloth's own: no TRL counterpart


def test_unsloth_changes_trls_defaults_where_the_recipe_is_silent():
    rewrites = config_rewrites({"use_vllm": True, "loss_type": "grpo"}, trl_defaults())
    assert rewrites["beta"][0] == 0.001  # TRL: 0.0
    assert rewrites["vllm_importance_sampling_correction"][0] is False  # TRL: True
    assert rewrites["top_k"][0] == -1 and "grpo_config_fix_vllm_top_k" in rewrites["top_k"][1]
    assert "_patch_trl_rl_trainers_impl" in rewrites["beta"][1]
    assert plain.config_rewrites({"use_vllm": True, "loss_type": "grpo"}, trl_defaults()) == {}


def test_the_record_marks_each_field_against_recipe_trl_and_the_other_backend():
    cfg = PipelineConfig().replace(output_dir="out", top_k=0)
    passed = {"learning_rate": 1e-5, "top_k": 0, "use_vllm": True, "beta": 0.0, "loss_type": "dapo"}
    args = fake_unsloth.UnslothGRPOConfig(**passed)
    record = effective_record("unsloth", cfg, args, passed,
                              {"use_vllm": True})
    top_k = record["fields"]["top_k"]
    assert top_k["value"] == -1 and top_k["recipe"] == 0 and top_k["trl_default"] == 0
    assert top_k["other_backend"] == 0  # plain, vllm_mode none: TRL keeps 0
    assert top_k["differs_from"] == ["recipe", "trl_default", "other_backend"]
    assert "grpo_config_fix_vllm_top_k" in top_k["changed_by"]
    assert record["fields"]["learning_rate"]["differs_from"] == ["recipe", "trl_default"]  # recipe 5e-6, ran 1e-5
    assert "changed_by" not in record["fields"]["learning_rate"]  # passed as is: no backend changed it
    assert any(line.startswith("top_k: 0 -> -1") for line in record["changed"])
    assert len(record["fields"]) == len(args.to_dict())  # every field of the config the trainer got


def test_check_reports_the_fields_the_backend_changes(tmp_path):
    from grpo_pipeline.pipeline.preflight import run_checks

    cfg = PipelineConfig().replace(model_name_or_path="tiny-demo", backend="plain", output_dir=str(tmp_path),
                                   dataset_name="demo-arithmetic", max_completion_length="48")
    lines = predicted_changes("plain", cfg,
                              plain.grpo_config_kwargs(cfg))
    assert any(line.startswith("use_cpu: False -> True") for line in lines)
    checks = {c.name: c for c in run_checks(cfg, stop_at_first=False)}
    assert checks["effective_config"].ok and all(line in checks["effective_config"].message for line in lines)
    assert EFFECTIVE_CONFIG_NAME == "effective_config.json"
