"""`grpo plan --gpus N --nodes M` (pipeline/plan/scale.py): the Accelerate config and the per-GPU memory under it,
the processes (less the server's GPU in server mode) and their batch arithmetic. The numbers come from the one-GPU
estimate (pipeline/plan/estimate.py) as it is; these tests hold the choice and the arithmetic around it."""

from __future__ import annotations

import json

import pytest

from grpo_pipeline.pipeline.config import ConfigError, parse_config
from grpo_pipeline.pipeline.plan.cards import card_by_name
from grpo_pipeline.pipeline.plan.command import main
from grpo_pipeline.pipeline.plan.fit import plan
from grpo_pipeline.pipeline.plan.scale import scale_plan

SEVEN_B = "configs/qwen2.5-7b-gsm8k.yaml"


def cfg(*argv: str):
    return parse_config(["--config", SEVEN_B, "--per_device_train_batch_size", "8", "--max_completion_length", "256",
                         *argv])


def test_ddp_when_one_gpu_holds_the_run_and_its_per_gpu_memory_is_the_plain_one_gpu_estimate():
    card = card_by_name("A100-80GB")
    one = scale_plan(cfg(), card, gpus=8, nodes=1)
    assert (one.engine, one.accelerate_config, one.processes, one.global_batch) == (
        "DDP", "configs/accelerate/ddp.yaml", 8, 64)
    assert one.per_gpu_gib == pytest.approx(plan(cfg().replace(backend="plain"), card).peak_gib)
    two = scale_plan(cfg(), card, gpus=8, nodes=2)
    assert two.accelerate_config == "configs/accelerate/multinode.yaml" and two.processes == 16
    assert two.per_gpu_gib == pytest.approx(one.per_gpu_gib)  # DDP: the same run on every GPU


def test_zero3_when_16_bit_weights_do_not_fit_one_gpu_sharding_them_over_every_process():
    card = card_by_name("T4")
    full = cfg("--load_in_4bit", "false")
    assert not plan(full.replace(backend="plain"), card).fits
    result = scale_plan(full, card, gpus=4, nodes=2)
    assert result.engine == "ZeRO-3" and "zero3.yaml, with num_machines 2, num_processes 8" in result.accelerate_config
    weights = plan(full.replace(backend="plain"), card).part("weights")
    assert result.per_gpu_gib < plan(full.replace(backend="plain"), card).peak_gib - weights * 7 / 8 + 0.5
    assert result.per_gpu_gib <= result.usable_gib and any("FSDP2" in note for note in result.notes)


def test_server_mode_gives_one_gpu_to_the_server_and_checks_the_batch_for_the_rest():
    card = card_by_name("A100-80GB")
    server = cfg("--vllm_mode", "server", "--per_device_train_batch_size", "16")  # 15 x 16: whole groups of 16
    result = scale_plan(server, card, gpus=8, nodes=2)
    assert result.processes == 15 and result.global_batch == 15 * 16
    assert any("1 GPU serves" in note for note in result.notes)
    with pytest.raises(ConfigError, match="leaves no GPU to train"):
        scale_plan(server, card, gpus=1, nodes=1)


def test_the_batch_arithmetic_is_checked_for_the_planned_processes(capsys):
    """8 completions a GPU make whole groups of 16 on 2 GPUs, not on 3: the plan says so as the run would."""
    argv = ["--config", SEVEN_B, "--gpu", "A100-80GB", "--per_device_train_batch_size", "8"]
    assert main([*argv, "--gpus", "2"]) == 0
    assert "DDP: configs/accelerate/ddp.yaml" in capsys.readouterr().out
    assert main([*argv, "--gpus", "3"]) == 2
    assert "x processes (3) = 24 is not divisible by num_generations (16)" in capsys.readouterr().err


@pytest.mark.parametrize("flags, field", [(["--gpus", "0"], "gpus"), (["--nodes", "two"], "nodes"),
                                          (["--gpus"], "gpus")])
def test_bad_counts_are_refused_naming_the_flag(flags, field, capsys):
    assert main(["--config", SEVEN_B, "--gpu", "T4", *flags]) == 2
    err = capsys.readouterr().err
    assert f"config error in `{field}`" in err and "Traceback" not in err


def test_json_carries_the_scale_plan(capsys):
    assert main(["--config", SEVEN_B, "--gpu", "A100-80GB", "--gpus", "8", "--nodes", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scale"]["engine"] == "DDP" and out["scale"]["processes"] == 16 and out["scale"]["fits"] is True
