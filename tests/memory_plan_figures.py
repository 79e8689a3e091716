"""Every published GRPO memory figure we can cite, and the memory planner's estimate for each (the comparisons
tests/test_plan.py holds within the planner's printed uncertainty; bench/memory_plan.py prints them as a table):
Unsloth's per-part table for Llama 3.1 8B at 20K context and its Qwen2.5-1.5B claims, verl's largest batch per
Qwen2.5 size on one H100, EasyR1's GRPO-LoRA hardware estimates.

Each row: the published figure, its source, the settings behind it (and which of them we had to assume), the
planner's estimate for the same settings, and the error. The rows marked `bounds` set the planner's printed
uncertainty (pipeline/plan/estimate.py UNCERTAINTY must be at least their largest error). Every GPU check report
(docs/gpu-reports/*.json, scripts/gpu_check) adds its benchmark cases' measured peaks: the planner's estimate for the
case's own config (scripts/gpu_check/benchmark.py bench_values, with the prompt limit the pipeline's data preparation
measures for it) against the peak VRAM the case itself allocated. Those rows bound the uncertainty too, so a new
report adds rows without edits.

Published "GB" are read as 10^9 bytes and converted to GiB. Not a test module.
"""

from __future__ import annotations

import json
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.pipeline.config import PipelineConfig, from_mapping
from grpo_pipeline.pipeline.plan.cards import GIB, card_from_memory
from grpo_pipeline.pipeline.plan.estimate import estimate
from grpo_pipeline.pipeline.plan.shape import count_parameters, load_shape, shape_from_config

ROOT = Path(__file__).resolve().parents[1]
GPU_REPORTS = ROOT / "docs" / "gpu-reports"

GB = 1e9
UNSLOTH_GRPO_BLOG = "unsloth.ai/blog/grpo (Feb 20 2025), 'GRPO VRAM Breakdown' table"
UNSLOTH_R1_BLOG = "unsloth.ai/blog/r1-reasoning (Feb 6 2025) and its Feb 20 update"
# The blog's loss figure is the Feb 2025 loss: fp32 logits of a quarter of each row at a time. unsloth_zoo 2026.10.9,
# which the planner models, projects the flattened tokens in chunks sized to ~2 GiB at 8 bytes a logit
# (fused_losses/chunked_logprob.py chunked_logprob_rows); the H200 reports measure that (0.43-0.45 GiB over the
# weights at both Qwen2.5 shapes, where the per-row rule gives 0.04).
OLD_UNSLOTH_LOSS = ("the Feb 2025 Unsloth loss; 2026.10.9 sizes its log-prob chunks by bytes, not by row, as the "
                    "measured H200 peaks confirm")

# Llama 3.1 8B's config.json (meta-llama/Llama-3.1-8B): built on the meta device like any other model.
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "tie_word_embeddings": False, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
    "mlp_bias": False,
}

# The blog's 20K-context run: 8 generations, 20K tokens each, QLoRA with Unsloth's defaults. The prompt/completion
# split, the LoRA rank and the standby setting are not published: assumed below.
LLAMA_20K = dict(
    model_name_or_path="meta-llama/Llama-3.1-8B-Instruct", max_seq_length=20480, max_prompt_length="512",
    max_completion_length="19488", num_generations=8, per_device_train_batch_size=8, lora_r=32, lora_alpha=32,
    load_in_4bit=True, optim="adamw_8bit", vllm_standby="false", gpu_memory_utilization="0.6",
)
# The Feb 2025 Unsloth GRPO notebook's settings (copied into many public repos): 6 generations (Unsloth then
# set the batch to the group), prompt 256 + completion 200, LoRA r 64, 4-bit, gpu_memory_utilization 0.5, no
# standby (added Sept 2025), paged 8-bit AdamW. Which settings the "7 GB" and "5 GB" claims used is not published.
QWEN_NOTEBOOK = dict(
    model_name_or_path="unsloth/Qwen2.5-1.5B-Instruct", max_seq_length=1024, max_prompt_length="256",
    max_completion_length="200", num_generations=6, per_device_train_batch_size=6, lora_r=64, lora_alpha=64,
    load_in_4bit=True, optim="paged_adamw_8bit", vllm_standby="false", gpu_memory_utilization="0.5",
)


