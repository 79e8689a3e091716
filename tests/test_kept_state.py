"""Kept state (env/kept.py): every file the pipeline reuses, against every input it depends on.

For each kept file a table of its key inputs: changing any one of them makes the reuser recompute (and say which
input changed), or, for a checkpoint's restored settings, refuses the resume naming the field; an unchanged key
reuses. The kept files: eval_before.json, best_lora/, warmup/, the data cache, the built-in model folders and the
checkpoints (docs/guardrails.md, "Kept state").
"""

import importlib.metadata
import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from grpo_pipeline.pipeline.config import trl_names
from grpo_pipeline.pipeline.data.cache import data_cache_root, fingerprint, local_file_identity, tokenizer_identity
from grpo_pipeline.pipeline.data.prepare import data_fields, prepare_dataset
from grpo_pipeline.pipeline.data.source_spec import source_spec
from grpo_pipeline.pipeline.data.sources import resolve_source
from grpo_pipeline.pipeline.demo.model import BUILD_NAME, build_demo_tokenizer, build_inputs, demo_model_dir
from grpo_pipeline.pipeline.infer.evaluate import EVAL_BEFORE_NAME, eval_before_inputs, load_eval_before, save_eval_before
from grpo_pipeline.pipeline.run.decisions import eval_key
from grpo_pipeline.pipeline.run.checkpoints import PREVIOUS_DIR
from grpo_pipeline.pipeline.run.resume import (
    SHAPE_NAME,
    checkpoint_record,
    resume_changes,
    resume_key,
    resume_mismatch,
)
from grpo_pipeline.env.kept import changed_inputs, code_hash, read_record, record, reusable, state_key
from grpo_pipeline.pipeline.infer.periodic_eval import BEST_DIR, BEST_NAME, BestAdapter
from grpo_pipeline.pipeline.trainer.warmup import WARMUP_DIR, WARMUP_KEY_NAME, _saved_warmup, warmup_inputs
from tests.data_helpers import make_cfg, write_jsonl
from train_helpers import demo_config

# --------------------------------------------------------------------------------------------- the one helper


def test_the_key_is_a_hash_of_canonical_json_and_the_check_names_what_changed(tmp_path):
    inputs = {"model": {"name": "m", "files": ("a", "b")}, "max_tokens": 8}
    assert state_key(inputs) == state_key({"max_tokens": 8, "model": {"files": ["a", "b"], "name": "m"}})
    assert changed_inputs(inputs, {**inputs, "max_tokens": 9}) == ["max_tokens"]
    path = tmp_path / "kept.json"
    path.write_text(json.dumps(record(inputs, result={"accuracy": 0.5})))
    said = []
    assert reusable(path, {"max_tokens": 8, "model": {"name": "m", "files": ["a", "b"]}}, "x", said.append)[
        "result"] == {"accuracy": 0.5}
    assert said == []
    assert reusable(path, {**inputs, "model": {"name": "other"}}, "eval before GRPO", said.append) is None
    assert said == [f"eval before GRPO: not reusing {path} (model changed since it was written); computing it again"]
    path.write_text(json.dumps({"key": {"model": "m"}, "result": {}}))  # an older version's record: no inputs
    assert reusable(path, inputs, "x", said.append) is None and "kept by an older version" in said[-1]
    path.write_text("{torn")
    assert reusable(path, inputs, "x", said.append) is None and len(said) == 2  # nothing readable kept: quiet


def test_a_code_input_changes_with_any_file_of_its_package(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rule.py").write_text("LIMIT = 1\n")
    module = type("M", (), {"__file__": str(package / "__init__.py")})
    before = code_hash(module)
    (package / "rule.py").write_text("LIMIT = 2\n")
    assert code_hash(module) != before


# ------------------------------------------------------------------- eval_before.json and best_lora/: the eval


@pytest.fixture
def eval_setup(tmp_path):
    model = tmp_path / "base-model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden": 1}')
    rows = [{"id": f"test-{i}", "answer": str(i), "prompt": [{"role": "system", "content": "S"},
                                                            {"role": "user", "content": f"{i} + 0?"}]}
            for i in range(3)]
    return {"cfg": demo_config(tmp_path / "run", model_name_or_path=str(model)), "backend_name": "plain",
            "tokenizer": build_demo_tokenizer(), "rows": rows, "max_tokens": 16, "warmup": None}


