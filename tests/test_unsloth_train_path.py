"""`run_training` on the unsloth backend, against the recording fake: the order and kwargs of the GPU calls.

Real Unsloth rebinds `trl.GRPOTrainer`/`trl.GRPOConfig` to its patched classes when imported
(unsloth/models/rl.py `_patch_trl_rl_trainers_impl`); this test does the same with recording
stand-ins (the config one bound to the field set of Unsloth's generated UnslothGRPOConfig),
so it checks what the pipeline hands Unsloth's trainer. Data, rewards, health and the
save/verify/manifest path are the real ones. Nothing here shows that Unsloth or vLLM run: that needs a GPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tests.fake_unsloth as fake_unsloth
from grpo_pipeline.pipeline.backends import BackendChoice, gpu_settings
from grpo_pipeline.pipeline.backends import unsloth_setup
from grpo_pipeline.pipeline.config import PipelineConfig
from grpo_pipeline.pipeline.train import run_training

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*Unsloth should be imported before.*:UserWarning",
    "ignore:Unsloth must be imported before.*:UserWarning",
)


class RecordingGRPOTrainer:
    """Stands in for UnslothGRPOTrainer: records construction and train() in the fake's call log, and does
    what the real one does with the model's vLLM engine (below)."""

    def __init__(self, **kwargs):
        fake_unsloth._record("GRPOTrainer.__init__", **kwargs)
        fake_unsloth.check_trainer_precision(kwargs["model"], kwargs["args"])  # raises as Unsloth's trainer does
        if kwargs["args"].use_vllm and not hasattr(kwargs["model"], "vllm_engine"):
            # Unsloth's patched _init_vllm (rl_replacements.py replace_llm_block) reuses model.vllm_engine only
            # when it exists; otherwise TRL's own block builds a second vLLM LLM on the same GPU.
            raise RuntimeError("use_vllm=True on a model without vllm_engine: a second vLLM engine would be built")
        fake_unsloth.unsloth_trainer_init_reference(kwargs["model"], kwargs["args"].beta)  # as the patched __init__
        self.ref_model = None
        self.model = kwargs["model"]
        self.args = kwargs["args"]
        self.callbacks = list(kwargs.get("callbacks") or [])
        self.reward_funcs = list(kwargs["reward_funcs"])  # TRL's attribute (it appends environments' get_reward)
        self.state = type("State", (), {"global_step": 0})()
        self.beta = self.args.beta

    def add_callback(self, callback):
        self.callbacks.append(callback)

    def _save_checkpoint(self, model, trial):  # transformers Trainer's (checkpoints are staged around it)
        raise AssertionError("this stand-in's train() saves no checkpoint")

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):  # transformers Trainer's (wrapped too)
        raise AssertionError("this stand-in's train() loads no checkpoint")

    def _load_optimizer_and_scheduler(self, checkpoint):  # transformers Trainer's (wrapped too)
        raise AssertionError("this stand-in's train() loads no optimizer or scheduler")

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # TRL's (wrapped too)
        raise AssertionError("this stand-in's train() scores no completion")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # TRL's (wrapped too)
        raise AssertionError("this stand-in's train() computes no loss")

    def remove_callback(self, callback):
        self.callbacks = [c for c in self.callbacks if c is not callback and type(c) is not callback]

    def train(self, resume_from_checkpoint=None):
        fake_unsloth._record("GRPOTrainer.train", resume_from_checkpoint=resume_from_checkpoint)
        if self.args.use_vllm:
            # Every rollout sends the live LoRA to vLLM under a RELATIVE folder name, as the real trainer does:
            # the VLLMGeneration.generate wrapper (rl_replacements.py, lora_name) and the rl.py rewrite.
            suffix = "_" + os.environ["CUDA_VISIBLE_DEVICES"].replace(",", "") \
                if "CUDA_VISIBLE_DEVICES" in os.environ else ""
            self.model.load_lora("vllm_gen_lora" + suffix, load_tensors=True)
            self.model.load_lora("grpo_trainer_lora_model" + suffix, load_tensors=True)
        report_to = self.args.report_to
        if "tensorboard" in ([report_to] if isinstance(report_to, str) else report_to):
            self.args.to_json_string()  # transformers' TensorBoardCallback.on_train_begin logs the args
        # The pipeline reads it (summary.json); since this stand-in sets it itself, no test asserts on it.
        self.state.global_step = self.args.max_steps


