"""The fault table's kit (tests/fault_table.py): what a case is (`Fault`), the set-ups every part of the table
shares (a recipe, a training command, a data file, a trained adapter or checkpoint, an OS fault at its boundary,
packages hidden), how a case is judged (`judge`), and a case run as a user runs it (`run_subprocess`:
`python -m grpo_pipeline.pipeline` in a process of its own; tests/test_faults.py runs the rest in-process).

tests/cli_helpers.py `fault_table` hands these set-ups to the tests that build the same folders. Not a test module.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass
class Fault:
    name: str
    setup: Callable[[Path], list[str]]
    expect: str  # text the output must contain (case-sensitive)
    exit_code: int = 2
    env: dict[str, str] = field(default_factory=dict)
    patch: Optional[Callable] = None  # (monkeypatch, folder) -> None; in-process runs only
    hide: tuple[str, ...] = ()  # packages the case runs without, installed or not (a subprocess: hidden_env)
    after: Optional[Callable[[Path], Optional[str]]] = None  # what is wrong with the folder afterwards, or None
    absent: str = ""  # text the output must not contain (a secret), when given


# ---------------------------------------------------------------- set-up helpers


def recipe(folder: Path, text: str = "", name: str = "recipe.yaml") -> Path:
    """A tiny-demo recipe (CPU, plain backend, built-in data) plus `text`; loads nothing heavy until training."""
    import yaml

    from grpo_pipeline.pipeline.demo.registry import cpu_demo_config

    # plots off, as train_helpers' configs (PLOTS_IN_TEST_RUNS: a second of CPU a run); no case here is about them
    base = {**cpu_demo_config(), "output_dir": str(folder / "run"), "data_cache_dir": str(folder / "cache"),
            "max_samples": 8, "per_device_train_batch_size": 4, "num_generations": 4, "plots": False}
    # the keys `text` sets replace the base's (a key given twice is refused); `text` stays raw (syntax errors)
    overridden = {line.split(":", 1)[0].strip() for line in text.splitlines() if ":" in line and line[:1].isalpha()}
    base = {key: value for key, value in base.items() if key not in overridden}
    path = folder / name
    # `text` first, so a case's line numbers do not move when the demo config gains a key
    text = text if not text or text.endswith("\n") else text + "\n"
    path.write_text(text + yaml.safe_dump(base, allow_unicode=True), encoding="utf-8")
    return path


def train(folder: Path, text: str = "", *extra: str) -> list[str]:
    return ["train", "--config", str(recipe(folder, text)), *extra]


def data_file(folder: Path, content: bytes) -> list[str]:
    path = folder / "data.jsonl"
    path.write_bytes(content)
    return train(folder, f"dataset_name: {path}\n")


_ADAPTERS: dict[str, Path] = {}  # base -> the run folder of the one adapter saved on it in this process


def adapter(folder: Path, base: str = "tiny-qwen2.5") -> Path:
    """A real (untrained) LoRA saved by peft on the tiny Qwen2 (or `base`), with a manifest beside it as `grpo train`
    writes: saved once a process for each base, then copied into `folder/run` (a case may damage its copy)."""
    if base not in _ADAPTERS:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path

        first = Path(tempfile.mkdtemp(prefix="grpo-faults-adapter-")) / "run"
        atexit.register(shutil.rmtree, first.parent, True)
        model = AutoModelForCausalLM.from_pretrained(resolve_model_path(base))
        lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
        lora.save_pretrained(str(first / "lora"))
        config_path = first / "lora" / "adapter_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config["base_model_name_or_path"] = base
        config_path.write_text(json.dumps(config), encoding="utf-8")
        (first / "manifest.json").write_text(json.dumps({"base_model": base, "max_lora_rank": 64}), encoding="utf-8")
        _ADAPTERS[base] = first
    out = folder / "run" / "lora"
    shutil.copytree(_ADAPTERS[base] / "lora", out)
    shutil.copy(_ADAPTERS[base] / "manifest.json", folder / "run" / "manifest.json")
    return out


def edit_adapter_config(path: Path, **changes) -> None:
    config_path = path / "adapter_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update(changes)
    config_path.write_text(json.dumps(config), encoding="utf-8")


def corrupt_manifest(folder: Path) -> list[str]:
    lora = adapter(folder)
    (folder / "run" / "manifest.json").write_text('{"base_model": "tiny-qwen2.5", ', encoding="utf-8")
    return ["generate", "--lora", str(lora), "--prompt", "1+1?", "--backend", "plain"]


def rank_mismatch(folder: Path) -> list[str]:
    lora = adapter(folder)
    edit_adapter_config(lora, r=8)  # the weights have rank 4
    return ["generate", "--lora", str(lora), "--prompt", "1+1?", "--backend", "plain"]


def other_base(folder: Path, command: str) -> list[str]:
    """An adapter whose recorded base (a wider tiny Qwen2) is not the model its weights were trained on."""
    from grpo_pipeline.pipeline.demo.model import build_tiny_qwen2

    wide = folder / "wide-base"
    build_tiny_qwen2(vocab_size=256, hidden_size=128, intermediate_size=256).save_pretrained(str(wide))
    lora = adapter(folder)
    (folder / "run" / "manifest.json").write_text(json.dumps({"base_model": str(wide), "max_lora_rank": 64}),
                                                  encoding="utf-8")
    if command == "export":
        return ["export", "--lora", str(lora), "--to", "merged16", "--out", str(folder / "merged"),
                "--backend", "plain"]
    return ["generate", "--lora", str(lora), "--prompt", "1+1?", "--backend", "plain"]


def adapter_without_metadata(folder: Path) -> list[str]:
    """A lora/ folder copied away from its run: no manifest.json beside it, no grpo_adapter.json inside."""
    lora = adapter(folder)
    moved = folder / "copied-lora"
    lora.rename(moved)
    return ["generate", "--lora", str(moved), "--prompt", "1+1?", "--backend", "plain"]


def broken_checkpoint(folder: Path) -> list[str]:
    ckpt = folder / "run" / "checkpoint-5"
    ckpt.mkdir(parents=True)
    (ckpt / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    return train(folder, "", "--resume", str(ckpt))


def read_only(monkeypatch, folder: Path) -> None:
    """A read-only mount, simulated where the write test meets the OS."""
    import errno
    import tempfile as tempfile_module

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile_module, "mkstemp", refuse)


def disk_full(monkeypatch, folder: Path) -> None:
    """torch.save's own report of a full disk (as in a real run), at the first checkpoint's optimizer save."""
    import torch

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:659] . unexpected pos 1152 vs 1040: "
                           "PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", full)


def disk_full_enospc(monkeypatch, folder: Path) -> None:
    """The OS's ENOSPC where peft writes the adapter weights (safetensors' serialize_file)."""
    import errno

    import peft.peft_model

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(peft.peft_model, "safe_save_file", full)


def no_partial_checkpoint(folder: Path) -> Optional[str]:
    left = sorted(p.name for p in (folder / "run").glob("checkpoint-*"))
    return f"half-written checkpoint(s) left behind: {left}" if left else None


# sitecustomize for a subprocess that must run as if some packages were not installed: the path finder skips
# them, so importlib.util.find_spec returns None and `import` raises ModuleNotFoundError, as without the package.
_HIDE_SITECUSTOMIZE = """\
import importlib.machinery, sys