def _with_cfg(**changes):
    return lambda s, tmp_path: {**s, "cfg": s["cfg"].replace(**changes)}


def _edit_model_file(s, tmp_path):
    (tmp_path / "base-model" / "config.json").write_text('{"hidden": 2}')  # the same name and size
    return s


def _other_template(s, tmp_path):
    tokenizer = build_demo_tokenizer()
    tokenizer.chat_template = tokenizer.chat_template.replace("system", "sys")
    return {**s, "tokenizer": tokenizer}


def _rows(edit):
    return lambda s, tmp_path: {**s, "rows": edit([json.loads(json.dumps(r)) for r in s["rows"]])}


def _answer(rows):
    rows[1]["answer"] = "7"
    return rows


def _question(rows):
    rows[2]["prompt"][1]["content"] = "2 + 5?"
    return rows


def _system(rows):
    for row in rows:
        row["prompt"][0]["content"] = "Answer in French."
    return rows


def _newer_torch(s, tmp_path, monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "99.0" if name == "torch" else real(name))
    return s


# (change, the input it must name); every input of eval_inputs / eval_before_inputs has a row
EVAL_CHANGES = {
    "another model": (_with_cfg(model_name_or_path="tiny-demo"), "model"),
    "a model file edited in place": (_edit_model_file, "model"),
    "another backend": (lambda s, tmp_path: {**s, "backend_name": "unsloth"}, "loading"),
    "dtype": (_with_cfg(dtype="bfloat16"), "loading"),
    "max_seq_length": (_with_cfg(max_seq_length=512), "loading"),
    "fast_inference": (_with_cfg(fast_inference=False), "loading"),
    "trust_remote_code": (_with_cfg(trust_remote_code=True), "loading"),
    "another chat template": (_other_template, "tokenizer"),
    "same ids, another answer": (_rows(_answer), "eval_rows"),
    "same ids, another question": (_rows(_question), "eval_rows"),
    "another system prompt": (_rows(_system), "eval_rows"),
    "fewer rows (eval_limit)": (_rows(lambda rows: rows[:2]), "eval_rows"),
    "max_tokens": (lambda s, tmp_path: {**s, "max_tokens": 32}, "generation"),
    "a tool added (the eval calls it)": (_with_cfg(tools=["agent_helpers:add"]), "agents"),
    "another cap on tool rounds": (_with_cfg(max_tool_calling_iterations=2), "agents"),
    "a library upgrade": (_newer_torch, "versions"),
}
START_CHANGES = {
    "lora_r": (_with_cfg(lora_r=8), "start"),
    "lora_target_modules": (_with_cfg(lora_target_modules=["q_proj"]), "start"),
    "seed": (_with_cfg(seed=1), "start"),
    "a warm-up ran first": (lambda s, tmp_path: {**s, "warmup": state_key({"steps": 2})}, "start"),
}


def _apply(change, setup, tmp_path, monkeypatch):
    return change(setup, tmp_path, monkeypatch) if change is _newer_torch else change(setup, tmp_path)


def _eval_before_inputs(s):
    return eval_before_inputs(eval_key(s["cfg"]), s["backend_name"], s["tokenizer"], s["rows"], s["max_tokens"],
                              s["warmup"])


def test_every_eval_input_has_a_row_in_the_table(eval_setup):
    named = {name for _, name in [*EVAL_CHANGES.values(), *START_CHANGES.values()]}
    assert named == set(_eval_before_inputs(eval_setup)) - {"scoring"}  # scoring: code (the test above), below