# volcengine/verl docs/perf/device_tuning.rst, its GRPO-LoRA rows: the largest batch ("MaxBatch") per Qwen2.5 size on
# one H100 80 GB, vLLM 0.8.3 rollouts, FSDP training in 16-bit (verl has no QLoRA).
VERL_DEVICE_TUNING = "volcengine/verl docs/perf/device_tuning.rst (GRPO-LoRA, 1x H100, vLLM 0.8.3)"
VERL_MAX_BATCH = {"0.5B": 116, "1.5B": 128, "3B": 62, "7B": 16}
# hiyouga/EasyR1 README.md's hardware table ("estimated"): GRPO with LoRA, 16-bit weights, vLLM rollouts.
EASYR1_README = "hiyouga/EasyR1 README.md hardware table (GRPO LoRA, marked 'estimated')"
EASYR1_GRPO_LORA = {"1.5B": (1, 12.0), "3B": (1, 24.0), "7B": (2, 32.0)}  # (GPUs, GB each)
# Neither publishes the settings behind its figure here (prompt/response lengths, group size, vLLM share, the
# micro-batch); ours, assumed for both: a GSM8K-length row (512 + 1024 tokens), LoRA rank 32 (verl's GSM8K
# GRPO-LoRA baselines, docs/algo/baseline.md), 16-bit weights and a colocated vLLM holding 0.6 of the card.
SIXTEEN_BIT_LORA = dict(
    backend="plain", vllm_mode="colocate", load_in_4bit=False, dtype="bfloat16", max_seq_length=1536,
    max_prompt_length="512", max_completion_length="1024", num_generations=4, per_device_train_batch_size=4,
    lora_r=32, lora_alpha=32, optim="adamw_torch", gpu_memory_utilization="0.6",
)


def largest_batch(values: dict[str, Any], card_gib: float) -> int:
    """The largest per_device_train_batch_size (a multiple of the group) the planner fits on `card_gib`."""
    cfg = _cfg(values)
    shape = load_shape(cfg.model.model_name_or_path)
    counts, card, group = count_parameters(shape), card_from_memory(card_gib), cfg.grpo.num_generations
    low, high = 0, 4096 // group  # in groups
    while low < high:
        middle = (low + high + 1) // 2
        if estimate(cfg.replace(per_device_train_batch_size=middle * group), shape, counts, card).fits:
            low = middle
        else:
            high = middle - 1
    return low * group


def _cfg(values: dict[str, Any]) -> PipelineConfig:
    return from_mapping(values)


def _llama_estimate():
    shape = shape_from_config(LLAMA_31_8B, "Llama 3.1 8B", "tests/memory_plan_figures.py LLAMA_31_8B")
    return shape, estimate(_cfg(LLAMA_20K), shape, count_parameters(shape), card_from_memory(80.0))


def smallest_card_gib(values: dict[str, Any]) -> float:
    """The smallest GPU (memory.total, GiB) on which the planner says the recipe fits: bisection."""
    cfg = _cfg(values)
    shape = load_shape(cfg.model.model_name_or_path)
    counts = count_parameters(shape)
    low, high = 1.0, 200.0
    for _ in range(40):
        middle = (low + high) / 2
        if estimate(cfg, shape, counts, card_from_memory(middle)).fits:
            high = middle
        else:
            low = middle
    return high


def _gpu_check():
    """scripts/gpu_check's benchmark module (the kit imports its modules by their bare names)."""
    sys.path.insert(0, str(ROOT / "scripts" / "gpu_check"))
    import benchmark

    return benchmark


