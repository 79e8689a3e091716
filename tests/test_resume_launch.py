"""A resume under another process layout, and the data a resume compares (issue 59, item 6 and the held-out class
"resume under another process layout"): a checkpoint trained by N processes resumed by M != N is refused, exit 2
(ConfigError for `resume`), naming both counts, both global batches and the launch that fits, whether the count is
recorded (grpo_shape.json "launch") or told by the random states transformers wrote (older checkpoints); the data
fingerprint is the key it always was, computed a batch at a time."""

import json
import random
import string
import tracemalloc

import numpy as np
import pytest
import torch
from datasets import Dataset
from safetensors.numpy import save_file

from grpo_pipeline.env.kept import state_key
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.preflight import check_resume
from grpo_pipeline.pipeline.run import resume
from grpo_pipeline.pipeline.run.resume import SHAPE_NAME, checkpoint_record, data_mismatch, resume_key, resume_mismatch
from train_helpers import demo_config


def _per_process(cfg):
    """per_device_train_batch_size x gradient_accumulation_steps: one process's share of the global batch."""
    return cfg.grpo.per_device_train_batch_size * cfg.grpo.gradient_accumulation_steps


def _checkpoint(tmp_path, cfg, processes, recorded):
    """A complete checkpoint-2 trained by `processes` processes: its launch in grpo_shape.json (`recorded`
    "record") or only in its rng_state files, as transformers 5.17 `_save_rng_state` names them ("rng files")."""
    folder = tmp_path / "run" / "checkpoint-2"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    save_file({"lora_A": np.zeros((2, 2), dtype=np.float32)}, str(folder / "adapter_model.safetensors"))
    record = checkpoint_record(resume_key(cfg))
    assert record["launch"] == {"processes": processes, "global_batch": _per_process(cfg) * processes}
    if recorded == "rng files":
        del record["launch"]  # saved before the launch was recorded
    (folder / SHAPE_NAME).write_text(json.dumps(record))
    names = ["rng_state.pth"] if processes == 1 else [f"rng_state_{rank}.pth" for rank in range(processes)]
    for name in names:
        torch.save({"python": None, "numpy": None, "cpu": torch.zeros(1)}, folder / name)
    return folder


@pytest.mark.parametrize("recorded", ["record", "rng files"])
@pytest.mark.parametrize("saved, now", [(1, 2), (2, 1), (2, 4), (8, 16)])
def test_a_resume_with_another_process_count_is_refused_naming_it_and_the_launch_that_fits(
        tmp_path, monkeypatch, saved, now, recorded):
    monkeypatch.setenv("WORLD_SIZE", str(saved))
    cfg = demo_config(tmp_path / "run")
    checkpoint = _checkpoint(tmp_path, cfg, saved, recorded)
    assert resume_mismatch(checkpoint, resume_key(cfg)) is None  # the same layout resumes

    monkeypatch.setenv("WORLD_SIZE", str(now))  # as accelerate launch --num_processes NOW sets it
    key = resume_key(cfg)
    message = resume_mismatch(checkpoint, key)
    per, batch = (lambda n: "process" if n == 1 else "processes"), _per_process(cfg)  # noqa: E731
    assert f"was trained by {saved} {per(saved)} (a global batch of {batch * saved} completions" in message
    assert f"this run has {now} {per(now)} (a global batch of {batch * now})" in message
    fits = "without accelerate launch" if saved == 1 else f"accelerate launch --num_processes {saved}"
    assert fits in message and "--resume never" in message and "--output_dir" in message
    with pytest.raises(ConfigError) as refused:  # what --check and the run do with it: exit 2
        check_resume("auto", cfg.grpo.output_dir, lambda path: resume_mismatch(path, key))
    assert refused.value.field == "resume" and fits in str(refused.value)


def test_a_checkpoint_that_does_not_tell_its_process_count_is_not_refused_for_it(tmp_path, monkeypatch):
    cfg = demo_config(tmp_path / "run")
    checkpoint = _checkpoint(tmp_path, cfg, 1, "rng files")
    (checkpoint / "rng_state.pth").unlink()  # saved with save_only_model: no random state
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resume_mismatch(checkpoint, resume_key(cfg)) is None


# --- the data fingerprint -------------------------------------------------------------------------------------------

def _rows(n, width=20, seed=0):
    rnd = random.Random(seed)
    text = lambda: "".join(rnd.choices(string.ascii_letters + "é 中", k=width))  # noqa: E731
    return {"prompt": [[{"role": "user", "content": text()}] for _ in range(n)],
            "answer": [text() for _ in range(n)], "id": list(range(n)), "extra": [None if i % 3 else 1.5
                                                                                for i in range(n)]}


DATASETS = {
    "one batch": lambda: Dataset.from_dict(_rows(5)),
    "several batches and a partial one": lambda: Dataset.from_dict(_rows(23)),
    "shuffled (an indices mapping)": lambda: Dataset.from_dict(_rows(23)).shuffle(seed=3),
    "a selection of other rows": lambda: Dataset.from_dict(_rows(23)).select([7, 1, 22, 1]),
    "no rows": lambda: Dataset.from_dict(_rows(0)),
}


@pytest.mark.parametrize("name", list(DATASETS))
def test_the_data_fingerprint_is_the_key_checkpoints_recorded_and_one_changed_cell_changes_it(monkeypatch, name):
    monkeypatch.setattr(resume, "ROWS_PER_BATCH", 4)
    dataset = DATASETS[name]()
    assert resume.rows_fingerprint(dataset) == state_key(dataset.to_dict())  # an older checkpoint's key still fits
    changed = {"prompt": [{"role": "user", "content": "changed"}], "answer": "changed", "id": -1, "extra": 2.5}
    key = resume.rows_fingerprint(dataset)
    for row in sorted({0, 3, 4, len(dataset) // 2, len(dataset) - 1} & set(range(len(dataset)))):  # batch edges
        for column in dataset.column_names:
            values = dataset.to_dict()
            values[column][row] = changed[column]
            other = Dataset.from_dict(values, features=dataset.features)
            assert resume.rows_fingerprint(other) != key, (row, column)


def test_a_resume_on_the_same_rows_goes_on_and_on_one_changed_cell_is_refused(tmp_path):
    dataset = Dataset.from_dict(_rows(30))
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    old_record = {"data": {"dataset_name": "d.jsonl", "rows": 30, "fingerprint": state_key(dataset.to_dict())}}
    (folder / SHAPE_NAME).write_text(json.dumps(old_record))  # as the earlier version recorded it
    assert data_mismatch(folder, "d.jsonl", dataset, False) is None
    edited = dataset.to_dict()
    edited["answer"][17] = "another answer"
    message = data_mismatch(folder, "d.jsonl", Dataset.from_dict(edited), False)
    assert "was trained on other data" in message and "30 rows then and now, with other content" in message


def test_the_data_fingerprint_holds_one_batch_in_memory_not_the_data(monkeypatch):
    monkeypatch.setattr(resume, "ROWS_PER_BATCH", 100)
    text = [f"{i:08d}" + "é" * 492 for i in range(8000)]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": t}] for t in text], "answer": text})
    size = 8000 * 2 * 500  # characters, in Arrow memory (not traced); state_key(to_dict()) peaked at 5 times this
    tracemalloc.start()
    try:
        resume.rows_fingerprint(dataset)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 8, f"{peak} bytes of Python objects at the peak, for {size} bytes of text"
