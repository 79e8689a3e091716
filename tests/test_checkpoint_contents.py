"""A checkpoint is checked for what it holds before anything loads (issue 48, class 3): every file a resume
restores (pipeline/run/checkpoint_contents.py) against the run that resumes it, on a real checkpoint of the plain
backend with one file at a time replaced; each mismatch names the file, what differs and the fix."""

import shutil

import pytest
import torch

from cli_helpers import fault_table
from pipeline.config import parse_config
from pipeline.run.checkpoint_contents import RESTORED_FILES, contents_problem
from pipeline.run.resume import resume_key

TORCH_FILES = ("optimizer.pt", "scheduler.pt", "rng_state.pth")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """(checkpoint folder, the config that resumes it): bench/faults.py's one trained checkpoint."""
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