def test_the_scoring_input_is_the_code_that_scores(eval_setup):
    from grpo_pipeline import rewards
    from grpo_pipeline.pipeline.data.prepare import answer_reader_version

    assert answer_reader_version() == code_hash(rewards)
    assert _eval_before_inputs(eval_setup)["scoring"]["rewards_code"] == code_hash(rewards)


@pytest.mark.parametrize("case", [*EVAL_CHANGES, *START_CHANGES])
def test_eval_before_is_reused_only_for_the_same_inputs(case, eval_setup, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = {"accuracy": 0.25, "format_rate": 0.5, "n": 3}
    save_eval_before(run_dir, _eval_before_inputs(eval_setup), result)
    said = []
    assert load_eval_before(run_dir, _eval_before_inputs(eval_setup), log=said.append) == result and not said
    change, name = {**EVAL_CHANGES, **START_CHANGES}[case]
    changed = _apply(change, eval_setup, tmp_path, monkeypatch)
    assert load_eval_before(run_dir, _eval_before_inputs(changed), log=said.append) is None
    assert said == [f"eval before GRPO: not reusing {run_dir / EVAL_BEFORE_NAME} ({name} changed since it was "
                    "written); computing it again"]


@pytest.mark.parametrize("case", list(EVAL_CHANGES))
def test_a_kept_best_adapter_is_compared_only_when_measured_the_same_way_else_set_aside(case, eval_setup, tmp_path,
                                                                                        monkeypatch):
    from grpo_pipeline.pipeline.infer.evaluate import eval_inputs

    def inputs(s):
        return eval_inputs(eval_key(s["cfg"]), s["backend_name"], s["tokenizer"], s["rows"], s["max_tokens"])

    run_dir = tmp_path / "run"
    best_dir = run_dir / BEST_DIR
    best_dir.mkdir(parents=True)
    (best_dir / BEST_NAME).write_text(json.dumps(record(inputs(eval_setup), step=4, accuracy=0.75)))
    kept = BestAdapter(run_dir, save=None, resume=True, inputs=inputs(eval_setup), log=lambda m: None)
    assert kept.best["accuracy"] == 0.75 and best_dir.is_dir()
    change, name = EVAL_CHANGES[case]
    said = []
    fresh = BestAdapter(run_dir, save=None, resume=True, inputs=inputs(_apply(change, eval_setup, tmp_path,
                                                                               monkeypatch)), log=said.append)
    assert fresh.best is None and not best_dir.exists()
    moved = [p for p in (run_dir / PREVIOUS_DIR).rglob(BEST_NAME)]
    assert len(moved) == 1 and read_record(moved[0])["accuracy"] == 0.75  # set aside whole, not deleted
    assert f"({name} changed" in said[0] and "moved to" in said[1]


# ------------------------------------------------------------------------------------------------- warmup/

class _Prepared:
    fingerprint = "data-1"


WARMUP_CHANGES = {
    "model": ({"model_name_or_path": "tiny-qwen2.5"}, "model"),
    "dtype": ({"dtype": "float32"}, "dtype"),
    "max_seq_length": ({"max_seq_length": 512}, "max_seq_length"),
    "sft_warmup_steps": ({"sft_warmup_steps": 3}, "steps"),
    "sft_learning_rate": ({"sft_learning_rate": 1e-4}, "learning_rate"),
    "seed": ({"seed": 1}, "seed"),
    "system_prompt": ({"system_prompt": "Be brief."}, "system_prompt"),
    "tools": ({"tools": ["grpo_pipeline.pipeline.demo.calculator:calculator"]}, "tools"),
    "lora_r": ({"lora_r": 8}, "lora"),
    "lora_dropout": ({"lora_dropout": 0.1}, "lora"),
    "training data": ({}, "data_fingerprint"),
}


def test_every_warmup_input_has_a_row_in_the_table(tmp_path):
    named = {name for _, name in WARMUP_CHANGES.values()}
    assert named == set(warmup_inputs(demo_config(tmp_path, sft_warmup_steps=2), _Prepared())) - {"code_sha256",
                                                                                                 "versions"}


@pytest.mark.parametrize("case", list(WARMUP_CHANGES))
def test_saved_warmup_weights_are_reused_only_for_the_same_inputs(case, tmp_path, capsys):
    cfg = demo_config(tmp_path / "run", sft_warmup_steps=2)
    folder = tmp_path / "run" / WARMUP_DIR
    folder.mkdir(parents=True)
    (folder / WARMUP_KEY_NAME).write_text(json.dumps(record(warmup_inputs(cfg, _Prepared()))))
    assert _saved_warmup(tmp_path / "run", warmup_inputs(cfg, _Prepared())) == folder
    changes, name = WARMUP_CHANGES[case]
    prepared = _Prepared() if changes else type("Other", (), {"fingerprint": "data-2"})()
    assert _saved_warmup(tmp_path / "run", warmup_inputs(cfg.replace(**changes), prepared)) is None
    assert f"format warm-up: not reusing {folder / WARMUP_KEY_NAME} ({name} changed" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ the data cache


def _data_key(cfg, tokenizer):
    spec = source_spec(cfg, "train", None)
    source = resolve_source(cfg, spec, data_cache_root(cfg.data.data_cache_dir))
    return fingerprint(source.identity, tokenizer_identity(tokenizer), data_fields(cfg))


def _same_size_other_content(path):
    stat = path.stat()
    path.write_text(path.read_text().replace('"3"', '"4"'))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same size and mtime: only the content differs


DATA_CHANGES = {
    "the file's content (same size, same mtime)": lambda cfg, path: (_same_size_other_content(path), cfg)[1],
    "question_field": lambda cfg, path: cfg.replace(question_field="q"),
    "answer_field": lambda cfg, path: cfg.replace(answer_field="a"),
    "system_prompt": lambda cfg, path: cfg.replace(system_prompt="Be brief."),
    "keep_unscorable": lambda cfg, path: cfg.replace(keep_unscorable=True),
    "max_prompt_length": lambda cfg, path: cfg.replace(max_prompt_length="64"),
    "max_completion_length": lambda cfg, path: cfg.replace(max_completion_length="64"),
    "overlong_policy": lambda cfg, path: cfg.replace(overlong_policy="error"),
    "max_samples": lambda cfg, path: cfg.replace(max_samples=1),
    "max_seq_length": lambda cfg, path: cfg.replace(max_seq_length=2048),
}


@pytest.mark.parametrize("case", [*DATA_CHANGES, "tokenizer", "a datasets upgrade"])
def test_the_data_cache_key_covers_each_input(case, tmp_path, qwen_tokenizer, monkeypatch):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "1 + 2?", "answer": "3", "q": "x", "a": "3"}])
    cfg = make_cfg(tmp_path, dataset_name=str(path))
    key = _data_key(cfg, qwen_tokenizer)
    assert _data_key(cfg, qwen_tokenizer) == key
    tokenizer = qwen_tokenizer
    if case == "tokenizer":
        tokenizer = build_demo_tokenizer()
    elif case == "a datasets upgrade":
        real = importlib.metadata.version
        monkeypatch.setattr(importlib.metadata, "version", lambda n: "99.0" if n == "datasets" else real(n))
    else:
        cfg = DATA_CHANGES[case](cfg, path)
    assert _data_key(cfg, tokenizer) != key