HIDDEN = {hidden!r}


class _Hiding(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [_Hiding if finder is importlib.machinery.PathFinder else finder for finder in sys.meta_path]
"""


def empty_folder(folder: Path, name: str = "empty model") -> Path:
    (folder / name).mkdir()
    return folder / name


def hidden_env(names: tuple[str, ...], folder: Path) -> dict[str, str]:
    """PYTHONPATH for a subprocess that cannot see `names` (a sitecustomize.py in folder/.hide)."""
    site = folder / ".hide"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_HIDE_SITECUSTOMIZE.format(hidden=set(names)), encoding="utf-8")
    return {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def checkpoint_of_another_shape(folder: Path, shape: Optional[dict] = None, settings: Optional[dict] = None,
                                text: str = "") -> list[str]:
    """A complete checkpoint whose grpo_shape.json records the recipe's weight shape and resume settings
    (pipeline/run/resume.py checkpoint_record) with `shape` and `settings` in place of the recipe's values;
    by default another LoRA rank."""
    import numpy as np
    from safetensors.numpy import save_file

    from grpo_pipeline.pipeline.config import from_mapping
    from grpo_pipeline.pipeline.run.resume import SHAPE_NAME, checkpoint_record, resume_key

    argv = train(folder, text)
    import yaml

    cfg = from_mapping(yaml.safe_load((folder / "recipe.yaml").read_text(encoding="utf-8")))
    ckpt = folder / "run" / "checkpoint-1"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 1, "max_steps": 5}), encoding="utf-8")
    save_file({"lora_A": np.zeros((2, 2), dtype=np.float32)}, str(ckpt / "adapter_model.safetensors"))
    kept = checkpoint_record(resume_key(cfg))
    kept = {**kept, **(shape if shape is not None else {"lora_r": 99}),
            "settings": {**kept["settings"], **(settings or {})}}
    (ckpt / SHAPE_NAME).write_text(json.dumps(kept), encoding="utf-8")
    return argv


SHORT_RUN = "max_steps: 1\nsave_steps: 1\nsft_warmup_steps: 0\neval_before: false\neval_after: false\n"


# A short run for the cases below (fault_table.py and its parts use it too).
QUICK = "sft_warmup_steps: 0\nmax_steps: 1\neval_before: false\neval_after: false\n"  # a case that fails costs seconds


def quick(folder: Path, *extra: str) -> list[str]:
    return train(folder, QUICK, *extra)


# The base of the adapters that cases export, generate or evaluate with: the CPU demo's model (one token a byte), whose
# tokenizer loads in milliseconds where the tiny Qwen2's real Qwen2.5 tokenizer takes about a second each time.
RUNNABLE_BASE = "tiny-demo"


def export_onto(folder: Path, target: str, *extra: str) -> list[str]:
    """`grpo export` of a fresh adapter with --out set to a place relative to the run (`lora`, `.`, ...)."""
    lora = adapter(folder, RUNNABLE_BASE)
    out = (folder / "run" / target).resolve() if target != "new" else folder / "merged"
    return ["export", "--lora", str(lora), "--to", "merged16", "--out", str(out), "--backend", "plain", *extra]


def generate_with(folder: Path, *args: str) -> list[str]:
    return ["generate", "--lora", str(adapter(folder, RUNNABLE_BASE)), *args, "--backend", "plain"]


def raise_in(target: str, error: BaseException) -> Callable:
    def patch(monkeypatch, folder: Path) -> None:
        def fail(*args, **kwargs):
            raise error

        monkeypatch.setattr(target, fail)

    return patch


def mine(path: Path) -> None:
    path.mkdir(parents=True)
    (path / "mine.txt").write_text("mine", encoding="utf-8")


# One trained checkpoint, built once per process (fault_boundaries.py's checkpoint cases, tests).
ROWS = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]
_TRAINED: dict[str, Path] = {}


def rows_file(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def trained_checkpoint(folder: Path, rows: list[dict] = ROWS, *extra: str) -> list[str]:
    """`grpo train` resuming a real checkpoint-1 (trained once a process on ROWS, then copied into `folder/run`),
    on a data file of `rows`, for max_steps 2."""
    from grpo_pipeline.pipeline.cli import main as grpo

    if "run" not in _TRAINED:
        first = Path(tempfile.mkdtemp(prefix="grpo-faults-v4-"))
        atexit.register(shutil.rmtree, first, True)
        if grpo(train(first, f"dataset_name: {rows_file(first / 'data.jsonl', ROWS)}\n" + SHORT_RUN)) != 0:
            raise RuntimeError("the run that makes the cases' checkpoint failed")
        _TRAINED["run"] = first / "run"
    shutil.copytree(_TRAINED["run"] / "checkpoint-1", folder / "run" / "checkpoint-1")
    longer = SHORT_RUN.replace("max_steps: 1", "max_steps: 2")
    text = f"dataset_name: {rows_file(folder / 'data.jsonl', rows)}\n" + longer
    return [*train(folder, text), *extra]


def judge(case: Fault, exit_code: int, output: str, folder: Optional[Path] = None) -> Optional[str]:
    """None when the case held, else what went wrong."""
    if case.after is not None and folder is not None and case.after(folder):
        return case.after(folder)
    if "Traceback" in output:
        return "printed a traceback"
    if case.absent and case.absent in output:
        return f"printed {case.absent!r}"
    if exit_code != case.exit_code:
        return f"exit {exit_code}, expected {case.exit_code}"
    if case.expect not in output:
        return f"output lacks {case.expect!r}"
    return None


def run_subprocess(case: Fault, folder: Path) -> tuple[int, str]:
    argv = case.setup(folder)
    env = {**os.environ, **OFFLINE_ENV, **case.env, "PYTHONPATH": str(ROOT)}
    if case.hide:
        env.update(hidden_env(case.hide, folder))
    done = subprocess.run([sys.executable, "-m", "grpo_pipeline.pipeline", *argv], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    return done.returncode, done.stdout + done.stderr