def install_recording_unsloth(monkeypatch, vllm_installed: bool = True):
    """The fake unsloth (and vllm, if installed), trl's trainer/config rebound to recorders, a clean standby
    variable, and from_pretrained handing back the tiny demo's real tokenizer. Returns (handle, tokenizer)."""
    import trl

    from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer

    # Rebind trl's classes first: touching them with the fake vllm installed would import TRL's vLLM glue.
    # The config is the fake's UnslothGRPOConfig: only the fields of the class Unsloth generates.
    monkeypatch.setattr(trl, "GRPOTrainer", RecordingGRPOTrainer)
    monkeypatch.setattr(trl, "GRPOConfig", fake_unsloth.UnslothGRPOConfig)
    monkeypatch.delenv("UNSLOTH_VLLM_STANDBY", raising=False)
    monkeypatch.setattr(unsloth_setup, "_prepared", None)
    handle = fake_unsloth.install(vllm_installed=vllm_installed)
    # Unsloth returns the model's real tokenizer; the fake's is a stub, so hand back the demo's.
    original = fake_unsloth.FastLanguageModel.from_pretrained
    real_tokenizer = load_tokenizer("tiny-demo")

    def from_pretrained(*args, **kwargs):
        model, _ = original(*args, **kwargs)
        return model, real_tokenizer

    monkeypatch.setattr(fake_unsloth.FastLanguageModel, "from_pretrained", staticmethod(from_pretrained))
    return handle, real_tokenizer


@pytest.fixture
def run_unsloth(monkeypatch, tmp_path):
    """run_training on the unsloth backend against the fake (a 22.5 GiB GPU); returns (RunResult, fake module)."""
    monkeypatch.setattr("grpo_pipeline.pipeline.backends.cuda_available", lambda: True)
    monkeypatch.setattr(gpu_settings, "gpu_total_gib", lambda device=0: 22.5)
    handle, _ = install_recording_unsloth(monkeypatch)

    def run(**overrides):
        cfg = PipelineConfig().replace(**{
            "model_name_or_path": "tiny-demo", "dataset_name": "demo-arithmetic", "max_samples": 16,
            "max_seq_length": 256, "max_completion_length": "64", "num_generations": 4,
            "per_device_train_batch_size": 4, "max_steps": 5, "lora_r": 16, "lora_alpha": 16,
            "output_dir": str(tmp_path / "run"), "vllm_standby": "true", "eval_before": False,
            "eval_after": False, "vllm_sampling_params": {"min_p": 0.1, "stop": ["</answer>"]}, **overrides})
        return run_training(cfg, choice=BackendChoice("unsloth", "test")), fake_unsloth

    yield run
    handle.uninstall()


@pytest.fixture
def unsloth_run(run_unsloth):
    return run_unsloth()


def test_gpu_calls_happen_in_order(unsloth_run):
    result, fake = unsloth_run
    assert result.status == "completed"
    (train,) = fake.calls_named("GRPOTrainer.train")
    assert train.kwargs == {"resume_from_checkpoint": None}  # a fresh run, trained once
    (init,) = fake.calls_named("GRPOTrainer.__init__")
    assert init.kwargs["args"].kwargs["max_steps"] == 5  # what the pipeline asked Unsloth's trainer for
    names = [c.name for c in fake.record_calls()]
    order = ["FastLanguageModel.from_pretrained", "FastLanguageModel.get_peft_model", "GRPOTrainer.__init__",
             "GRPOTrainer.train", "model.save_lora"]
    positions = [names.index(name) for name in order]
    assert positions == sorted(positions), names
    state = fake.import_state()
    assert state["UNSLOTH_VLLM_STANDBY"] == "1"  # set before `import unsloth`


