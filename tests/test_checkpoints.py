"""Checkpoint discovery, corrupt set-aside (never delete) and --resume resolution, on crafted folders."""

import json

import pytest

from pipeline.checkpoints import (
    checkpoint_problem,
    list_checkpoints,
    resolve_resume,
    set_aside_corrupt,
)


def make_checkpoint(root, step, *, state=True, weights=True, state_text=None):
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if state:
        (path / "trainer_state.json").write_text(state_text or json.dumps({"global_step": step}))
    if weights:
        (path / "adapter_model.safetensors").write_bytes(b"x" * 16)
    return path


def test_complete_checkpoint_has_no_problem(tmp_path):
    assert checkpoint_problem(make_checkpoint(tmp_path, 2)) is None


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"state": False}, "trainer_state.json is missing"),
        ({"state_text": "{not json"}, "trainer_state.json is unreadable"),
        ({"state_text": "{}"}, "trainer_state.json is unreadable"),
        ({"weights": False}, "no model weights"),
    ],
)
def test_incomplete_checkpoints_are_named(tmp_path, kwargs, expected):
    assert expected in checkpoint_problem(make_checkpoint(tmp_path, 3, **kwargs))


def test_list_is_numeric_not_lexical(tmp_path):
    for step in (10, 9, 100):
        make_checkpoint(tmp_path, step)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-9", "checkpoint-10", "checkpoint-100"]


def test_corrupt_checkpoint_is_moved_aside_not_deleted(tmp_path):
    good = make_checkpoint(tmp_path, 2)
    bad = make_checkpoint(tmp_path, 4, state=False)
    (bad / "optimizer.pt").write_bytes(b"keep me")
    messages = []
    moved = set_aside_corrupt(tmp_path, log=messages.append)
    assert len(moved) == 1 and not bad.exists() and good.exists()
    kept = moved[0].path
    assert kept.parent == tmp_path / "corrupt" and (kept / "optimizer.pt").read_bytes() == b"keep me"
    assert "checkpoint-4 is incomplete" in messages[0] and "not deleted" in messages[0]


def test_resume_auto_picks_newest_complete(tmp_path):
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4)
    make_checkpoint(tmp_path, 6, weights=False)  # the newest is broken: set aside, resume from 4
    resumed = resolve_resume("auto", tmp_path, log=lambda m: None)
    assert resumed == str((tmp_path / "checkpoint-4").resolve())
    assert (tmp_path / "corrupt").is_dir()


def test_resume_never_and_empty(tmp_path):
    make_checkpoint(tmp_path, 2)
    assert resolve_resume("never", tmp_path) is None
    assert resolve_resume("auto", tmp_path / "fresh-run") is None


def test_resume_path_relative_and_errors(tmp_path, monkeypatch):
    make_checkpoint(tmp_path / "run", 5)
    monkeypatch.chdir(tmp_path)
    assert resolve_resume("run/checkpoint-5", tmp_path / "run") == str(tmp_path / "run" / "checkpoint-5")
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        resolve_resume("run/checkpoint-9", tmp_path / "run")
    make_checkpoint(tmp_path / "run", 7, state=False)
    with pytest.raises(ValueError, match="trainer_state.json is missing"):
        resolve_resume("run/checkpoint-7", tmp_path / "run")
