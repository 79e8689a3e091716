"""Real GRPOTrainer runs on CPU through the pipeline: params change, artifacts verify, resume, signals.

Every test here trains for real (TRL 1.15 GRPOTrainer, transformers, peft) on a tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from grpo_pipeline.env.adapters import verify_adapter_dir
from grpo_pipeline.pipeline.train import EXIT_HEALTH_STOP, EXIT_INTERRUPTED, run_training
from train_helpers import demo_config, poison_gradients, tiny_qwen_config

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def step_records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if "loss" in r]


def test_tiny_qwen_lora_params_change_and_artifacts_verify(tmp_path, monkeypatch):
    """Tiny Qwen2 + the real Qwen2.5 tokenizer + LoRA, 2 real steps; the tokenizer is loaded once in the run (the
    check's, which the data and the plain backend's model take)."""
    import torch
    from transformers import TrainerCallback

    from grpo_pipeline.pipeline.data import tokenizer as tokenizers

    loads = []
    read = tokenizers.read_tokenizer
    monkeypatch.setattr(tokenizers, "read_tokenizer", lambda *args, **kwargs: loads.append(args[:1]) or read(*args, **kwargs))

    initial = {}

    class RememberInitialLora(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            for name, param in model.named_parameters():
                if "lora_" in name:
                    initial[name] = param.detach().clone()

    run_dir = tmp_path / "run"
    result = run_training(tiny_qwen_config(run_dir, plots=True), callbacks=[RememberInitialLora()])

    assert result.status == "completed" and result.exit_code == 0 and result.steps == 2
    assert len(loads) == 1, loads
    info = verify_adapter_dir(run_dir / "lora")
    assert info.r == 8 and set(info.target_modules) == {"q_proj", "v_proj"}
    saved = load_file(str(run_dir / "lora" / "adapter_model.safetensors"))
    assert initial, "no LoRA parameters were found on the trained model"
    changed = [name for name, before in initial.items()
               if not torch.equal(before, torch.from_numpy(saved[_saved_key(name, saved)]).to(before.dtype))]
    assert changed, "LoRA parameters did not change after 2 GRPO steps"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["base_model"] == "tiny-qwen2.5" and manifest["backend"] == "plain"
    assert manifest["max_completion_length"] == 16 and manifest["system_prompt"].startswith("\nRespond")
    assert "<|im_start|>" in manifest["chat_template"] and manifest["versions"]["trl"] == "1.15.0"
    records = step_records(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for key in ("reward", "rewards/correctness_reward_func/mean", "rewards/digit_share_reward/mean",
                "completions/mean_length", "health/garbled_rate"):
        assert key in records[-1], key
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert (run_dir / "plots" / "reward.png").is_file()
    # TRL's model card would call a local/built-in base "fine-tuned version of [None]": none is written for it
    assert not (run_dir / "README.md").exists()
    weights = run_dir / "checkpoint-2" / "adapter_model.safetensors"  # written 0600 by safetensors, then fixed
    assert weights.stat().st_mode & 0o777 == (run_dir / "checkpoint-2" / "trainer_state.json").stat().st_mode & 0o777


def _saved_key(param_name: str, saved: dict) -> str:
    """peft saves 'base_model.model.x.lora_A.weight' for the live 'base_model.model.x.lora_A.default.weight'."""
    key = param_name.replace(".default", "")
    assert key in saved, f"{key} not in saved adapter keys {sorted(saved)[:4]}..."
    return key


# The settings of every run into one_step_run's folder: a 2-step format warm-up and eval before, so that its resumes
# show what a resumed run reuses.
ONE_STEP_SETTINGS = dict(sft_warmup_steps=2, eval_before=True, eval_limit=4, save_steps=1)


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory):
    """A finished 1-step demo run (ONE_STEP_SETTINGS) with checkpoint-1, trained once: (folder, RunResult, what it
    printed); a test resumes a copy."""
    import contextlib
    import io

    run_dir = tmp_path_factory.mktemp("one_step") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = run_training(demo_config(run_dir, max_steps=1, **ONE_STEP_SETTINGS))
    assert result.steps == 1 and (run_dir / "checkpoint-1").is_dir()
    return run_dir, result, printed.getvalue()


def test_resume_continues_from_checkpoint_step_reuses_warmup_and_eval_before_and_a_finished_run_is_not_extended(
        one_step_run, tmp_path, capsys):
    import shutil

    from grpo_pipeline.pipeline.cli import main as grpo

    run_dir = tmp_path / "run"
    shutil.copytree(one_step_run[0], run_dir)
    first, out_first = one_step_run[1], one_step_run[2]
    assert first.status == "completed" and "format warm-up: 2 SFT steps" in out_first
    assert (run_dir / "warmup" / "warmup.json").is_file() and (run_dir / "eval_before.json").is_file()
    # A later, longer run of the same output_dir picks the checkpoint up (resume: auto is the default).
    second = run_training(demo_config(run_dir, max_steps=2, **ONE_STEP_SETTINGS))
    out_second = capsys.readouterr().out
    assert second.status == "completed" and second.steps == 2
    steps = [r["step"] for r in step_records(run_dir)]
    assert steps == [1, 2], steps  # 1 from the first run, 2 resumed, nothing repeated
    # the resumed session reuses the warm-up and the eval before of the first
    assert "format warm-up: 2 SFT steps" not in out_second and "format warm-up: reusing" in out_second
    assert "eval before GRPO: reusing" in out_second
    assert second.summary["eval_before"] == first.summary["eval_before"]
    # summary.json's wall time is the whole run's: both sessions
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [s["steps"] for s in summary["sessions"]] == [1, 2]
    assert summary["wall_time_s"] == round(first.summary["wall_time_s"] + summary["sessions"][1]["wall_time_s"], 1)
    assert summary["wall_time_s"] > summary["sessions"][1]["wall_time_s"] and "wall_time_note" not in summary

    # The same command again (`grpo train --config`, through the CLI's own entry; the SIGINT test below runs it as
    # a fresh process): the run is complete, so it says so and trains nothing (no "step 3 of 2").
    # A leftover lock-holder file of a dead process (as a killed run leaves it) does not block it either.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run_dir / ".grpo-run.lock.json").write_text(json.dumps({"pid": dead.pid, "host": "here", "started": "then"}))
    metrics_before = (run_dir / "metrics.jsonl").read_text()
    recipe = _write_recipe(tmp_path / "recipe.yaml", demo_config(run_dir, max_steps=2, **ONE_STEP_SETTINGS))
    code = grpo(["train", "--config", str(recipe)])
    again = capsys.readouterr()
    assert code == 0, again.err
    assert "run already complete" in again.out and "2 of max_steps=2" in again.out
    assert "--max_steps" in again.out and "--resume never" in again.out
    assert "Traceback" not in again.err and "step 3" not in again.out
    assert (run_dir / "metrics.jsonl").read_text() == metrics_before

    # a session that left no summary (killed) is said, not silently dropped
    (run_dir / "summary.json").unlink()
    third = run_training(demo_config(run_dir, max_steps=3, **ONE_STEP_SETTINGS))
    assert third.steps == 3 and "no readable summary.json" in third.summary["wall_time_note"]


def test_corrupt_checkpoint_is_set_aside_and_run_resumes_from_the_good_one(one_step_run, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(one_step_run[0], run_dir)
    broken = run_dir / "checkpoint-2"  # an interrupted save: weights but no trainer_state.json
    broken.mkdir()
    (broken / "adapter_model.safetensors").write_bytes(b"partial")
    result = run_training(demo_config(run_dir, max_steps=2, **ONE_STEP_SETTINGS))
    assert result.steps == 2 and [r["step"] for r in step_records(run_dir)] == [1, 2]  # resumed from checkpoint-1
    corrupt = list((run_dir / "corrupt").iterdir())
    assert len(corrupt) == 1 and corrupt[0].name.startswith("checkpoint-2-")
    assert (corrupt[0] / "adapter_model.safetensors").read_bytes() == b"partial"  # kept, not deleted


def test_sigint_saves_a_resumable_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    recipe = tmp_path / "demo.yaml"
    import yaml

    # The same settings as the resumed run below (LoRA rank included), through the CLI's YAML path; 16-token
    # completions, as the steps before the signal are only what it interrupts.
    short = dict(max_completion_length="16")
    recipe.write_text(yaml.safe_dump(demo_config(run_dir, max_steps=2000, save_steps=1000, **short).to_dict()))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    proc = subprocess.Popen([sys.executable, "-m", "grpo_pipeline.pipeline", "train", "--config", str(recipe)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not ((run_dir / "metrics.jsonl").is_file()
                                          and (run_dir / "metrics.jsonl").read_text().count("\n") >= 3):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == EXIT_INTERRUPTED, out
    assert "SIGINT received" in out and "--resume auto" in out
    checkpoints = sorted(run_dir.glob("checkpoint-*"))
    assert len(checkpoints) == 1, out
    stopped_at = int(checkpoints[0].name.split("-")[1])
    assert 3 <= stopped_at < 2000
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == stopped_at
    assert not (run_dir / "lora").exists()  # an interrupted run is a checkpoint, not a finished adapter
    resumed = run_training(demo_config(run_dir, max_steps=stopped_at + 1, **short))
    assert resumed.steps == stopped_at + 1


def test_nan_gradient_stops_with_checkpoint_and_reason(tmp_path):
    """NaN gradients in step 2 (as from an fp16 overflow): grad_norm is NaN, the run stops and keeps step 2."""
    run_dir = tmp_path / "run"
    result = run_training(demo_config(run_dir, max_steps=6, save_steps=100), callbacks=[poison_gradients(at_step=2)])
    assert result.status == "stopped" and result.exit_code == EXIT_HEALTH_STOP
    assert result.steps == 2
    assert (run_dir / "checkpoint-2" / "trainer_state.json").is_file()  # saved before stopping
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and "step 2" in summary["stop_reason"]
    assert "grad_norm" in summary["stop_reason"] and "nan" in summary["stop_reason"].lower()
    assert summary["health"]["stop_rule"] == "non_finite"
    assert not (run_dir / "lora").exists()


def test_garbled_output_stops_the_run(tmp_path):
    """A random model over the real 151k vocabulary emits lone byte tokens: U+FFFD in decoded text."""
    run_dir = tmp_path / "run"
    cfg = tiny_qwen_config(run_dir, max_steps=4, save_steps=100, garbled_threshold=0.05, garbled_window=1,
                           garbled_action="stop")
    result = run_training(cfg)
    assert result.status == "stopped" and result.exit_code == EXIT_HEALTH_STOP
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["health"]["stop_rule"] == "garbled"
    assert (run_dir / f"checkpoint-{result.steps}").is_dir()


@pytest.mark.parametrize("kl_target, direction", [(1e-12, "up"), (10.0, "down")])
def test_adaptive_beta_moves_toward_kl_target(tmp_path, kl_target, direction):
    run_dir = tmp_path / "run"
    # digit_share_reward gives a random model's group some variance, so the policy moves and KL > 0.
    cfg = demo_config(run_dir, max_steps=2, save_steps=100, beta=0.04, adaptive_beta=True, kl_target=kl_target,
                      beta_min=0.001, beta_max=1.0, learning_rate=1e-2, kl_action="warn",  # the controller
                      reward_funcs=["correctness", "train_helpers:digit_share_reward"])  # alone, no ceiling stop
    result = run_training(cfg)
    assert result.status == "completed"
    records = [r for r in step_records(run_dir) if "kl" in r and "health/beta" in r]
    betas = [0.04] + [r["health/beta"] for r in records]
    assert all(0.001 <= b <= 1.0 for b in betas), betas
    # The controller's rule, checked on every logged step of a real run: kl above 1.5 x target raises
    # beta, kl below target / 1.5 lowers it.
    moves = [(r["kl"], before, after) for r, before, after in zip(records, betas, betas[1:])]
    if direction == "up":
        high = [(kl, b, a) for kl, b, a in moves if kl > 1.5 * kl_target]
        assert high and all(a > b for _, b, a in high), moves  # the policy moved away and beta followed
    else:
        assert all(a < b for _, b, a in moves) and betas[-1] < 0.04, moves


def _write_recipe(path: Path, cfg) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(cfg.to_dict()), encoding="utf-8")
    return path


# Holds the run lock on argv[1] in its own process, says so, and keeps it until its stdin closes.
_HOLD_LOCK = """import sys
from pathlib import Path
from grpo_pipeline.pipeline.run.lock import run_lock
with run_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_second_run_into_a_locked_output_dir_exits_2_naming_the_holder(tmp_path, capsys):
    import socket

    from grpo_pipeline.pipeline.cli import main as grpo

    run_dir = tmp_path / "busy"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(run_dir)], cwd=ROOT, env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # "the other run": another process
    try:
        assert holder.stdout.readline().strip() == "held"
        code = grpo(["train", "--output_dir", str(run_dir), "--max_steps", "1"])
        refused = capsys.readouterr()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert code == 2, refused.out + refused.err
    assert str(run_dir) in refused.err and f"pid {holder.pid}" in refused.err
    assert socket.gethostname() in refused.err and "Traceback" not in refused.err
    assert not (run_dir / "metrics.jsonl").exists()
    assert holder.returncode == 0  # it held the lock to the end


def test_a_gpu_recipe_optim_without_bitsandbytes_trains_with_adamw_torch_and_says_so(tmp_path, monkeypatch, capsys):
    """Every configs/qwen2.5-*.yaml sets optim: adamw_8bit; on the CUDA 12 profile (no bitsandbytes) that once
    raised transformers' ImportError at train start, after the model had loaded and eval before had run."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real_find_spec(name, *a))
    result = run_training(demo_config(tmp_path / "run", optim="adamw_8bit", max_steps=1, save_steps=1))
    assert result.status == "completed"
    assert "optim: adamw_8bit is a bitsandbytes optimizer" in capsys.readouterr().out
    manifest = json.loads((result.output_dir / "manifest.json").read_text())
    assert manifest["config"]["optim"] == "adamw_torch"  # the manifest says what really ran
    args = json.loads((result.output_dir / "checkpoint-1" / "trainer_state.json").read_text())
    assert args["global_step"] == 1