def test_trainer_gets_the_lora_model_and_no_peft_config(unsloth_run):
    result, fake = unsloth_run
    (init,) = fake.calls_named("GRPOTrainer.__init__")
    assert init.kwargs["peft_config"] is None  # Unsloth's trainer would silently ignore one
    assert isinstance(init.kwargs["model"], fake.FakePeftModel)  # get_peft_model's result
    args = init.kwargs["args"].kwargs
    assert args["use_vllm"] is True and args["max_completion_length"] == 64
    assert args["vllm_sampling_params"]._set_kwargs == {"min_p": 0.1, "stop": ["</answer>"]}
    assert args["reward_weights"][-1] == 0.0  # the health observer never changes the reward
    assert [f.__name__ for f in init.kwargs["reward_funcs"]][-1] == "health"


def test_adapter_saved_to_absolute_temp_then_verified_with_manifest(unsloth_run):
    result, fake = unsloth_run
    (save,) = fake.calls_named("model.save_lora")
    saved_to = Path(save.args[0])
    assert saved_to.is_absolute() and saved_to.parent == result.output_dir
    assert saved_to.name.startswith(".lora.tmp-") and not saved_to.exists()  # renamed into place
    assert (result.output_dir / "lora" / "adapter_config.json").is_file()
    manifest = json.loads((result.output_dir / "manifest.json").read_text())
    assert manifest["backend"] == "unsloth" and manifest["max_completion_length"] == 64


def test_report_to_tensorboard_with_vllm_sampling_params_trains(run_unsloth):
    result, fake = run_unsloth(report_to="tensorboard")
    assert result.status == "completed"
    (init,) = fake.calls_named("GRPOTrainer.__init__")
    args = init.kwargs["args"]
    assert args.kwargs["report_to"] == ["tensorboard"] and args.kwargs["vllm_sampling_params"]
    assert json.loads(args.to_json_string())["vllm_sampling_params"] == {"min_p": 0.1, "stop": ["</answer>"]}
    assert (result.output_dir / "lora" / "adapter_config.json").is_file()