def case_values(backend: str, shape: str) -> dict[str, Any]:
    """A GPU check benchmark case's config, as scripts/gpu_check/benchmark.py builds it on a GPU (4-bit)."""
    kit = _gpu_check()
    folder = Path(tempfile.gettempdir()) / "gpu-check-work"
    return kit.bench_values(backend, str(folder / "models" / shape), kit.run_params(False), folder / "bench",
                            cuda=True)


@lru_cache(maxsize=None)
def measured_prompt_limit(shape: str) -> int:
    """The prompt limit `max_prompt_length: auto` resolves to for a benchmark case's data (the bundled sample, as
    the case trains on it), for the reports that predate the case's own `prompt_limit`: the pipeline's own data
    preparation with the bundled Qwen2.5 tokenizer."""
    from grpo_pipeline.pipeline.assets import load_qwen_tokenizer
    from grpo_pipeline.pipeline.data.prepare import prepare_dataset

    with tempfile.TemporaryDirectory() as cache:
        cfg = _cfg({**case_values("plain", shape), "data_cache_dir": cache})
        return prepare_dataset(cfg, load_qwen_tokenizer(), write_report=False).max_prompt_length


def measured_rows(folder: Path = GPU_REPORTS) -> list[dict[str, Any]]:
    """One row per measured benchmark case of every GPU report in `folder`: the planner against the case's peak."""
    rows = []
    for report in sorted(folder.glob("*.json")):
        data = json.loads(report.read_text(encoding="utf-8"))
        if data.get("mode") != "gpu":
            continue
        for case in (data.get("bench") or {}).values():
            if not case.get("peak_vram_gib") or case.get("precision") != "nf4":
                continue
            prompt = case.get("prompt_limit") or measured_prompt_limit(case["shape"])
            values = {**case_values(case["backend"], case["shape"]), "max_prompt_length": str(prompt)}
            planned = estimate(*_shape_and_counts(values), card_from_memory(80.0)).peak_gib
            held = case.get("held_before_load_gib") or 0.0
            rows.append({
                "figure": f"measured peak VRAM, {case['backend']} {case['shape']} 4-bit GRPO, "
                          f"{case['completions_per_step']} x {case['completion_length_target']} tokens "
                          f"({data['gpu']['name']})",
                "published_gib": _gpu_check().case_peak_gib(case), "estimate_gib": planned, "bounds": True,
                "source": f"docs/gpu-reports/{report.name}" + (
                    f" (peak {case['peak_vram_gib']:.3f} GiB, {held:.3f} of it held before the case: the cuBLAS "
                    "workspace counts, the rest was an earlier case's)" if held else ""),
                "label": "measured",
            })
    return rows


def _shape_and_counts(values: dict[str, Any]):
    cfg = _cfg(values)
    shape = load_shape(cfg.model.model_name_or_path)
    return cfg, shape, count_parameters(shape)