@pytest.mark.parametrize("name", ["demo-arithmetic", "demo-calculator", "demo-word-problems"])
def test_a_built_in_sources_key_covers_task_py_which_its_rows_use(name, tmp_path, qwen_tokenizer, monkeypatch):
    import dataclasses
    import shutil

    from grpo_pipeline.pipeline.demo import registry

    builtin = registry.SOURCES[name]
    assert "task.py" in {f.name for f in builtin.code_files}
    for f in builtin.code_files:
        shutil.copy(f, tmp_path / f.name)
    copies = tuple(tmp_path / f.name for f in builtin.code_files)
    monkeypatch.setitem(registry.SOURCES, name, dataclasses.replace(builtin, code_files=copies))
    cfg = make_cfg(tmp_path, dataset_name=name)
    key = _data_key(cfg, qwen_tokenizer)
    assert _data_key(cfg, qwen_tokenizer) == key
    task = tmp_path / "task.py"
    task.write_text(task.read_text(encoding="utf-8") + "\n# an edit\n", encoding="utf-8")
    assert _data_key(cfg, qwen_tokenizer) != key


def test_a_local_tokenizer_folders_files_are_part_of_its_identity(tmp_path, qwen_tokenizer, monkeypatch):
    folder = tmp_path / "tok"
    qwen_tokenizer.save_pretrained(str(folder))
    monkeypatch.setattr(qwen_tokenizer, "name_or_path", str(folder))
    (folder / "model.safetensors").write_bytes(b"weights")
    before = tokenizer_identity(qwen_tokenizer)
    (folder / "model.safetensors").write_bytes(b"other weights")  # a model's weights are not its tokenizer
    assert tokenizer_identity(qwen_tokenizer) == before
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"model_max_length"', '"model_max_length" '))
    assert tokenizer_identity(qwen_tokenizer) != before


