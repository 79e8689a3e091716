"""Interrupts (docs/reliability.md): Ctrl-C (SIGINT) or SIGTERM in every phase of `grpo train`, and in generate
and export, exits 130 without a traceback; train prints the command that continues, shell-quoted, and running
that command completes the run."""

import os
import shlex
import signal
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def send(signame: str):
    """A stand-in that delivers a real signal to this process where the named function would run, then runs it
    (outside training the signal raises there already)."""
    def wrap(original):
        def interrupted(*args, **kwargs):
            os.kill(os.getpid(), getattr(signal, signame))
            return original(*args, **kwargs)
        return interrupted
    return wrap


def send_twice(original):
    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the first asks for a stop at the end of the step
        os.kill(os.getpid(), signal.SIGINT)  # the second stops now
        return original(*args, **kwargs)
    return interrupted


# One GRPO step where the signal lands outside training: before it (the run then completes one step) or after it.
# The training and checkpoint phases keep 2 steps, so the signal lands in step 1 with a step still to train.
ONE_STEP = {"max_steps": 1}

# phase -> (the function a signal lands in, how, the config that reaches that phase)
PHASES = {
    "data preparation (SIGTERM)": ("grpo_pipeline.pipeline.data.prepare.prepare_dataset", send("SIGTERM"),
                                   ONE_STEP),
    "format warm-up": ("trl.SFTTrainer.train", send("SIGINT"), {"sft_warmup_steps": 2, **ONE_STEP}),
    "eval before": ("grpo_pipeline.pipeline.infer.evaluate.evaluate_rows", send("SIGTERM"),
                    {"eval_before": True, **ONE_STEP}),
    "training (graceful: finish the step, checkpoint)": ("trl.GRPOTrainer.compute_loss", send("SIGINT"), {}),
    "training (second Ctrl-C: stop now)": ("trl.GRPOTrainer.compute_loss", send_twice, {}),
    "checkpoint save": ("transformers.Trainer._save_rng_state", send("SIGINT"), {}),
    "final lora/ save": ("grpo_pipeline.pipeline.backends.plain.save_adapter", send("SIGTERM"), ONE_STEP),
    "eval after": ("grpo_pipeline.pipeline.infer.evaluate.evaluate_rows", send("SIGINT"),
                   {"eval_after": True, **ONE_STEP}),
}


def _patch(monkeypatch, dotted: str, wrap) -> None:
    from train_helpers import resolve_dotted

    owner, attr = resolve_dotted(dotted)
    monkeypatch.setattr(owner, attr, wrap(getattr(owner, attr)))


def _recipe(folder: Path, **overrides) -> Path:
    from train_helpers import demo_config

    values = dict(max_steps=2, save_steps=1, max_samples=16, eval_limit=2, sft_warmup_steps=0,
                  reward_funcs=["train_helpers:digit_share_reward"])
    values.update(overrides)
    path = folder / "my recipe.yaml"  # a space: the printed command must quote it
    path.write_text(yaml.safe_dump(demo_config(folder / "run", **values).to_dict()), encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("phase", PHASES)
def test_an_interrupt_in_any_phase_exits_130_and_prints_the_command_that_completes(phase, tmp_path, monkeypatch,
                                                                                  capsys):
    from grpo_pipeline.pipeline.infer.session import verify_trained_dir
    from grpo_pipeline.pipeline.train import main

    monkeypatch.syspath_prepend(str(TESTS))
    target, how, overrides = PHASES[phase]
    recipe = _recipe(tmp_path, **overrides)
    argv = ["--config", str(recipe), "--resume", "never"]
    with monkeypatch.context() as patched:
        _patch(patched, target, how)
        code = main(argv)
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert code == 130, output[-3000:]
    assert "Traceback" not in output
    printed = [line.split("resume with: ", 1)[1] for line in output.splitlines() if "resume with: " in line]
    assert printed, output[-3000:]
    command = shlex.split(printed[-1])
    # the user's own options, the recipe path quoted, and --resume never replaced by auto
    assert command == ["grpo", "train", "--config", str(recipe), "--resume", "auto"]
    run_dir = tmp_path / "run"
    assert not (run_dir / "lora").exists() or verify_trained_dir(run_dir / "lora")
    # (an interrupt in the data check lands before the run folder is made)
    leftovers = [p.name for p in run_dir.iterdir()] if run_dir.is_dir() else []
    assert [name for name in leftovers if name.startswith(".") and name != ".grpo-run.lock"] == []

    assert main(command[2:]) == 0  # the printed command completes the run
    out = capsys.readouterr().out
    verify_trained_dir(run_dir / "lora")
    assert (run_dir / "manifest.json").is_file() and '"status": "completed"' in (run_dir / "summary.json").read_text()
    if phase.startswith("training (graceful"):
        assert "resuming from " in out  # the checkpoint written at the interrupted step was used


def test_resume_command_quotes_and_keeps_the_users_options():
    from grpo_pipeline.pipeline.run.stop import resume_command

    argv = ["--config", "runs/a b.yaml", "--learning_rate=1e-5", "--system_prompt", "it's $HOME", "--resume=latest"]
    command = resume_command(argv)
    assert shlex.split(command) == ["grpo", "train", "--config", "runs/a b.yaml", "--learning_rate=1e-5",
                                    "--system_prompt", "it's $HOME", "--resume", "auto"]


@pytest.mark.parametrize("command", ["generate", "export"])
def test_an_interrupt_in_generate_or_export_exits_130_without_a_traceback(command, tmp_path, monkeypatch, capsys):
    from fault_kit import adapter

    from grpo_pipeline.pipeline import cli

    lora = adapter(tmp_path, base="tiny-demo")  # the built-in model: no 151k-row vocabulary to load or merge
    if command == "generate":
        _patch(monkeypatch, "grpo_pipeline.pipeline.backends.plain.PlainGenerator.generate", send("SIGTERM"))
        argv = ["generate", "--lora", str(lora), "--prompt", "1+1?", "--backend", "plain"]
    else:
        _patch(monkeypatch, "grpo_pipeline.pipeline.backends.plain.export", send("SIGINT"))
        argv = ["export", "--lora", str(lora), "--to", "merged16", "--out", str(tmp_path / "merged"),
                "--backend", "plain"]
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code == 130 and "Traceback" not in captured.out + captured.err
    assert f"interrupted: `grpo {command}` stopped" in captured.err and "nothing half-written" in captured.err
    assert not (tmp_path / "merged").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".merged")] == []
