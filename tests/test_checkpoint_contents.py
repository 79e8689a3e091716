"""A checkpoint is checked for what it holds before anything loads (issue 48, class 3): every file a resume
restores (pipeline/run/resume.py) against the run that resumes it, on a real checkpoint of the plain
backend with one file at a time replaced; each mismatch names the file, what differs and the fix."""

import dataclasses
import json
import shutil

import pytest
import torch

from cli_helpers import fault_table
from grpo_pipeline.pipeline.config import parse_config
from grpo_pipeline.pipeline.run.resume import RESTORED_FILES, contents_problem
from grpo_pipeline.pipeline.run.checkpoints import checkpoint_problem
from grpo_pipeline.pipeline.run.launchers import LAYOUTS, this_launch
from grpo_pipeline.pipeline.run.resume import resume_key

TORCH_FILES = ("optimizer.pt", "scheduler.pt", "rng_state.pth")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """(checkpoint folder, the config that resumes it): the fault table's one trained checkpoint (fault_kit)."""
    folder = tmp_path_factory.mktemp("contents")
    argv = fault_table().trained_checkpoint(folder)
    return folder / "run" / "checkpoint-1", parse_config(argv[1:])


@pytest.fixture
def checkpoint(real, tmp_path):
    copy = tmp_path / "checkpoint-1"
    shutil.copytree(real[0], copy)
    return copy


def test_a_checkpoint_of_this_run_holds_nothing_to_refuse(real):
    assert contents_problem(real[0], resume_key(real[1])) is None


@pytest.mark.parametrize("name", RESTORED_FILES)
def test_a_missing_file_a_resume_restores_is_refused_naming_it(checkpoint, real, name):
    (checkpoint / name).unlink()
    assert f"{checkpoint / name} is missing" in contents_problem(checkpoint, resume_key(real[1]))


class _Payload:
    def __reduce__(self):
        return print, ("ran",)


@pytest.mark.parametrize("name", TORCH_FILES)
@pytest.mark.parametrize("content", [_Payload(), {"not": "it"}, [1, 2]], ids=["pickle payload", "a dict", "a list"])
def test_a_torch_file_that_is_not_what_it_should_be_is_not_readable_naming_it(checkpoint, real, name, content,
                                                                             capsys):
    torch.save(content, checkpoint / name)
    problem = contents_problem(checkpoint, resume_key(real[1]))
    assert f"{checkpoint / name} is not a checkpoint this run can read" in problem and "--resume never" in problem
    assert "ran" not in capsys.readouterr().out  # weights_only: the payload never ran


def test_an_optimizer_of_another_model_and_a_scheduler_of_other_groups_are_named(checkpoint, real):
    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    scheduler = torch.load(checkpoint / "scheduler.pt", weights_only=True)
    torch.save({**scheduler, "base_lrs": scheduler["base_lrs"] * 3}, checkpoint / "scheduler.pt")
    assert "schedules 6 parameter group(s)" in contents_problem(checkpoint, resume_key(real[1]))
    state["param_groups"][0]["params"] = state["param_groups"][0]["params"][:-1]
    torch.save(state, checkpoint / "optimizer.pt")
    assert "optimizer.pt is the optimizer of another model" in contents_problem(checkpoint, resume_key(real[1]))


@pytest.mark.parametrize("change, says", [
    ({"lora_r": 8}, "holds a LoRA of rank [64], and this run trains lora_r 8"),
    ({"lora_target_modules": ["q_proj", "v_proj"]}, "and this run's lora_target_modules are ['q_proj', 'v_proj']"),
])
def test_an_adapter_for_other_lora_settings_is_named(real, change, says):
    checkpoint, cfg = real
    assert says in contents_problem(checkpoint, resume_key(cfg.replace(**change)))


# --- each launcher's layout (issue 59, item 2): pipeline/run/launchers.py LAYOUTS ------------------------------------

