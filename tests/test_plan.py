"""`grpo plan`: each part's formula against a case computed by hand, monotonicity over the options, the bundled
Qwen2.5 configs against the real ones, the cards, the command, the `memory` check and the committed table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig, parse_config
from grpo_pipeline.pipeline.plan import estimate as est
from grpo_pipeline.pipeline.plan.cards import CUDA_CONTEXT_GIB, GIB, KNOWN_CARDS, card_by_name, card_from_memory
from grpo_pipeline.pipeline.plan.command import RECIPES_DIR, main, recipe_table, render
from grpo_pipeline.pipeline.plan.fit import REFUSE_RATIO, memory_check, plan, suggestions
from grpo_pipeline.pipeline.plan.shape import bundled_config_name
from grpo_pipeline.pipeline.plan.shape import ModelShape, ParamCounts, count_parameters, load_shape

ROOT = Path(__file__).resolve().parents[1]

# A hand-sized model: hidden 64, intermediate 128, 2 layers, 4 heads of 16 (q 64), 2 kv heads (kv 32), vocab 1000.
TINY = ModelShape(name="tiny", source="test", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1000,
                  tie_word_embeddings=True, config={})
# Its counts as an architecture would report them: per layer q 64x64, k/v 64x32, o 64x64, gate/up 64x128, down
# 128x64 -> 4096 + 2*2048 + 4096 + 2*8192 + 8192 = 36864 linear weights a layer, 73728 in all.
TINY_COUNTS = ParamCounts(
    total=73728 + 64000 + 1000, embed=64000, lm_head=0, quantizable=73728,
    linears={"q_proj": [64, 64, 2], "k_proj": [64, 32, 2], "v_proj": [64, 32, 2], "o_proj": [64, 64, 2],
             "gate_proj": [64, 128, 2], "up_proj": [64, 128, 2], "down_proj": [128, 64, 2]},
    by_module={"embed_tokens": 64000},
)


def tiny_cfg(**overrides) -> PipelineConfig:
    values = dict(model_name_or_path="unsloth/Qwen2.5-1.5B-Instruct", max_seq_length=1024,
                  max_prompt_length="256", max_completion_length="768", num_generations=8,
                  per_device_train_batch_size=8, lora_r=8, optim="adamw_8bit", vllm_standby="false",
                  gpu_memory_utilization="0.5")
    values.update(overrides)
    return PipelineConfig().replace(**values)


def parts(cfg: PipelineConfig, card_gib: float = 16.0) -> est.Estimate:
    return est.estimate(cfg, TINY, TINY_COUNTS, card_from_memory(card_gib))


# ------------------------------------------------------------------------------------ each formula by hand


def test_weights_4bit_and_16bit_by_hand():
    four = parts(tiny_cfg(load_in_4bit=True))
    # 73728 NF4 weights x (0.5 + 1/64 + 4/16384) + (64000 embed + 1000 norms/biases) x 2 bytes
    assert four.part("weights") * GIB == pytest.approx(73728 * (0.5 + 1 / 64 + 4 / 16384) + 65000 * 2)
    sixteen = parts(tiny_cfg(load_in_4bit=False))
    assert sixteen.part("weights") * GIB == pytest.approx(138728 * 2)


def test_plain_4bit_holds_the_16bit_parameters_in_fp32():
    # peft's prepare_model_for_kbit_training (the plain backend's 4-bit load) casts them to fp32; Unsloth does not
    plain = parts(tiny_cfg(load_in_4bit=True, backend="plain"))
    assert plain.part("weights") * GIB == pytest.approx(73728 * est.NF4_BYTES_PER_WEIGHT + 65000 * 4)
    assert parts(tiny_cfg(load_in_4bit=True)).part("weights") * GIB == pytest.approx(
        73728 * est.NF4_BYTES_PER_WEIGHT + 65000 * 2)


def test_untied_lm_head_stays_16bit():
    untied = ParamCounts(**{**TINY_COUNTS.__dict__, "total": TINY_COUNTS.total + 64000, "lm_head": 64000})
    result = est.estimate(tiny_cfg(load_in_4bit=True), TINY, untied, card_from_memory(16))
    assert result.part("weights") * GIB == pytest.approx(73728 * est.NF4_BYTES_PER_WEIGHT + 129000 * 2)


def test_lora_gradients_and_optimizer_by_hand():
    # r=8 on all seven: per layer 8*(128 + 96 + 96 + 128 + 192 + 192 + 192) = 8*1024 = 8192; 2 layers: 16384
    result = parts(tiny_cfg(lora_r=8, optim="adamw_8bit"))
    assert result.part("lora") * GIB == 16384 * 4
    assert result.part("gradients") * GIB == 16384 * 4
    assert result.part("optimizer") * GIB == pytest.approx(16384 * (2 + 8 / 2048))
    assert parts(tiny_cfg(lora_r=8, optim="adamw_torch")).part("optimizer") * GIB == 16384 * 8
    # modules_to_save trains whole modules: the embeddings' 64000 parameters join the trainable set
    saved = parts(tiny_cfg(lora_r=8, lora_modules_to_save=["embed_tokens"], fast_inference=False))
    assert saved.part("lora") * GIB == (16384 + 64000) * 4


def test_activations_by_hand_for_each_checkpointing_mode():
    # 8 rows x 1024 tokens = 8192 tokens; one layer saves (4*64 + 2*64 + 2*32 + 4*128) = 960 values a token, bf16
    per_layer = 8192 * 960 * 2
    boundary = 8192 * 64 * 2
    unsloth = parts(tiny_cfg())
    assert unsloth.part("activations") * GIB == 2 * boundary + per_layer  # offloaded: 2 inputs on the GPU
    plain = parts(tiny_cfg(backend="plain", load_in_4bit=False))
    assert plain.part("activations") * GIB == 2 * boundary + per_layer  # standard: all (2) layer inputs
    # the plain backend's 4-bit model runs an fp32 residual stream (fp32 embeddings and norms; Linear4bit returns
    # its input's dtype): every value takes 4 bytes
    assert parts(tiny_cfg(backend="plain", load_in_4bit=True)).part("activations") * GIB == 2 * (
        2 * boundary + per_layer)
    # Below max_seq_length 512 Unsloth uses standard checkpointing; 4 rows x 500 tokens
    short = parts(tiny_cfg(max_seq_length=500, max_prompt_length="100", max_completion_length="400",
                           num_generations=4, per_device_train_batch_size=4))
    assert short.part("activations") * GIB == 2 * (2000 * 64 * 2) + 2000 * 960 * 2
    # Unsloth offloads only layer inputs over 2 MiB (unsloth_zoo MINIMUM_SIZE): 4 layers of 1 MiB inputs stay
    deep = ModelShape(**{**TINY.__dict__, "num_hidden_layers": 4})
    assert est.estimate(tiny_cfg(), deep, TINY_COUNTS, card_from_memory(16)).part("activations") * GIB == (
        4 * boundary + per_layer)
    wide = ModelShape(**{**deep.__dict__, "hidden_size": 256})  # 4 MiB inputs: offloaded, 2 on the GPU
    assert est.estimate(tiny_cfg(), wide, TINY_COUNTS, card_from_memory(16)).part("activations") * GIB == (
        2 * 4 * boundary + 8192 * (4 * 256 + 2 * 64 + 2 * 32 + 4 * 128) * 2)
    off = parts(tiny_cfg(gradient_checkpointing=False))
    assert off.part("activations") * GIB == 2 * per_layer


def test_logprob_working_set_by_hand_for_both_backends():
    # Unsloth: 8 x 768 = 6144 hidden states (bf16 + a bf16 grad) and one chunk of fp32 logits with their bf16
    # gradient: 2 GiB / (1000 x 8 B) = 268435 tokens fit the chunk's size, max(512, 6144 / 8) = 768 is the cap
    unsloth = parts(tiny_cfg())
    assert unsloth.part("logprobs") * GIB == 6144 * 64 * 4 + 768 * 1000 * 6
    # a large vocabulary: the chunk's 2 GiB at 8 bytes a logit is the limit (2**31 / (200000 x 8) = 1342 tokens)
    wide = est.logprob_bytes(ModelShape(**{**TINY.__dict__, "vocab_size": 200000}), 64, 1024, unsloth=True)[0]
    assert wide == 65536 * 64 * 4 + 1342 * 200000 * 6
    # TRL fused head: the same hidden states (+ an fp32 grad), one 4096 x 32768 bf16 tile and 8 fp32 values a token
    plain = parts(tiny_cfg(backend="plain", load_in_4bit=False))
    assert plain.part("logprobs") * GIB == 6144 * 64 * 6 + 4096 * 32768 * 2 + 6144 * 32
    # the plain 4-bit model's hidden states are fp32
    kbit = parts(tiny_cfg(backend="plain", load_in_4bit=True))
    assert kbit.part("logprobs") * GIB == 6144 * 64 * 8 + 4096 * 32768 * 2 + 6144 * 32


def test_kv_need_and_vllm_share_by_hand():
    result = parts(tiny_cfg(), card_gib=16.0)
    # 8 completions x 1024 tokens x (2 layers x 2 kv heads x 16 dims x 2 (K, V) x 2 bytes = 256 B)
    assert TINY.kv_bytes_per_token == 256
    assert result.part("kv_need") * GIB == 8 * 1024 * 256
    total = 16.0 * 0.98
    assert result.part("vllm") == pytest.approx(0.5 * total)
    # No standby: the share and the whole training side add up
    assert result.peak_gib == pytest.approx(0.5 * total + held(result) + training(result))
    assert result.usable_gib == pytest.approx(total - CUDA_CONTEXT_GIB)


def held(result: est.Estimate) -> float:
    """What the trainer holds through the whole step besides the weights: LoRA, optimizer states, cuBLAS workspace."""
    assert result.part("workspace") * GIB == 32 * 2**20  # torch's Hopper default, allocated through its allocator
    return result.part("lora") + result.part("optimizer") + result.part("workspace")


def training(result: est.Estimate) -> float:
    """The backward's working set on the tiny shape: the loss's backward, then the layers' one (the recomputed layer
    and the LoRA gradients), with the checkpointed layer inputs kept through both."""
    kept = 2 * 8192 * 64 * 2  # both layer inputs (standard) or the two on the GPU (Unsloth offloaded), bf16
    recomputed = result.part("activations") - kept / GIB
    return kept / GIB + max(result.part("logprobs"), recomputed + result.part("gradients"))


def test_the_loss_backward_and_the_layers_backward_do_not_overlap():
    # a big vocabulary makes the loss's chunk the larger; a big intermediate size makes the recomputed layer larger
    for shape in (ModelShape(**{**TINY.__dict__, "vocab_size": 100000}),
                  ModelShape(**{**TINY.__dict__, "intermediate_size": 4096})):
        result = est.estimate(tiny_cfg(), shape, TINY_COUNTS, card_from_memory(16))
        assert result.peak_gib == pytest.approx(result.part("vllm") + held(result) + training(result))


def test_standby_peak_is_the_larger_phase():
    result = parts(tiny_cfg(vllm_standby="true", gpu_memory_utilization="auto"), card_gib=16.0)
    share = result.part("vllm")
    assert share == pytest.approx(0.8 * 0.95 * 16 * 0.98)  # Unsloth's tier for a 15.7 GiB card
    slot = 16384 / 8 * 64 * 2 / GIB  # vLLM's LoRA slot: max_lora_rank 64, 16-bit
    train_phase = result.part("weights") + slot + held(result) + training(result)
    assert result.peak_gib == pytest.approx(max(share + held(result), train_phase))


def test_reference_model_is_shared_with_lora():
    assert parts(tiny_cfg(beta=0.04)).part("reference") == 0
    assert parts(tiny_cfg(beta=0.04)).peak_gib == parts(tiny_cfg(beta=0.0)).peak_gib


def test_without_vllm_generation_and_training_share_the_peak():
    result = parts(tiny_cfg(fast_inference=False, vllm_standby="auto"))
    generation = (8 * 1024 * 256 + 8 * 1000 * 4) / GIB
    assert result.part("generation") == pytest.approx(generation)
    assert result.peak_gib == pytest.approx(result.part("weights") + held(result)
                                            + max(generation, training(result)))
    # the plain backend's 4-bit model: generate runs its fp32 residual stream, so the KV cache is fp32
    kbit = parts(tiny_cfg(backend="plain", load_in_4bit=True))
    assert kbit.part("generation") == pytest.approx((8 * 1024 * 256 * 2 + 8 * 1000 * 4) / GIB)


def test_vllm_without_room_for_one_sequence_is_a_blocker():
    result = parts(tiny_cfg(gpu_memory_utilization="0.02"), card_gib=16.0)
    assert result.blocker and not result.fits


# ------------------------------------------------------------------------------------------- monotonicity

PATHS = [dict(), dict(vllm_standby="true", gpu_memory_utilization="auto"), dict(fast_inference=False),
         dict(backend="plain"), dict(backend="plain", vllm_mode="colocate")]


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from(PATHS), groups=st.integers(2, 16), more=st.integers(1, 8),
       completion=st.integers(16, 4000), extra=st.integers(1, 2000), card=st.sampled_from(list(KNOWN_CARDS)))
def test_more_generations_longer_completions_bigger_batches_never_lower_the_estimate(path, groups, more,
                                                                                     completion, extra, card):
    def peak(n: int, length: int) -> float:
        cfg = tiny_cfg(**path, num_generations=n, per_device_train_batch_size=n, max_seq_length=length + 300,
                       max_prompt_length="256", max_completion_length=str(length))
        return est.estimate(cfg, TINY, TINY_COUNTS, KNOWN_CARDS[card]).peak_gib

    assert peak(groups + more, completion) >= peak(groups, completion)
    assert peak(groups, completion + extra) >= peak(groups, completion)
    # a bigger batch of the same group size (two questions a step instead of one)
    bigger = tiny_cfg(**path, num_generations=groups, per_device_train_batch_size=2 * groups)
    smaller = tiny_cfg(**path, num_generations=groups, per_device_train_batch_size=groups)
    assert parts(bigger).peak_gib >= parts(smaller).peak_gib
    # a larger LoRA rank (within max_lora_rank) never lowers it either
    assert parts(tiny_cfg(**path, lora_r=64)).peak_gib >= parts(tiny_cfg(**path, lora_r=8)).peak_gib


# ---------------------------------------------------------------------------- the bundled Qwen2.5 configs

REAL_QWEN25 = {  # Qwen/Qwen2.5-*/config.json; parameters as published on the model cards
    "qwen2.5-0.5b": dict(hidden=896, inter=4864, layers=24, heads=14, kv=2, vocab=151936, tied=True, params=0.49),
    "qwen2.5-1.5b": dict(hidden=1536, inter=8960, layers=28, heads=12, kv=2, vocab=151936, tied=True, params=1.54),
    "qwen2.5-3b": dict(hidden=2048, inter=11008, layers=36, heads=16, kv=2, vocab=151936, tied=True, params=3.09),
    "qwen2.5-7b": dict(hidden=3584, inter=18944, layers=28, heads=28, kv=4, vocab=152064, tied=False, params=7.62),
}


@pytest.mark.parametrize("name", sorted(REAL_QWEN25))
def test_bundled_configs_match_the_real_qwen25_and_its_published_size(name, tmp_path):
    real = REAL_QWEN25[name]
    size = name.split("-")[1].upper()
    for spelling in (f"Qwen/Qwen2.5-{size}", f"unsloth/Qwen2.5-{size}-Instruct",
                     f"unsloth/Qwen2.5-{size}-Instruct-bnb-4bit"):
        assert bundled_config_name(spelling) == name
    shape = load_shape(f"unsloth/Qwen2.5-{size}-Instruct")
    assert (shape.hidden_size, shape.intermediate_size, shape.num_hidden_layers, shape.num_attention_heads,
            shape.num_key_value_heads, shape.vocab_size, shape.tie_word_embeddings,
            shape.config["max_position_embeddings"], shape.config["torch_dtype"]) == (
        real["hidden"], real["inter"], real["layers"], real["heads"], real["kv"], real["vocab"], real["tied"], 32768,
        "bfloat16")
    counts = count_parameters(shape, cache_dir=tmp_path / "a", use_seeds=False)  # built on the meta device
    assert round(counts.total / 1e9, 2) == real["params"]
    assert (counts.lm_head == 0) == real["tied"]
    assert count_parameters(shape, cache_dir=tmp_path / "a", use_seeds=False) == counts  # read back from the cache
    # The counts shipped for the bundled configs (so a first `grpo plan` needs no torch) are the built ones:
    # on a mismatch, regenerate pipeline/assets/model-configs/param-counts.json from _count_on_meta.
    assert count_parameters(shape, cache_dir=tmp_path / "b") == counts


def test_a_local_folder_is_read_before_the_bundled_config(tmp_path):
    config = json.loads((ROOT / "pipeline/assets/model-configs/qwen2.5-0.5b.json").read_text())
    config["num_hidden_layers"] = 2
    folder = tmp_path / "Qwen2.5-0.5B-mine"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    shape = load_shape(str(folder))
    assert shape.num_hidden_layers == 2 and "local folder" in shape.source


def test_a_folder_that_is_not_there_is_planned_by_its_name_or_refused(tmp_path):
    # not a hub repo id either (huggingface_hub refuses such a name): the bundled config by name, else one error
    assert load_shape(str(tmp_path / "gone" / "qwen2.5-0.5b")).source.startswith("bundled config")
    with pytest.raises(ConfigError) as err:
        load_shape(str(tmp_path / "gone" / "my-model"))
    assert err.value.field == "model_name_or_path"


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-14B", "meta-llama/Llama-3.1-8B", "tiny-demo"])
def test_an_unknown_model_is_one_error_naming_the_field(model):
    with pytest.raises(ConfigError) as err:
        load_shape(model)
    assert err.value.field == "model_name_or_path"


# ------------------------------------------------------------------------------------------------- cards


@pytest.mark.parametrize("name", sorted(KNOWN_CARDS))
def test_every_known_card_is_found_by_its_name_in_any_spelling(name):
    for spelling in (name, name.lower(), name.replace(" ", "-"), name.replace(" ", ""), "NVIDIA " + name):
        assert card_by_name(spelling).name == name
    card = KNOWN_CARDS[name]
    assert card.usable_gib < card.total_gib < card.memory_total_mib / 1024 <= card.nominal_gb * 1.05


def test_an_unknown_card_names_the_known_ones():
    with pytest.raises(ConfigError, match="T4, L4"):
        card_by_name("Voodoo 2")


# ------------------------------------------------------------------------------------------------ command


def run_plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_pipeline.pipeline", "plan", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**__import__("os").environ, "PATH": "/usr/bin:/bin"}, timeout=300)


def test_plan_prints_each_part_the_peak_and_the_verdict(capsys):
    code = main(["--config", str(RECIPES_DIR / "qwen2.5-1.5b-gsm8k.yaml"), "--gpu", "T4"])
    out = capsys.readouterr().out
    assert code == 0
    for part in ("weights", "lora", "gradients", "optimizer", "activations", "logprobs", "reference", "vllm",
                 "kv_need"):
        assert f"  {part} " in out
    assert "FITS on T4" in out and f"±{est.UNCERTAINTY:.0%}" in out


LONGER = ["--max_seq_length", "3072"]  # the 7B recipe at 3072 tokens does not fit a T4


def test_a_recipe_that_does_not_fit_gets_changes_that_each_fit_and_write_writes_one(tmp_path, capsys):
    target = tmp_path / "fitted.yaml"
    code = main(["--config", str(RECIPES_DIR / "qwen2.5-7b-gsm8k.yaml"), "--gpu", "T4", "--max_steps", "7", *LONGER])
    out = capsys.readouterr().out
    assert code == 1 and "DOES NOT FIT on T4" in out and "smallest changes that fit" in out
    cfg = parse_config(["--config", str(RECIPES_DIR / "qwen2.5-7b-gsm8k.yaml"), "--max_steps", "7", *LONGER])
    found = suggestions(cfg, card_by_name("T4"))
    assert found and all(s.estimate.fits for s in found)
    assert main(["--config", str(RECIPES_DIR / "qwen2.5-7b-gsm8k.yaml"), "--gpu", "T4", "--max_steps", "7", *LONGER,
                 "--write", str(target)]) == 0
    written = parse_config(["--config", str(target)])  # loadable by grpo train --config
    assert written.grpo.max_steps == 7  # the override is kept
    assert plan(written, card_by_name("T4")).fits
    assert written.to_dict() == cfg.replace(**found[0].changes).to_dict()


def test_json_output_carries_the_parts_and_the_verdict(capsys):
    assert main(["--gpu_memory_gb", "15", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["uncertainty"] == est.UNCERTAINTY and "weights" in data["parts_gib"]


@pytest.mark.parametrize("args, field", [
    (["--gpu", "Voodoo"], "gpu"),
    (["--gpu", "T4", "--gpu_memory_gb", "16"], "gpu"),
    (["--gpu"], "gpu"),
    (["--gpu", "T4", "--num_generatoins", "4"], "num_generatoins"),
    (["--gpu", "T4", "--model_name_or_path", "Qwen/Qwen2.5-14B"], "model_name_or_path"),
])
def test_bad_input_is_one_message_and_exit_2(args, field, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"`{field}`" in err


def test_without_a_gpu_or_a_card_it_asks_for_one():
    done = run_plan()  # no nvidia-smi on PATH
    assert done.returncode == 2 and "--gpu T4" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("page", ["docs/gpu.md", "README.md", "README.zh-CN.md"])
def test_the_committed_table_is_what_grpo_plan_table_prints(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    start = text.index("<!-- grpo plan --table -->") + len("<!-- grpo plan --table -->")
    committed = text[start:text.index("<!-- end of grpo plan --table -->")].strip()
    assert committed == recipe_table()


# --------------------------------------------------------------------------------------- the memory check


def test_memory_check_passes_warns_and_refuses(monkeypatch):
    monkeypatch.setattr("grpo_pipeline.pipeline.plan.cards.live_card", lambda: None)
    recipe = parse_config(["--config", str(RECIPES_DIR / "qwen2.5-7b-gsm8k.yaml")])
    assert memory_check(recipe).startswith("not estimated: no GPU")
    assert "margin +" in memory_check(recipe.replace(gpu_memory_gb=80))
    warned = memory_check(recipe.replace(gpu_memory_gb=14))  # 13.4 GiB against 13.2: a warning,
    # not a refusal
    assert warned.startswith("warning:") and "smallest change that fits" in warned
    with pytest.raises(ConfigError, match="smallest change that fits"):
        memory_check(recipe.replace(gpu_memory_gb=8))
    far = plan(recipe.replace(gpu_memory_gb=9, vllm_standby="true"), card_from_memory(9))
    assert far.blocker or far.ratio > REFUSE_RATIO


def test_train_check_lists_the_memory_check():
    from grpo_pipeline.pipeline.preflight import run_checks

    cfg = parse_config(["--config", str(RECIPES_DIR / "qwen2.5-1.5b-gsm8k.yaml"), "--gpu_memory_gb", "15"])
    names = [c.name for c in run_checks(cfg, stop_at_first=False)]
    assert names.index("memory") == names.index("model") + 1


def test_the_printed_uncertainty_covers_the_published_comparisons():
    from tests.memory_plan_figures import comparisons, largest_bounding_error

    rows = comparisons()
    assert all(row["source"] for row in rows)
    assert est.UNCERTAINTY >= largest_bounding_error(rows)


def test_the_planner_is_held_against_every_published_figure_we_have():
    """Unsloth's per-part table for Llama 3.1 8B at 20K and its 1.5B claims, verl's largest batch per Qwen2.5 size
    on one H100 (docs/perf/device_tuning.rst), EasyR1's GRPO-LoRA estimates: one row each, each with its error;
    the printed uncertainty is the largest error of the comparable rows, rounded up to 5%."""
    import math

    from tests import memory_plan_figures as figures

    rows = figures.comparisons()
    sources = [row["source"] for row in rows]
    assert sum("unsloth.ai/blog/grpo" in s for s in sources) == 4 and sum("r1-reasoning" in s for s in sources) == 2
    assert sum("device_tuning.rst" in s for s in sources) == 4 and sum("EasyR1" in s for s in sources) == 3
    assert sum("docs/gpu-reports/" in s for s in sources) == len(measured_cases())
    assert all(isinstance(row["error"], float) and (row["bounds"] or row["why_not_bound"]) for row in rows)
    assert math.isclose(est.UNCERTAINTY, math.ceil(figures.largest_bounding_error(rows) / 0.05) * 0.05)


def test_the_planner_reads_the_recipe_and_derives_its_path_widths_and_token_budget_a_rung_is_a_recipe_change():
    """What the planner derives from a recipe (estimate.py memory_path, kbit_upcast, token_budget, ...), the lengths
    as set and read when asked; and every knob's rung is a change of the recipe's own options."""
    from grpo_pipeline.pipeline.config.fields import field_names
    from grpo_pipeline.pipeline.plan.fit import KNOBS, _completion

    cfg = PipelineConfig().replace(backend="plain", load_in_4bit=True, max_seq_length=1000,
                                   max_completion_length="300", per_device_train_batch_size=8, num_generations=8,
                                   gradient_accumulation_steps=2, gpu_memory_gb=24)
    assert (est.memory_path(cfg), est.kbit_upcast(cfg), est.compute_width(cfg)) == ("plain", True, 2)
    assert "max_prompt_length auto: 256 assumed" in render(cfg, plan(cfg, card_by_name("L4")), "recipe")
    assert next(_completion(cfg)) == {"max_completion_length": "256"}  # set: the knob lowers it, not the budget
    assert est.token_budget(cfg) == (256, 300)
    assert est.planned_standby(PipelineConfig()) and not est.planned_standby(PipelineConfig().replace(
        vllm_standby="false")) and not est.planned_standby(cfg)
    for recipe in (cfg, PipelineConfig(), PipelineConfig().replace(vllm_standby="false", max_completion_length="512")):
        rungs = [changes for knob in KNOBS for changes in list(knob(recipe))[:4]]
        assert rungs and all(set(changes) <= set(field_names()) for changes in rungs)
    with pytest.raises(ConfigError, match="max_completion_length"):  # a limit that does not read as one: when read
        est.token_budget(cfg.replace(max_completion_length="many"))


def test_lora_on_lm_head_counts_its_adapter(tmp_path):
    shape = load_shape("Qwen/Qwen2.5-0.5B")
    counts = count_parameters(shape, cache_dir=tmp_path)
    assert counts.linears["lm_head"] == [896, 151936, 1]
    cfg = PipelineConfig().replace(backend="plain", lora_r=4, lora_target_modules=["lm_head"])
    assert est.adapter_parameters(cfg, counts) == 4 * (896 + 151936)


def test_write_to_an_unwritable_place_is_one_message(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["--gpu", "T4", "--write", str(blocker / "fitted.yaml")]) == 2
    assert "`write`" in capsys.readouterr().err


def test_the_gpu_check_holds_the_estimate_against_the_measured_peak():
    sys.path.insert(0, str(ROOT / "scripts" / "gpu_check"))
    import check_report

    near = check_report.planned_vs_measured({"planned_peak_gib": 2.5, "peak_vram_gib": 2.0})
    far = check_report.planned_vs_measured({"planned_peak_gib": 3.0, "peak_vram_gib": 2.0})
    assert near["holds"] is True and far["holds"] is False
    assert check_report.planned_vs_measured(None)["holds"] is None


def test_on_a_gpu_machine_the_visible_card_and_its_free_memory_are_read_with_nvidia_smi(tmp_path, monkeypatch,
                                                                                        capsys):
    """The GPU boundary stubbed: an `nvidia-smi` on PATH answering the query as the driver does (in this process;
    `python -m grpo_pipeline.pipeline plan`'s own process: test_without_a_gpu_or_a_card_it_asks_for_one)."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA L4, 23034, 12000'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.chdir(ROOT)
    code = main(["--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["card"] == "NVIDIA L4"
    assert data["total_gib"] == pytest.approx(23034 / 1024 * 0.98, abs=0.01)
    # 11.7 GiB free (another process holds the rest): what counts is the free memory, less the CUDA context
    assert data["usable_gib"] == pytest.approx(12000 / 1024 * 0.98 - CUDA_CONTEXT_GIB, abs=0.01)
    assert code == (0 if data["fits"] else 1)


# ---------------------------------------------------------------------------- the estimate against GPU peaks


def measured_cases(folder: Path = ROOT / "docs" / "gpu-reports") -> list[tuple[str, dict]]:
    """Every 4-bit benchmark case with a peak in the GPU check reports of `folder`, read here independently."""
    found = []
    for report in sorted(folder.glob("*.json")):
        data = json.loads(report.read_text(encoding="utf-8"))
        if data.get("mode") == "gpu":
            found += [(report.name, case) for case in (data.get("bench") or {}).values()
                      if case.get("peak_vram_gib") and case.get("precision") == "nf4"]
    return found


MEASURED_TOLERANCE = 0.20


def test_the_estimate_is_within_20_percent_of_every_measured_peak():
    """Each benchmark case of every committed GPU report (its backend, shape and config, as the GPU check built it):
    the planner's estimate against the peak the case allocated itself. A new report adds its cases here."""
    from tests import memory_plan_figures as figures

    cases = measured_cases()
    rows = figures.measured_rows()
    assert len(cases) >= 4 and len(rows) == len(cases)
    for (report, case), row in zip(cases, rows):
        assert row["source"].startswith(f"docs/gpu-reports/{report}") and case["backend"] in row["figure"]
        error = row["estimate_gib"] / row["published_gib"] - 1
        assert abs(error) <= MEASURED_TOLERANCE, (row["figure"], report, round(error, 3))
        assert abs(error) <= est.UNCERTAINTY  # the printed uncertainty covers the measured peaks too


def test_a_new_report_adds_its_cases_and_a_case_is_charged_only_its_own_memory(tmp_path):
    from tests import memory_plan_figures as figures

    case = {"backend": "plain", "shape": "qwen2.5-0.5b", "precision": "nf4", "completions_per_step": 8,
            "completion_length_target": 128, "peak_vram_gib": 2.0, "held_before_load_gib": 0.53125}
    report = {"mode": "gpu", "gpu": {"name": "NVIDIA L4"}, "bench": {"plain/qwen2.5-0.5b": case}}
    (tmp_path / "2027-01-01-l4.json").write_text(json.dumps(report))
    (tmp_path / "dry.json").write_text(json.dumps({**report, "mode": "dry-run"}))  # a CPU dry run proves nothing
    rows = figures.measured_rows(tmp_path)
    assert len(rows) == 1 and "NVIDIA L4" in rows[0]["figure"]
    # 0.53125 GiB was held before the model loaded: the 32 MiB cuBLAS workspace (the case uses it; the planner counts
    # it) and 0.5 GiB an earlier case left behind (not this case's)
    assert rows[0]["published_gib"] == pytest.approx(1.5)
    values = {**figures.case_values("plain", "qwen2.5-0.5b"),
              "max_prompt_length": str(figures.measured_prompt_limit("qwen2.5-0.5b"))}
    assert rows[0]["estimate_gib"] == pytest.approx(plan(figures._cfg(values),
                                                         card_from_memory(80)).peak_gib)
    assert figures.measured_prompt_limit("qwen2.5-0.5b") % 16 == 0  # the auto limit, rounded up to 16
    # a report that records the prompt limit its data resolved to is planned with it
    (tmp_path / "2027-01-01-l4.json").write_text(json.dumps(
        {**report, "bench": {"plain/qwen2.5-0.5b": {**case, "prompt_limit": 256}}}))
    longer = plan(figures._cfg({**values, "max_prompt_length": "256"}),
                  card_from_memory(80)).peak_gib
    assert figures.measured_rows(tmp_path)[0]["estimate_gib"] == pytest.approx(longer) != rows[0]["estimate_gib"]