def test_an_entry_is_prepared_again_for_a_file_edited_to_the_same_size_and_mtime(tmp_path, qwen_tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "1 + 2?", "answer": "3"}])
    first = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    size = local_file_identity(path)["size"]
    _same_size_other_content(path)
    again = prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer)
    assert local_file_identity(path)["size"] == size and first.report["cache_hit"] is False
    assert again.report["cache_hit"] is False and again.dataset["grpo_answer"] == ["4"]
    assert prepare_dataset(make_cfg(tmp_path, dataset_name=str(path)), qwen_tokenizer).report["cache_hit"] is True


# ----------------------------------------------------------------------------------- the built-in model folders


def test_a_built_in_model_is_built_once_per_key_and_another_key_is_another_folder(tmp_path, monkeypatch):
    import grpo_pipeline.pipeline.demo.model as demo

    folder = demo_model_dir(tmp_path)
    assert read_record(folder / BUILD_NAME)["key"] == state_key(build_inputs("tiny-demo"))
    assert build_inputs("tiny-demo")["code_sha256"] == demo.file_sha256(demo.Path(demo.__file__))
    weights = (folder / "model.safetensors").stat().st_mtime_ns
    assert demo_model_dir(tmp_path) == folder and (folder / "model.safetensors").stat().st_mtime_ns == weights
    monkeypatch.setattr(demo, "DEMO_VERSION", "99")  # a changed build input
    other = demo_model_dir(tmp_path)
    assert other != folder and folder.is_dir() and (other / "config.json").is_file()  # the old one stays
    monkeypatch.undo()
    (folder / BUILD_NAME).write_text(json.dumps(record({"name": "tiny-demo", "version": "0"})))
    assert demo_model_dir(tmp_path) == folder and read_record(folder / BUILD_NAME)["key"] == state_key(
        build_inputs("tiny-demo"))  # a folder recording another key is built again


def test_the_tiny_qwen_key_covers_the_bundled_tokenizer_files():
    from grpo_pipeline.pipeline.assets import QWEN_TOKENIZER_SRC

    files = build_inputs("tiny-qwen2.5")["tokenizer_files"]
    assert set(files) == {p.name for p in QWEN_TOKENIZER_SRC.iterdir() if p.is_file()} and len(files) >= 3


# ----------------------------------------------------------------------------------------------- checkpoints