def test_training_on_unsloth_with_vllm_writes_nothing_into_the_working_directory(run_unsloth, monkeypatch, tmp_path):
    """Unsloth's compile cache (./unsloth_compiled_cache) and its rollouts' live LoRA folders (vllm_gen_lora*,
    <trainer>_lora_model) default to the cwd; a read-only or shared cwd then fails at the first rollout."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("UNSLOTH_COMPILE_LOCATION", raising=False)  # as on a user's machine
    monkeypatch.setenv("GRPO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    result, fake = run_unsloth(eval_before=True, eval_limit=2)
    assert result.status == "completed"
    assert sorted(p.name for p in cwd.iterdir()) == []
    assert fake.STATE.compile_location == str(tmp_path / "cache" / "unsloth_compiled_cache")
    assert (tmp_path / "cache" / "unsloth_compiled_cache").is_dir()
    live = result.output_dir / ".vllm_live_lora"
    assert {p.name for p in live.iterdir() if p.is_dir()} == {"vllm_gen_lora_0", "grpo_trainer_lora_model_0"}
    paths = [Path(c.args[1]) for c in fake.calls_named("unsloth_zoo.load_lora")]
    assert paths and all(p.is_absolute() and live in p.parents or p == live for p in paths)


def test_an_exported_unsloth_compile_location_is_kept(run_unsloth, monkeypatch, tmp_path):
    monkeypatch.setenv("UNSLOTH_COMPILE_LOCATION", str(tmp_path / "mine"))
    result, fake = run_unsloth()
    assert fake.STATE.compile_location == str(tmp_path / "mine")


def test_when_unsloth_turns_vllm_off_the_run_trains_without_vllm_and_says_so(run_unsloth, recwarn):
    fake_unsloth.STATE.vllm_usable = False  # as below compute capability 7, on DGX Spark, vllm not importable
    result, fake = run_unsloth(vllm_sampling_params=None, eval_before=True, eval_after=True, eval_limit=2)
    assert result.status == "completed"
    (init,) = fake.calls_named("GRPOTrainer.__init__")  # the double raises on use_vllm without an engine
    args = init.kwargs["args"].kwargs
    assert args["use_vllm"] is False and not [key for key in args if key.startswith("vllm")]
    assert len(fake.calls_named("model.generate")) == 2  # eval before and after through transformers
    assert fake.calls_named("unsloth_zoo.load_lora") == [] and fake.calls_named("model.fast_generate") == []
    said = [str(w.message) for w in recwarn if "without a vLLM engine" in str(w.message)]
    assert len(said) == 1, said  # once, not per call


# ------------------------------------------------------------------------------ fast_inference: false, end to end


@pytest.fixture
def no_vllm_run(monkeypatch, tmp_path):
    """`grpo train` on Unsloth without vLLM, eval before and after, against the fake (no vllm installed)."""
    import importlib.util

    from grpo_pipeline.pipeline import backends

    monkeypatch.setattr(backends, "cuda_available", lambda: True)
    handle, real_tokenizer = install_recording_unsloth(monkeypatch, vllm_installed=False)
    real_find_spec = importlib.util.find_spec
    # This machine has unsloth (the fake) but no vllm: backend auto must pick Unsloth without vLLM.
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))
    cfg = PipelineConfig().replace(
        model_name_or_path="tiny-demo", dataset_name="demo-arithmetic", max_samples=16, max_seq_length=256,
        max_completion_length="64", num_generations=4, per_device_train_batch_size=4, max_steps=3,
        lora_r=16, lora_alpha=16, output_dir=str(tmp_path / "run"), eval_before=True, eval_after=True,
        eval_limit=3)
    result = run_training(cfg)  # backend auto
    yield result, fake_unsloth, real_tokenizer
    handle.uninstall()


def test_no_vllm_trains_saves_and_evaluates_through_unsloth(no_vllm_run):
    result, fake, _ = no_vllm_run
    assert result.status == "completed"
    (load,) = fake.calls_named("FastLanguageModel.from_pretrained")
    assert load.kwargs["fast_inference"] is False and "gpu_memory_utilization" not in load.kwargs
    (init,) = fake.calls_named("GRPOTrainer.__init__")
    args = init.kwargs["args"].kwargs
    assert args["use_vllm"] is False
    assert not [key for key in args if key.startswith("vllm")]  # no vLLM field reaches Unsloth's trainer
    names = [c.name for c in fake.record_calls()]
    # eval before and after both went through for_inference + generate, around training
    first_gen, last_gen, train = names.index("model.generate"), len(names) - 1 - names[::-1].index(
        "model.generate"), names.index("GRPOTrainer.train")
    assert first_gen < train < last_gen and names.index("model.save_lora") < last_gen
    assert all(c.kwargs["for_inference"] for c in fake.calls_named("model.generate"))
    manifest = json.loads((result.output_dir / "manifest.json").read_text())
    assert manifest["backend"] == "unsloth" and manifest["config"]["fast_inference"] is False
    summary = json.loads((result.output_dir / "summary.json").read_text())
    assert summary["eval_before"]["n"] == summary["eval_after"]["n"] == 3
    assert len(fake.calls_named("model.generate")) == 2  # one batch of 3 held-out prompts, before and after


def test_no_vllm_generate_and_export_use_the_saved_adapter(no_vllm_run, capsys, tmp_path, recwarn):
    from grpo_pipeline.pipeline.infer import export, generate

    result, fake, tokenizer = no_vllm_run
    fake.STATE.calls.clear()
    lora = result.output_dir / "lora"
    # The adapter names its built-in base by name (not its cache folder), so generate/export of it with that
    # base raise no "other base" warning (checked at the end).
    assert json.loads((lora / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-demo"
    assert generate.main(["--lora", str(lora), "--prompt", "What is 2 + 3?", "--backend", "unsloth"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (load,) = fake.calls_named("FastLanguageModel.from_pretrained")
    # Unsloth loads the base adapter_config.json names: for a built-in base, a view of lora/ naming its folder
    # (pipeline/backends/unsloth.py unsloth_adapter_folder), gone once loaded.
    view = Path(load.kwargs["model_name"])
    assert view.name == "lora" and view.parent.name.startswith(".adapter-view-") and not view.exists()
    assert load.kwargs["fast_inference"] is False
    assert fake.calls_named("unsloth_zoo.load_lora") == []
    (gen,) = fake.calls_named("model.generate")
    assert gen.kwargs["for_inference"] is True
    new_tokens = gen.kwargs["max_new_tokens"]
    assert new_tokens == 64  # the trained max_completion_length, from the manifest
    token = fake.fake_generated_token(int(gen.kwargs["attention_mask"][0].sum()), with_adapter=True)
    assert record["text"] == tokenizer.decode([token] * 2, skip_special_tokens=True)
    assert record["adapter"] == str(lora)
    # vLLM's LoRA slot limit does not apply without vLLM: an r=16 adapter is not refused for max_lora_rank 8.
    assert generate.main(["--lora", str(lora), "--prompt", "1 + 1?", "--backend", "unsloth",
                          "--max_lora_rank", "8"]) == 0

    out = tmp_path / "merged"
    assert export.main(["--lora", str(lora), "--to", "merged16", "--out", str(out), "--backend", "unsloth"]) == 0
    (merge,) = fake.calls_named("model.save_pretrained_merged")
    assert merge.kwargs["save_method"] == "merged_16bit" and (out / "config.json").is_file()
    assert not [str(w.message) for w in recwarn if "produces garbage" in str(w.message)]


def test_the_default_gpu_recipe_records_what_unsloth_changed_as_check_predicted(run_unsloth, capsys):
    """effective_config.json on the unsloth backend (through the strict double): every field as the trainer got it,
    the fields Unsloth's config class changed printed one per line, the same lines `--check` predicts."""
    import yaml

    from grpo_pipeline.pipeline.bootstrap import DEFAULT_GPU_RECIPE
    from grpo_pipeline.pipeline.trainer.build import check_effective_config

    recipe = yaml.safe_load(DEFAULT_GPU_RECIPE.read_text())
    kept = {k: v for k, v in recipe.items() if k in PipelineConfig().grpo.__dataclass_fields__
            and k not in ("output_dir", "max_steps", "optim")}  # optim: adamw_8bit needs bitsandbytes
    result, fake = run_unsloth(**kept, vllm_sampling_params=None)
    assert result.status == "completed"
    record = json.loads((result.output_dir / "effective_config.json").read_text())
    (init,) = fake.calls_named("GRPOTrainer.__init__")
    assert set(record["fields"]) == set(init.kwargs["args"].to_dict())  # every field of the config it got
    printed = [line.split("effective config: ", 1)[1] for line in capsys.readouterr().out.splitlines()
               if "effective config: " in line]
    assert printed == record["changed"] and printed
    by_unsloth = [line for line in printed if "unsloth/models/" in line]  # the config class's, not the device's
    cfg = PipelineConfig().replace(**{**kept, "model_name_or_path": "tiny-demo", "max_completion_length": "64"})
    message = check_effective_config("unsloth", cfg)
    assert by_unsloth and all(line in message for line in by_unsloth)
    assert record["fields"]["top_k"]["value"] == -1 and record["fields"]["top_k"]["other_backend"] == 0