def comparisons() -> list[dict[str, Any]]:
    shape, llama = _llama_estimate()
    one_sequence_kv = 20000 * shape.kv_bytes_per_token / GIB
    published_parts = {"activations": 42.0, "logprobs": 9.8}
    rows = [
        {"figure": "Unsloth GRPO 'training memory' (activations), Llama 3.1 8B, 8 x 20K tokens",
         "published_gib": published_parts["activations"] * GB / GIB, "estimate_gib": llama.part("activations"),
         "source": UNSLOTH_GRPO_BLOG, "bounds": True,
         # The blog's 42 GB equals all 32 layer inputs of 8 x 20K tokens in bf16 (41.9 GB). The planner assumes
         # Unsloth's offloaded checkpointing keeps them in CPU RAM; its "smart" variant keeps some on the GPU when
         # memory allows (unsloth_zoo/gradient_checkpointing.py), so this row bounds the error too.
         },
        {"figure": "Unsloth GRPO loss memory, Llama 3.1 8B, 8 x 20K tokens",
         "published_gib": published_parts["logprobs"] * GB / GIB, "estimate_gib": llama.part("logprobs"),
         "source": UNSLOTH_GRPO_BLOG, "bounds": False, "why_not_bound": OLD_UNSLOTH_LOSS},
        {"figure": "vLLM KV cache for 20K context, Llama 3.1 8B (one sequence)",
         "published_gib": 2.5 * GB / GIB, "estimate_gib": one_sequence_kv,
         "source": UNSLOTH_GRPO_BLOG, "bounds": True},
        {"figure": "Unsloth GRPO total (training + loss + KV, weights not counted), Llama 3.1 8B, 20K",
         "published_gib": 54.3 * GB / GIB,
         "estimate_gib": llama.part("activations") + llama.part("logprobs") + one_sequence_kv,
         "source": UNSLOTH_GRPO_BLOG, "bounds": False, "why_not_bound": "it holds the loss row's figure: "
                                                                       + OLD_UNSLOTH_LOSS},
        {"figure": "smallest GPU for Qwen2.5-1.5B GRPO (Unsloth notebook settings), vs 'just 5 GB VRAM'",
         "published_gib": 5.0 * GB / GIB, "estimate_gib": smallest_card_gib(QWEN_NOTEBOOK),
         "source": UNSLOTH_R1_BLOG, "bounds": True},
        {"figure": "smallest GPU for Qwen2.5-1.5B GRPO (Unsloth notebook settings), vs 'minimum 7 GB VRAM'",
         "published_gib": 7.0 * GB / GIB, "estimate_gib": smallest_card_gib(QWEN_NOTEBOOK),
         "source": UNSLOTH_R1_BLOG + " (before Unsloth's Feb 20 efficient GRPO loss, which this planner models)",
         "bounds": False, "why_not_bound": "an older Unsloth than the one the planner models"},
    ]
    h100_gib = 80 * GB / GIB
    for size, published in VERL_MAX_BATCH.items():
        values = {**SIXTEEN_BIT_LORA, "model_name_or_path": f"Qwen/Qwen2.5-{size}-Instruct"}
        rows.append({"figure": f"largest batch of Qwen2.5-{size} GRPO-LoRA on one H100 80 GB (verl MaxBatch)",
                     "published": published, "estimate": largest_batch(values, h100_gib), "unit": "rows",
                     "source": VERL_DEVICE_TUNING,
                     # Only the 0.5B row is left out: its 116 is below the 1.5B's 128, which no memory limit gives
                     # under one setting (a smaller model fits more rows), so some other limit set it. The other
                     # three count, on settings assumed (SIXTEEN_BIT_LORA's): the sources do not give them.
                     "bounds": size != "0.5B",
                     "why_not_bound": "not one memory limit: the 0.5B's 116 is below the 1.5B's 128, which no "
                                      "memory model gives under one setting"})
    for size, (gpus, published) in EASYR1_GRPO_LORA.items():
        values = {**SIXTEEN_BIT_LORA, "model_name_or_path": f"Qwen/Qwen2.5-{size}-Instruct"}
        rows.append({"figure": f"smallest GPU for Qwen2.5-{size} GRPO LoRA, vs EasyR1's {gpus} x {published:.0f} GB",
                     "published_gib": published * GB / GIB, "estimate_gib": smallest_card_gib(values),
                     "source": EASYR1_README + "; settings assumed (SIXTEEN_BIT_LORA)", "bounds": gpus == 1,
                     "why_not_bound": "" if gpus == 1 else f"{gpus} GPUs sharding the model (FSDP); the planner "
                                                           "plans one GPU holding all of it"})
    rows += measured_rows()
    for row in rows:
        row.setdefault("published", row.get("published_gib"))
        row.setdefault("estimate", row.get("estimate_gib"))
        row.setdefault("unit", "GiB")
        row["error"] = row["estimate"] / row["published"] - 1
    return rows


def largest_bounding_error(rows: Optional[list[dict[str, Any]]] = None) -> float:
    return max(abs(row["error"]) for row in (rows or comparisons()) if row["bounds"])