def _as_saved_by(checkpoint, layout):
    """The real plain checkpoint laid out as `layout`'s launcher saves it (transformers 5.17
    `_save_optimizer_and_scheduler`, `_save_rng_state`): the same optimizer state, moved where that launcher puts it
    (the issue's simulation: optimizer.pt moved into global_step2/), and one rng_state_<rank>.pth a process."""
    optimizer = checkpoint / "optimizer.pt"
    if layout != "plain":
        (checkpoint / "rng_state.pth").rename(checkpoint / "rng_state_0.pth")
        shutil.copy(checkpoint / "rng_state_0.pth", checkpoint / "rng_state_1.pth")
    if layout == "deepspeed":  # DeepSpeed's save_checkpoint: latest -> global_step2/, one partition a process
        (checkpoint / "global_step2").mkdir()
        for rank in (0, 1):
            name = f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
            shutil.copy(optimizer, checkpoint / "global_step2" / name)
        (checkpoint / "latest").write_text("global_step2")
        optimizer.unlink()
    elif layout == "fsdp":  # accelerate's save_fsdp_optimizer, FULL_STATE_DICT
        optimizer.rename(checkpoint / "optimizer.bin")
    elif layout == "fsdp sharded":  # SHARDED_STATE_DICT: torch.distributed.checkpoint's folder, .metadata last
        (checkpoint / "optimizer_0").mkdir()
        optimizer.rename(checkpoint / "optimizer_0" / "__0_0.distcp")
        (checkpoint / "optimizer_0" / ".metadata").write_bytes(b"\x80\x04N.")
    return checkpoint


SAVED = ("plain", "ddp", "deepspeed", "fsdp", "fsdp sharded")
# How each launch reaches the run: the recipe's TRL options and what accelerate launch puts in the environment.
LAUNCHED = {"plain": ({}, 1, {}), "ddp": ({}, 2, {}),
            "deepspeed": ({}, 2, {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}),
            "deepspeed (recipe)": ({"deepspeed": {"zero_optimization": {"stage": 3}}}, 2, {}),
            "fsdp": ({}, 2, {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}),
            "fsdp (recipe)": ({"fsdp": "full_shard"}, 2, {})}
READS = {"plain": "optimizer.pt", "ddp": "optimizer.pt", "deepspeed": "deepspeed", "fsdp": "fsdp"}


def _key(cfg, launched):
    trl, processes, environ = LAUNCHED[launched]
    launch = this_launch(trl, processes, environ)
    assert launch.layout == launched.split(" ")[0]
    return dataclasses.replace(resume_key(cfg), launch=launch)


@pytest.mark.parametrize("launched", list(LAUNCHED))
@pytest.mark.parametrize("saved", SAVED)
def test_a_checkpoint_resumes_under_the_launch_that_saved_it_and_another_launchers_is_named(
        checkpoint, real, saved, launched):
    _as_saved_by(checkpoint, saved)
    problem = contents_problem(checkpoint, _key(real[1], launched))
    if READS[saved.split(" ")[0]] == READS[launched.split(" ")[0]]:
        assert problem is None
    else:
        held = LAYOUTS[saved.split(" ")[0]]
        assert f"holds its optimizer as {held.saved_by} saves it ({held.holds})" in problem
        assert f"Launch it as it was trained ({held.launch})" in problem and "--resume never" in problem


@pytest.mark.parametrize("saved, remove", [
    ("plain", "optimizer.pt"), ("ddp", "optimizer.pt"), ("deepspeed", "latest"),
    ("deepspeed", "global_step2/bf16_zero_pp_rank_*"), ("fsdp", "optimizer.bin"),
    ("fsdp sharded", "optimizer_0/.metadata"),
    *[(saved, "scheduler.pt") for saved in SAVED]])
def test_a_checkpoint_missing_its_optimizer_or_schedule_under_its_own_layout_is_refused(checkpoint, real, saved,
                                                                                         remove):
    _as_saved_by(checkpoint, saved)
    for path in checkpoint.glob(remove):
        path.unlink()
    layout = saved.split(" ")[0]
    problem = contents_problem(checkpoint, _key(real[1], layout))
    assert f" is missing: a resume {LAYOUTS[layout].without}" in problem and "--resume never" in problem
    assert f"{checkpoint}/" in problem


def test_under_deepspeed_with_its_own_scheduler_no_scheduler_pt_is_looked_for(checkpoint, real, tmp_path):
    _as_saved_by(checkpoint, "deepspeed")
    (checkpoint / "scheduler.pt").unlink()  # DeepSpeed keeps a scheduler of its config in its own files
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"scheduler": {"type": "WarmupLR"}, "zero_optimization": {"stage": 2}}))
    environ = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(config)}
    launch = this_launch({}, 2, environ)
    assert not launch.scheduler_file
    assert contents_problem(checkpoint, dataclasses.replace(resume_key(real[1]), launch=launch)) is None


def test_a_truncated_deepspeed_partition_makes_the_checkpoint_incomplete(checkpoint):
    _as_saved_by(checkpoint, "deepspeed")
    assert checkpoint_problem(checkpoint) is None
    partition = checkpoint / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    partition.write_bytes(partition.read_bytes()[:100])  # a copy cut short
    assert f"{partition.name} is truncated" in checkpoint_problem(checkpoint)