BASE_REFERENCE = "the base model before any warm-up (adapters disabled)"


@pytest.fixture
def plain_reference_after_warmup(tmp_path):
    """The plain backend, the same recipe (a format warm-up, then beta > 0): TRL's real GRPOTrainer built on the
    warmed PeftModel (no GRPO step). Returns the reference it measures kl against, checked on the logits."""
    import torch
    from trl.trainer.grpo_trainer import use_adapter

    from grpo_pipeline.pipeline.backends import plain
    from grpo_pipeline.pipeline.data.prepare import prepare_dataset
    from grpo_pipeline.pipeline.health.rollback import kl_reference
    from grpo_pipeline.pipeline.data.run_data import warmup_examples
    from grpo_pipeline.pipeline.trainer.agents import resolve_agents
    from grpo_pipeline.pipeline.trainer.build import build_trainer
    from grpo_pipeline.pipeline.trainer.warmup import run_format_warmup
    from tests.train_helpers import demo_config

    cfg = demo_config(tmp_path / "plain", sft_warmup_steps=2, beta=0.04, sft_learning_rate=0.05)
    out = Path(cfg.grpo.output_dir)
    out.mkdir(parents=True)
    model, tokenizer = plain.load_for_training(cfg)
    prepared = prepare_dataset(cfg, tokenizer, report_dir=out)
    model = run_format_warmup(model, tokenizer, cfg, prepared, warmup_examples(cfg, prepared),
                              resolve_agents(cfg.grpo).tools, plain.peft_config(cfg), out, reuse=False)
    trainer, _ = build_trainer(resolve_agents(cfg.grpo), plain, cfg,
                               model, tokenizer, prepared, None, out)
    rebuilt, _ = build_trainer(resolve_agents(cfg.grpo), plain, cfg,
                               trainer.model, tokenizer, prepared, None, out, rollbacks_done=1)
    ids = torch.tensor([tokenizer("What is 7 + 5?")["input_ids"]])
    base = plain.load_model("tiny-demo", cfg, for_training=False)
    with torch.no_grad():
        with use_adapter(rebuilt.model, adapter_name="ref" if "ref" in rebuilt.model.peft_config else None):
            reference = rebuilt.model(input_ids=ids).logits  # as GRPOTrainer._generate_and_score_completions
        warmed = rebuilt.model(input_ids=ids).logits
        assert torch.allclose(reference, base(input_ids=ids).logits, atol=1e-5)  # the base model's
        assert not torch.allclose(reference, warmed, atol=1e-3)  # not the warmed adapter's
    assert kl_reference(trainer) == kl_reference(rebuilt)  # a rollback does not move it
    return kl_reference(rebuilt)


def test_one_kl_reference_after_a_warm_up_on_both_backends(plain_reference_after_warmup, run_unsloth, monkeypatch):
    """The same recipe on the strict double: Unsloth's trainer never gets TRL's "ref" adapter (the double runs the
    wheel's own regexes over the pinned TRL source), so both measure kl against the base model."""
    import trl

    class StandInSFTTrainer:  # the warm-up's trainer (the double's SFTConfig binds its fields)
        def __init__(self, model, args, **kwargs):
            fake_unsloth.check_trainer_precision(model, args)
            self.model = model

        def remove_callback(self, callback):
            pass

        def train(self):
            pass

    monkeypatch.setattr(trl, "SFTConfig", fake_unsloth.UnslothSFTConfig)
    monkeypatch.setattr(trl, "SFTTrainer", StandInSFTTrainer)
    result, fake = run_unsloth(sft_warmup_steps=2, beta=0.04)
    assert result.status == "completed"
    (init,) = fake.calls_named("GRPOTrainer.__init__")
    assert set(init.kwargs["model"].peft_config) == {"default"} and init.kwargs["args"].beta == 0.04
    unsloth_reference = json.loads((result.output_dir / "effective_config.json").read_text())["kl_reference"]
    assert unsloth_reference == plain_reference_after_warmup == BASE_REFERENCE


def test_tools_environments_and_rollout_func_reach_unsloths_trainer_as_trls_arguments(run_unsloth):
    """Unsloth 2026.10.9 trains with them (its trainer is generated with TRL's __init__ arguments, rl.py
    RLTrainer_arguments; it maps chat templates for tool calls, _trl_tool_templates.py, and masks tool tokens out
    of its loss, unsloth_zoo align_completion_tool_mask), so the backend hands them on as the plain one does:
    bound here against the real TRL GRPOTrainer.__init__ that Unsloth's copies."""
    import inspect

    from trl.trainer.grpo_trainer import GRPOTrainer

    result, fake = run_unsloth(model_name_or_path="tiny-qwen2.5", dataset_name="sample", max_steps=1,
                               tools=["agent_helpers:add", "agent_helpers:lookup"],
                               environment_factory="agent_helpers:Counter", rollout_func="agent_helpers:fixed_rollout",
                               max_tool_calling_iterations=2)
    assert result.status == "completed"
    (init,) = fake.calls_named("GRPOTrainer.__init__")
    inspect.signature(GRPOTrainer.__init__).bind(None, **init.kwargs)  # every argument is one TRL takes
    assert [f.__name__ for f in init.kwargs["tools"]] == ["add", "lookup"]
    assert init.kwargs["environment_factory"].__name__ == "Counter"
    assert init.kwargs["rollout_func"].__name__ == "fixed_rollout"
    assert init.kwargs["args"].kwargs["max_tool_calling_iterations"] == 2