# one changed value per setting a checkpoint restores (refused) or a resume applies (said); (option, value)
RESTORED_CHANGES = {
    "learning_rate": ("learning_rate", 2e-3), "lr_scheduler_type": ("lr_scheduler_type", "linear"),
    "lr_scheduler_kwargs": ("lr_scheduler_kwargs", {"num_cycles": 0.25}), "warmup_steps": ("warmup_ratio", 0.2),
    "optim": ("optim", "sgd"), "optim_args": ("optim_args", "momentum=0.9"), "weight_decay": ("weight_decay", 0.5),
    "adam_beta1": ("adam_beta1", 0.8), "adam_beta2": ("adam_beta2", 0.9), "adam_epsilon": ("adam_epsilon", 1e-6),
    "per_device_train_batch_size": ("per_device_train_batch_size", 8),
    "gradient_accumulation_steps": ("gradient_accumulation_steps", 2), "num_generations": ("num_generations", 2),
    "generation_batch_size": ("generation_batch_size", 32), "steps_per_generation": ("steps_per_generation", 2),
    "num_iterations": ("num_iterations", 2), "seed": ("seed", 7), "data_seed": ("data_seed", 7),
}
APPLIED_CHANGES = {"max_steps": 9, "num_train_epochs": 2.0, "max_grad_norm": 0.5}


def _checkpoint(tmp_path, cfg):
    folder = tmp_path / "run" / "checkpoint-2"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    save_file({"lora_A": np.zeros((2, 2), dtype=np.float32)}, str(folder / "adapter_model.safetensors"))
    (folder / SHAPE_NAME).write_text(json.dumps(checkpoint_record(resume_key(cfg))))
    return folder


def test_every_setting_a_checkpoint_restores_or_a_resume_applies_has_a_row():
    assert set(RESTORED_CHANGES) == set(trl_names("resume_restored")) and set(APPLIED_CHANGES) == set(trl_names("resume_applied"))


@pytest.mark.parametrize("name", list(RESTORED_CHANGES))
def test_a_resume_under_another_restored_setting_is_refused_naming_it_its_old_value_and_the_ways_on(name, tmp_path):
    cfg = demo_config(tmp_path / "run")
    checkpoint = _checkpoint(tmp_path, cfg)
    assert resume_mismatch(checkpoint, resume_key(cfg)) is None and resume_changes(checkpoint, resume_key(cfg)) == {}
    option, value = RESTORED_CHANGES[name]
    old = checkpoint_record(resume_key(cfg))["settings"][name]
    new = demo_config(tmp_path / "run", **{option: value})
    message = resume_mismatch(checkpoint, resume_key(new))
    assert f"{option} {old!r} -> " in message and f"Set them back ({option}: {json.dumps(old)})" in message
    assert "--resume never" in message and "--output_dir" in message and resume_changes(checkpoint, resume_key(new)) == {}


@pytest.mark.parametrize("name", list(APPLIED_CHANGES))
def test_a_resume_under_another_schedule_length_applies_it_and_names_it(name, tmp_path):
    cfg = demo_config(tmp_path / "run")
    checkpoint = _checkpoint(tmp_path, cfg)
    new = demo_config(tmp_path / "run", **{name: APPLIED_CHANGES[name]})
    assert resume_mismatch(checkpoint, resume_key(new)) is None
    assert resume_changes(checkpoint, resume_key(new)) == {name: [checkpoint_record(resume_key(cfg))["settings"][name],
                                                      APPLIED_CHANGES[name]]}


def test_a_trl_default_given_explicitly_is_no_change_and_an_older_checkpoint_has_no_settings_to_compare(tmp_path):
    cfg = demo_config(tmp_path / "run")
    checkpoint = _checkpoint(tmp_path, cfg)
    default = checkpoint_record(resume_key(cfg))["settings"]["adam_epsilon"]
    assert resume_mismatch(checkpoint, resume_key(demo_config(tmp_path / "run", adam_epsilon=default))) is None
    shape = {k: v for k, v in checkpoint_record(resume_key(cfg)).items() if k != "settings"}
    (checkpoint / SHAPE_NAME).write_text(json.dumps(shape))  # saved before the settings were recorded
    assert resume_mismatch(checkpoint, resume_key(demo_config(tmp_path / "run", learning_rate=0.5))) is None


def test_the_upstream_restore_that_the_refusal_rests_on():
    """transformers' cosine schedule rebuilt for a new length, then loaded from the old scheduler.pt and
    optimizer.pt: the old learning rate and weight decay win (why the resume_restored settings are refused); the new length
    is kept by the lambda, but the rate of the first step is the old schedule's (why
    checkpoints.follow_the_rebuilt_schedule sets it after the load)."""
    import math

    import torch
    from transformers.optimization import get_scheduler

    def make(lr, total, weight_decay):
        param = torch.nn.Parameter(torch.zeros(2))
        optimizer = torch.optim.AdamW([param], lr=lr, weight_decay=weight_decay)
        return param, optimizer, get_scheduler("cosine", optimizer, num_warmup_steps=0, num_training_steps=total)

    param, optimizer, scheduler = make(1e-3, 10, 0.1)
    for _ in range(4):
        param.grad = torch.ones(2)
        optimizer.step()
        scheduler.step()
    param, resumed, rebuilt = make(5e-3, 20, 0.5)
    resumed.load_state_dict(optimizer.state_dict())
    rebuilt.load_state_dict(scheduler.state_dict())
    group = resumed.param_groups[0]
    assert group["lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 4 / 10)))  # the old schedule's rate
    assert group["weight_decay"] == 0.1 and rebuilt.base_lrs == [1e-3]
    param.grad = torch.ones(2)
    resumed.step()
    rebuilt.step()
    assert group["lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 5 / 20)))  # old rate, new length


@pytest.mark.slow
def test_a_real_resume_refuses_a_new_learning_rate_and_applies_a_new_max_steps_recording_it(tmp_path, capsys):
    from grpo_pipeline.pipeline.config import ConfigError
    from grpo_pipeline.pipeline.run.plots import read_metrics
    from grpo_pipeline.pipeline.train import run_training

    run_dir = tmp_path / "run"
    assert run_training(demo_config(run_dir, max_steps=2, save_steps=1)).status == "completed"
    before = sorted(p.name for p in run_dir.iterdir())
    with pytest.raises(ConfigError, match=r"learning_rate 0\.001 -> 0\.002.*Set them back \(learning_rate: 0\.001\)"):
        run_training(demo_config(run_dir, max_steps=3, save_steps=1, learning_rate=2e-3))
    assert sorted(p.name for p in run_dir.iterdir()) == before  # refused before anything was touched
    capsys.readouterr()
    resumed = run_training(demo_config(run_dir, max_steps=3, save_steps=1))
    assert resumed.status == "completed" and resumed.steps == 3
    assert "resuming with max_steps 2 -> 3: applied" in capsys.readouterr().out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["sessions"][-1]["applied_on_resume"] == {"max_steps": [2, 3]}
    assert json.loads((run_dir / "manifest.json").read_text())["config"]["max_steps"] == 3
    # what ran: the rate each step trained at (as logged) is that of the schedule its session built from the same
    # base rate: 2 steps, then 3. Step 3 trains at the 3-step cosine's rate (2.5e-4), not at the 0 the 2-step one
    # that optimizer.pt and scheduler.pt come from had for it (checkpoints.follow_the_rebuilt_schedule).
    logged = {step: row["learning_rate"] for step, row in read_metrics(run_dir / "metrics.jsonl").items()
              if "learning_rate" in row}
    assert [logged[1], logged[2]] == pytest.approx(_cosine_rates(1e-3, 2, 2))
    assert logged[3] == pytest.approx(_cosine_rates(1e-3, 3, 3)[2]) != pytest.approx(_cosine_rates(1e-3, 2, 3)[2])


def _cosine_rates(lr, total, steps):
    """The rate each of `steps` steps trains at on transformers' cosine schedule over `total` steps."""
    import torch
    from transformers.optimization import get_scheduler

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=0, num_training_steps=total)
    rates = []
    for _ in range(steps):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates
