"""The fault table: bad inputs and faults a user meets, each driven through the real `grpo` CLI.

    python bench/faults.py            # every case as `python -m pipeline ...` in a subprocess; prints held/tried

A case holds when the command exits with the expected code, its output contains the expected text (the
field or file and the fix) and no "Traceback". tests/test_faults.py runs the same table in-process.

The table is data: append a `Fault` to CASES to add a case. `setup(folder)` writes whatever the case
needs into an empty folder and returns the argv after `grpo`; `patch` (in-process only) simulates an OS
fault at its boundary with pytest's monkeypatch, and the subprocess runner skips (does not count) such cases;
`hide` names packages the case runs without (a subprocess in both runners, whether or not they are installed).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
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

    from pipeline.demo.registry import cpu_demo_config

    base = {**cpu_demo_config(), "output_dir": str(folder / "run"), "data_cache_dir": str(folder / "cache"),
            "max_samples": 8, "per_device_train_batch_size": 4, "num_generations": 4}
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


def adapter(folder: Path, base: str = "tiny-qwen2.5") -> Path:
    """A real (untrained) LoRA saved by peft on the tiny Qwen2, with a manifest beside it as `grpo train` writes."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from pipeline.data.tokenizer import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(base))
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    out = folder / "run" / "lora"
    lora.save_pretrained(str(out))
    config_path = out / "adapter_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = base
    config_path.write_text(json.dumps(config), encoding="utf-8")
    (folder / "run" / "manifest.json").write_text(json.dumps({"base_model": base, "max_lora_rank": 64}),
                                                  encoding="utf-8")
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
    from pipeline.demo.model import build_tiny_qwen2

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


CASES: list[Fault] = [
    Fault("learning_rate <= 0", lambda d: train(d, "learning_rate: 0\n"), "`learning_rate`: got 0; it must be > 0"),
    Fault("negative learning_rate on the command line", lambda d: train(d, "", "--learning_rate=-1e-5"),
          "`learning_rate`"),
    Fault("float for an int field", lambda d: train(d, "max_steps: 1.5\n"), "recipe.yaml line 1: got 1.5"),
    Fault("NaN in a float field", lambda d: train(d, "beta: .nan\n"), "line 1: got nan; use a finite number"),
    Fault("out-of-range share", lambda d: train(d, "warmup_ratio: 1.5\n"), "`warmup_ratio`: got 1.5"),
    Fault("not a number on the command line", lambda d: train(d, "", "--max_steps", "ten"),
          "`max_steps`: got 'ten'; use an integer"),
    Fault("recipe given without --config", lambda d: ["train", str(recipe(d))], "write --config"),
    Fault("YAML syntax error", lambda d: train(d, "max_steps: [1\nbeta: 0\n"), "recipe.yaml line"),
    Fault("--config=FILE", lambda d: ["train", f"--config={recipe(d, 'max_steps: 1.5')}"], "`max_steps`"),
    Fault("unknown YAML key", lambda d: train(d, "lerning_rate: 1e-5\n"), "did you mean `learning_rate`"),
    Fault("unknown command-line option", lambda d: train(d, "", "--num_generation", "4"),
          "did you mean `num_generations`"),
    Fault("output_dir is a file", lambda d: train(d, "", "--output_dir", str(recipe(d, name="x.yaml"))),
          "is a file, not a folder"),
    Fault("output_dir on a read-only mount", lambda d: train(d), "read-only file system", patch=read_only),
    Fault("empty data file", lambda d: data_file(d, b""), "data.jsonl is empty"),
    Fault("non-UTF-8 data file", lambda d: data_file(d, b'{"question": "1+1?", "answer": "2"}\n'
                                                     b'{"question": "\xb2\xe2\xca\xd4", "answer": "3"}\n'),
          "data.jsonl line 2 is not UTF-8"),
    Fault("broken JSON line", lambda d: data_file(d, b'{"question": "1+1?", "answer": "2"}\n{"question": "x\n'),
          "data.jsonl line 2 is not valid JSON"),
    Fault("model not reachable offline", lambda d: train(d, "model_name_or_path: nobody/no-such-model\n"),
          "huggingface-cli download nobody/no-such-model", env=OFFLINE_ENV),
    Fault("model not reachable offline (grpo data)",
          lambda d: ["data", "--config", str(recipe(d, "model_name_or_path: nobody/no-such-model\n"))],
          "model 'nobody/no-such-model' is not in the local Hugging Face cache", env=OFFLINE_ENV),
    Fault("base model not reachable offline (grpo generate --base)",
          lambda d: ["generate", "--base", "--model", "nobody/no-such-model", "--prompt", "1+1?", "--backend",
                     "plain"], "huggingface-cli download nobody/no-such-model", env=OFFLINE_ENV),
    # the model folder apart from the run folder: an output_dir inside the model's folder is refused first
    Fault("model folder without config.json", lambda d: train(d, f"model_name_or_path: {empty_folder(d)}\n"),
          "no config.json"),
    Fault("corrupt manifest.json", corrupt_manifest, "manifest.json is corrupt"),
    Fault("adapter rank does not match its weights", rank_mismatch, "says rank r=8, but"),
    Fault("adapter base mismatch (generate)", lambda d: other_base(d, "generate"), "does not fit base model"),
    Fault("adapter base mismatch (export)", lambda d: other_base(d, "export"), "does not fit base model"),
    Fault("report_to tensorboard without the package", lambda d: train(d, "report_to: tensorboard\n"),
          "grpo-pipeline[tensorboard]", hide=("tensorboard",)),
    Fault("report_to wandb without the package", lambda d: train(d, "report_to: wandb\n"), "pip install wandb",
          hide=("wandb",)),
    Fault("adapter copied away from its run, without metadata", adapter_without_metadata,
          "no grpo_adapter.json inside"),
    Fault("grpo eval --base with nowhere to write", lambda d: ["eval", "--base", "--model", "tiny-qwen2.5", "--data",
                                                                 "demo-arithmetic", "--backend", "plain"],
          "--base without --run"),
    Fault("--resume unknown word", lambda d: train(d, "", "--resume", "latest"), "neither auto, never nor"),
    Fault("--resume broken checkpoint", broken_checkpoint, "cannot be resumed from"),
    Fault("disk full at a checkpoint",
          lambda d: train(d, "max_steps: 1\nsave_steps: 1\nsft_warmup_steps: 0\neval_before: false\n"
                          "eval_after: false\n"),
          "the disk is full", patch=disk_full, after=no_partial_checkpoint),
    Fault("disk full (ENOSPC) writing the adapter weights",
          lambda d: train(d, "max_steps: 1\nsave_steps: 1\nsft_warmup_steps: 0\neval_before: false\n"
                          "eval_after: false\n"),
          "the disk is full", patch=disk_full_enospc, after=no_partial_checkpoint),
    Fault("--check with bad data (JSON)", lambda d: [*data_file(d, b""), "--check"], '"ok": false'),
    Fault("--check passes", lambda d: [*train(d), "--check"], '"ok": true', exit_code=0),
]


# ---------------------------------------------------------------- saves, resume and config semantics (issue 22)
# docs/reliability.md "Saves and resume"; the kill-at-every-moment and interrupt tables are tests/test_saves.py
# and tests/test_interrupts.py (they need real training).


def duplicate_key(folder: Path) -> list[str]:
    return train(folder, "beta: 0.0\nlearning_rate: 1e-5\nbeta: 0.04\n")


def checkpoint_of_another_shape(folder: Path, shape: Optional[dict] = None, settings: Optional[dict] = None,
                                text: str = "") -> list[str]:
    """A complete checkpoint whose grpo_shape.json records the recipe's weight shape and resume settings
    (pipeline/run/resume.py checkpoint_record) with `shape` and `settings` in place of the recipe's values;
    by default another LoRA rank."""
    import numpy as np
    from safetensors.numpy import save_file

    from pipeline.config import from_mapping
    from pipeline.run.resume import SHAPE_NAME, checkpoint_record

    argv = train(folder, text)
    import yaml

    cfg = from_mapping(yaml.safe_load((folder / "recipe.yaml").read_text(encoding="utf-8")))
    ckpt = folder / "run" / "checkpoint-1"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 1, "max_steps": 5}), encoding="utf-8")
    save_file({"lora_A": np.zeros((2, 2), dtype=np.float32)}, str(ckpt / "adapter_model.safetensors"))
    kept = checkpoint_record(cfg)
    kept = {**kept, **(shape if shape is not None else {"lora_r": 99}),
            "settings": {**kept["settings"], **(settings or {})}}
    (ckpt / SHAPE_NAME).write_text(json.dumps(kept), encoding="utf-8")
    return argv


def disk_full_safetensors(monkeypatch, folder: Path) -> None:
    """safetensors' own exception class (neither OSError nor RuntimeError) for a full disk, at the checkpoint."""
    import peft.peft_model

    class SafetensorError(Exception):
        pass

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(peft.peft_model, "safe_save_file", full)


SHORT_RUN = "max_steps: 1\nsave_steps: 1\nsft_warmup_steps: 0\neval_before: false\neval_after: false\n"

CASES += [
    Fault("duplicate YAML key", duplicate_key, "`beta` is set twice (first on line"),
    Fault("max_steps: 0", lambda d: train(d, "max_steps: 0\n"), "`max_steps`: got 0, which trains nothing"),
    Fault("negative seed", lambda d: train(d, "seed: -1\n"), "`seed`: got -1"),
    Fault("--resume auto after changing lora_r", checkpoint_of_another_shape, "lora_r 99 -> "),
    Fault("disk full: safetensors' own error class", lambda d: train(d, SHORT_RUN), "the disk is full",
          patch=disk_full_safetensors, after=no_partial_checkpoint),
    Fault("grpo eval --limit 0", lambda d: ["eval", "--base", "--model", "tiny-qwen2.5", "--data", "demo-arithmetic",
                                            "--limit", "0", "--output", str(d / "eval.json"), "--backend", "plain"],
          "--limit 0: use a positive number"),
    Fault("grpo generate --max_tokens 0", lambda d: ["generate", "--base", "--model", "tiny-qwen2.5", "--prompt",
                                                     "1+1?", "--max_tokens", "0", "--backend", "plain"],
          "--max_tokens 0: use a positive number"),
]


# ---------------------------------------------------------------- paths, destructive outputs, messages, bugs
# (issue 22, points 1, 2, 8, 9: env/path_check.py, pipeline/errors.py; tests/test_path_check.py and
# tests/test_errors.py run each class over every option and command)


QUICK = "sft_warmup_steps: 0\nmax_steps: 1\neval_before: false\neval_after: false\n"  # a case that fails costs seconds


def quick(folder: Path, *extra: str) -> list[str]:
    return train(folder, QUICK, *extra)


def read_only_dir(folder: Path) -> str:
    (folder / "ro").mkdir()
    return str(folder / "ro" / "c")


def export_onto(folder: Path, target: str, *extra: str) -> list[str]:
    """`grpo export` of a fresh adapter with --out set to a place relative to the run (`lora`, `.`, ...)."""
    lora = adapter(folder)
    out = (folder / "run" / target).resolve() if target != "new" else folder / "merged"
    return ["export", "--lora", str(lora), "--to", "merged16", "--out", str(out), "--backend", "plain", *extra]


def run_intact(folder: Path) -> Optional[str]:
    from env.adapters import AdapterError, verify_adapter_dir

    try:
        verify_adapter_dir(folder / "run" / "lora")
    except AdapterError as err:
        return f"the adapter was damaged: {err}"
    return None if (folder / "run" / "manifest.json").is_file() else "the run's manifest.json is gone"


def generate_with(folder: Path, *args: str) -> list[str]:
    return ["generate", "--lora", str(adapter(folder)), *args, "--backend", "plain"]


def questions(folder: Path, text: str = '{"prompt": "1+1?"}\n{"prompt": \n') -> str:
    path = folder / "my questions.jsonl"
    path.write_text(text, encoding="utf-8")
    return str(path)


def symlink_loop(folder: Path) -> str:
    (folder / "loop").symlink_to(folder / "loop")
    return str(folder / "loop" / "run")


def read_only_under(name: str) -> Callable:
    def patch(monkeypatch, folder: Path) -> None:
        import errno
        import tempfile as tempfile_module

        real = tempfile_module.mkstemp

        def refuse(*args, dir=None, **kwargs):
            if dir is not None and name in Path(dir).parts:
                raise OSError(errno.EROFS, "Read-only file system")
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile_module, "mkstemp", refuse)

    return patch


def raise_in(target: str, error: BaseException) -> Callable:
    def patch(monkeypatch, folder: Path) -> None:
        def fail(*args, **kwargs):
            raise error

        monkeypatch.setattr(target, fail)

    return patch


def my_folder(folder: Path) -> list[str]:
    mine = folder / "my-notes"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine", encoding="utf-8")
    return export_onto(folder, "../my-notes", "--overwrite")


PATH_CASES: list[Fault] = [
    Fault("export --out the adapter --overwrite", lambda d: export_onto(d, "lora", "--overwrite"),
          "is --lora", after=run_intact),
    Fault("export --out the run folder --overwrite", lambda d: export_onto(d, ".", "--overwrite"),
          "contains --lora", after=run_intact),
    Fault("export --out inside the adapter", lambda d: export_onto(d, "lora/merged"), "is inside --lora",
          after=run_intact),
    Fault("export --overwrite onto a folder it did not write", my_folder, "only replaces a folder that `grpo export`"),
    Fault("unset $VAR in output_dir", lambda d: train(d, QUICK + "output_dir: $GRPO_FAULTS_UNSET/run\n"),
          "$GRPO_FAULTS_UNSET, which is not set"),
    Fault("empty $VAR in data_cache_dir", lambda d: quick(d, "--data_cache_dir", "${GRPO_FAULTS_EMPTY}/c"),
          "which is set but empty", env={"GRPO_FAULTS_EMPTY": ""}),
    Fault("data_cache_dir on a read-only mount", lambda d: quick(d, "--data_cache_dir", read_only_dir(d)),
          "config error in `data_cache_dir`", patch=read_only_under("ro")),
    Fault("output_dir through a symlink loop", lambda d: quick(d, "--output_dir", symlink_loop(d)),
          "is a symlink loop"),
    Fault("--config is a folder", lambda d: ["train", "--config", str(d)], "is a folder; it should be a file"),
    Fault("--resume is a file", lambda d: quick(d, "--resume", str(recipe(d, name="x.yaml"))),
          "config error in `resume`"),
    Fault("an existing folder as generate --output",
          lambda d: generate_with(d, "--prompt", "1+1?", "--output", str(d)), "is a folder; give a file name"),
    Fault("generate --output is its --input", lambda d: generate_with(d, "--input", questions(d, '{"prompt": "1"}\n'),
                                                                      "--output", str(d / "my questions.jsonl")),
          "is --input"),
    Fault("bad line in generate --input", lambda d: generate_with(d, "--input", questions(d)),
          "my questions.jsonl line 2: is not valid JSON"),
    Fault("eval --output inside the adapter",
          lambda d: ["eval", "--lora", str(adapter(d)), "--data", "demo-arithmetic", "--output",
                     str(d / "run" / "lora" / "eval.json"), "--backend", "plain"], "is inside --lora"),
    Fault("a bug is one line and exit 1", lambda d: generate_with(d, "--prompt", "1+1?"),
          "stopped on an internal error, a bug", exit_code=1,
          patch=raise_in("pipeline.data.model_check.check_model", RuntimeError("injected"))),
    Fault("Ctrl-C before training is exit 130", lambda d: quick(d),
          "interrupted", exit_code=130, patch=raise_in("pipeline.preflight.check_report_to", KeyboardInterrupt())),
]
CASES += PATH_CASES

# ---------------------------------------------------------------- faults v3: libraries, config and messages
# (issue 36, points 4-6: library errors translated where we call them (pipeline/data/sources.py, data/tokenizer.py,
# rewards/contract.py), a recipe read once and bounded messages (pipeline/config/parse.py, env/text.py), numeric
# bounds (config/fields.py, trl_fields.TRL_BOUNDS), outputs inside inputs (env/path_check.py), cwd writes.
# tests/test_data_faults.py, test_config_bounds-style tables in test_config_rules.py, test_config_plumbing.py,
# test_path_check.py and test_cwd_writes.py run each class over its whole class)


def recipe_fifo(folder: Path) -> list[str]:
    """`grpo data --config FIFO`: a recipe that can be read only once, as `--config <(...)` gives it."""
    import threading

    text = recipe(folder, "max_samples: 4\n", name="source.yaml").read_text(encoding="utf-8")
    fifo = folder / "recipe.fifo"
    os.mkfifo(fifo)
    threading.Thread(target=lambda: fifo.write_text(text, encoding="utf-8"), daemon=True).start()
    return ["data", "--config", str(fifo)]


def alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nlora_target_modules: *a{levels - 1}\n"


def local_data_file(folder: Path, name: str, content: bytes, *extra: str) -> list[str]:
    path = folder / name
    path.write_bytes(content)
    return train(folder, f"dataset_name: {path}\n" + "".join(extra))


def cache_inside_data(folder: Path) -> list[str]:
    data = folder / "my data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"question": "What is 1+1?", "answer": "2"}\n', encoding="utf-8")
    return train(folder, QUICK + f"dataset_name: {data}\ndata_cache_dir: {data / 'cache'}\n")


def broken_tokenizer_model(folder: Path) -> list[str]:
    import shutil

    from pipeline.assets import qwen_tokenizer_dir

    model = folder / "my model"
    shutil.copytree(qwen_tokenizer_dir(), model)
    shutil.copy(ROOT / "pipeline" / "assets" / "model-configs" / "qwen2.5-0.5b.json", model / "config.json")
    (model / "tokenizer.json").write_text('{"version": broken', encoding="utf-8")
    return ["data", "--dataset_name", "sample", "--model_name_or_path", str(model), "--output_dir", str(folder / "r"),
            "--data_cache_dir", str(folder / "cache")]


def raising_plugin_reward(folder: Path) -> list[str]:
    (folder / "v3_plugin_rewards.py").write_text("def bad(prompts, completions, **kwargs):\n"
                                          "    return [1.0 / 0 for c in completions]\n", encoding="utf-8")
    plugged = recipe(folder, QUICK + "reward_funcs: [v3_plugin_rewards:bad]\n")
    return ["rewards", "--config", str(plugged), "--prompts", "2"]


def eval_from_elsewhere(folder: Path) -> list[str]:
    """`grpo eval --config` with a recipe whose output_dir is the (relative) default, run from `folder`."""
    bare = folder / "bare.yaml"
    bare.write_text("".join(line for line in recipe(folder).read_text(encoding="utf-8").splitlines(keepends=True)
                            if not line.startswith("output_dir:")), encoding="utf-8")
    return ["eval", "--lora", str(adapter(folder)), "--config", str(bare), "--limit", "2", "--max_tokens", "4",
            "--backend", "plain", "--output", str(folder / "results" / "eval.json")]


def wrote_into_cwd(folder: Path) -> Optional[str]:
    stray = sorted(p.name for p in folder.iterdir() if p.name not in {"run", "results", "bare.yaml", "recipe.yaml",
                                                                       "cache"})
    return f"wrote into the folder it was run from: {stray}" if stray else None


CRASH_CACHE = os.path.join(tempfile.gettempdir(), "GRPO Faults Cache")  # capitals and a space: printed as it is

V3_CASES: list[Fault] = [
    Fault("temperature 1e-40", lambda d: train(d, "temperature: 1.0e-40\n"),
          "`temperature`: got 1e-40; it must be >= 1e-05"),
    Fault("a TRL option past its bound", lambda d: train(d, "num_iterations: 0\n"),
          "`num_iterations`: got 0; it must be >= 1"),
    Fault("--config from a FIFO (read once)", recipe_fifo, "4 kept", exit_code=0),
    Fault("YAML alias bomb", lambda d: train(d, alias_bomb()), "aliases expand to more than 100,000 values"),
    Fault("lone surrogate in a JSONL file",
          lambda d: data_file(d, b'{"question": "1+1?", "answer": "2"}\n{"question": "x\\ud800", "answer": "3"}\n'),
          "data.jsonl line 2 holds a lone surrogate"),
    Fault("header-only CSV", lambda d: local_data_file(d, "data.csv", b"question,answer\n"),
          "data.csv has a header (question,answer) but no rows"),
    Fault("header-only Parquet", lambda d: local_data_file(d, "data.parquet", _empty_parquet()),
          "data.parquet has columns (question, answer) but no rows"),
    Fault("CSV row with a cell too many", lambda d: local_data_file(d, "data.csv", b"question,answer\n1+1?,2\n"
                                                                                   b"2+2?,4,extra\n"),
          "data.csv line 3: cannot be read as CSV"),
    Fault("data_cache_dir inside the dataset's folder", cache_inside_data, "is inside dataset_name"),
    Fault("broken tokenizer.json of a local model", broken_tokenizer_model,
          "tokenizer.json line 1, column 13 is not valid JSON"),
    Fault("a raising plug-in reward names its file", raising_plugin_reward, "v3_plugin_rewards.py line 2)"),
    Fault("eval --config from another folder writes nothing there", eval_from_elsewhere, "accuracy", exit_code=0,
          after=wrote_into_cwd),
    Fault("the crash-log path is printed as it is", lambda d: generate_with(d, "--prompt", "1+1?"),
          f"The traceback is in '{CRASH_CACHE}/logs/grpo-generate-", exit_code=1, env={"GRPO_CACHE_DIR": CRASH_CACHE},
          patch=raise_in("pipeline.data.model_check.check_model", RuntimeError("injected"))),
]


def _empty_parquet() -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"question": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), sink)
    return sink.getvalue()


CASES += V3_CASES


# ---------------------------------------------------------------- faults v3: kept state
# (issue 36, point 3: every kept file is keyed through env/kept.py, a resume under a setting the checkpoint
# restores is refused by pipeline/run/resume.py resume_mismatch; tests/test_kept_state.py runs every kept file
# against every input it depends on)


def resumed_with(**settings) -> Callable[[Path], list[str]]:
    """`grpo train` resuming a checkpoint that recorded `settings` (TRL's names) where the recipe has others."""
    return lambda folder: checkpoint_of_another_shape(folder, shape={}, settings=settings)


EVAL_ROWS = ('{"question": "What is 2 + 3?", "answer": "5"}\n{"question": "What is 4 + 4?", "answer": "8"}\n',
             '{"question": "What is 6 + 1?", "answer": "7"}\n{"question": "What is 9 + 0?", "answer": "9"}\n')


def eval_file_replaced_with_same_ids(folder: Path) -> list[str]:
    """A run measured eval_before.json on one eval file and kept a checkpoint; the eval file is then replaced by
    another with as many rows (so the same row ids: test-0, test-1). The resume must measure again."""
    from pipeline.cli import main as grpo

    held_out = folder / "held-out.jsonl"
    held_out.write_text(EVAL_ROWS[0], encoding="utf-8")
    text = (f"eval_dataset_name: {held_out}\neval_before: true\neval_limit: 2\nsft_warmup_steps: 0\n"
            "eval_after: false\nsave_steps: 1\nmax_steps: 1\n")
    if grpo(train(folder, text)) != 0:
        raise RuntimeError("the first run of the case failed")
    held_out.write_text(EVAL_ROWS[1], encoding="utf-8")
    return train(folder, text.replace("max_steps: 1", "max_steps: 2"))


def data_file_edited_in_place(folder: Path) -> list[str]:
    """`grpo data` once, then the data file edited to the same size and modification time."""
    from pipeline.cli import main as grpo

    path = folder / "data.jsonl"
    path.write_text('{"question": "What is 1 + 2?", "answer": "3"}\n', encoding="utf-8")
    argv = ["data", "--config", str(recipe(folder, f"dataset_name: {path}\nsft_warmup_steps: 0\n"))]
    if grpo(argv) != 0:
        raise RuntimeError("the first `grpo data` of the case failed")
    stat = path.stat()
    path.write_text('{"question": "What is 1 + 2?", "answer": "4"}\n', encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return argv


KEPT_STATE_CASES: list[Fault] = [
    Fault("--resume auto after changing learning_rate", resumed_with(learning_rate=0.01),
          "Set them back (learning_rate: 0.01)"),
    Fault("--resume auto after changing warmup_ratio", resumed_with(warmup_steps=0.5),
          "Set them back (warmup_ratio: 0.5)"),
    Fault("--resume auto after changing per_device_train_batch_size", resumed_with(per_device_train_batch_size=2),
          "per_device_train_batch_size 2 -> 4"),
    Fault("--resume auto after changing a TRL optimiser option", resumed_with(adam_beta2=0.95),
          "adam_beta2 0.95 -> "),
    Fault("--resume auto after changing optim, in --check", lambda d: [*resumed_with(optim="sgd")(d), "--check"],
          "optim 'sgd' -> "),
    Fault("eval_before.json of another eval file with the same ids", eval_file_replaced_with_same_ids,
          "(eval_rows changed since it was written)", exit_code=0),
    Fault("data cache of a file edited to the same size and mtime", data_file_edited_in_place, "built and saved",
          exit_code=0),
]
CASES += KEPT_STATE_CASES


# ---------------------------------------------------------------- faults v3: writers and storage
# (issue 36, points 1 and 2: env/paths.py publish re-checks what each writer saw at its start; env/disk.py
# storage_failure at the one boundary, pipeline/errors.py run_command. tests/test_writers.py runs every writer x
# appeared / changed / second writer; tests/test_storage.py every command on a real full and read-only tmpfs.)


def os_fails(name: str, number: int, under: str = "") -> Callable:
    """`os.<name>` fails with errno `number` (for paths containing `under`, when given), as a full disk or a
    read-only mount makes it fail."""
    def patch(monkeypatch, folder: Path) -> None:
        real = getattr(os, name)

        def fail(*args, **kwargs):
            if not under or under in os.fsdecode(args[0] if args else ""):
                raise OSError(number, os.strerror(number), *([os.fsdecode(args[0])] if under else []))
            return real(*args, **kwargs)

        monkeypatch.setattr(os, name, fail)

    return patch


def meanwhile(target: str, make: Callable[[Path], None]) -> Callable:
    """While the command runs (when it calls `target`), `make(folder)` puts something where it will publish."""
    def patch(monkeypatch, folder: Path) -> None:
        from tests.train_helpers import resolve_dotted

        owner, attr = resolve_dotted(target)
        real, done = getattr(owner, attr), []

        def first(*args, **kwargs):
            if not done:
                done.append(target)
                make(folder)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, attr, first)

    return patch


def mine(path: Path) -> None:
    path.mkdir(parents=True)
    (path / "mine.txt").write_text("mine", encoding="utf-8")


def mine_kept(path: str) -> Callable[[Path], Optional[str]]:
    def after(folder: Path) -> Optional[str]:
        kept = folder / path / "mine.txt"
        return None if kept.is_file() and kept.read_text(encoding="utf-8") == "mine" else f"{kept} was deleted"
    return after


def another_export(folder: Path) -> None:
    """The same export, started after this one checked --out, finishing first."""
    from pipeline import cli

    argv = ["export", "--lora", str(folder / "run" / "lora"), "--to", "merged16", "--out", str(folder / "merged"),
            "--backend", "plain"]
    assert cli.main(argv) == 0


def no_complete_cache_entry(folder: Path) -> Optional[str]:
    from pipeline.data.cache import entry_is_complete

    cache = folder / "cache"
    entries = [p for p in cache.iterdir() if entry_is_complete(p) or ".tmp-" in p.name] if cache.is_dir() else []
    return f"the data cache holds {entries} after a failed save" if entries else None


def nothing_at(path: str) -> Callable[[Path], Optional[str]]:
    return lambda folder: f"{path} was left behind" if (folder / path).exists() else None


def data_cache_full(monkeypatch, folder: Path) -> None:
    """pyarrow/datasets' write of the prepared rows meets a full disk."""
    import errno

    import datasets

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", full)


CASES += [
    Fault("export --out made by the user while exporting", lambda d: export_onto(d, "new"),
          "appeared after this command started", patch=meanwhile("pipeline.infer.export.carry_training_defaults",
                                                                 lambda d: mine(d / "merged")),
          after=mine_kept("merged")),
    Fault("two exports to one --out", lambda d: export_onto(d, "new"), "Pass --overwrite to replace it",
          patch=meanwhile("pipeline.infer.export.carry_training_defaults", another_export)),
    Fault("generate --output written by another program meanwhile",
          lambda d: generate_with(d, "--prompt", "1+1?", "--max_tokens", "4", "--output", str(d / "out" / "a.jsonl")),
          "appeared after this command started",
          patch=meanwhile("pipeline.infer.generate.generate_answers", lambda d: mine(d / "out" / "a.jsonl"))),
    Fault("the data cache saved to a full disk", lambda d: ["data", "--config", str(recipe(d))],
          "the disk is full: could not save in", patch=data_cache_full, after=no_complete_cache_entry),
    Fault("generate --output on a full disk",
          lambda d: generate_with(d, "--prompt", "1+1?", "--max_tokens", "4", "--output", str(d / "a.jsonl")),
          "point --output at a larger disk", patch=os_fails("open", 28, under="a.jsonl"), after=nothing_at("a.jsonl")),
    Fault("eval --output on a full disk",
          lambda d: ["eval", "--lora", str(adapter(d)), "--data", "demo-arithmetic", "--limit", "2", "--max_tokens",
                     "4", "--output", str(d / "e.json"), "--backend", "plain"],
          "point --output at a larger disk", patch=os_fails("open", 28, under="e.json"), after=nothing_at("e.json")),
    Fault("the built-in model built into a read-only cache root", lambda d: quick(d),
          "Point GRPO_CACHE_DIR (the cache root", env={"GRPO_CACHE_DIR": "/grpo-faults-ro-cache"},
          patch=os_fails("mkdir", 30, under="/grpo-faults-ro-cache")),
    Fault("output_dir on a full disk (the run's first write)", lambda d: quick(d),
          "point output_dir at a larger disk", patch=os_fails("fsync", 28)),
]


# ---------------------------------------------------------------- faults v4 (issue 48)
# 1. secrets: env/secret_fields.py (names a secret; masked in every file and printed line); tests/test_secrets.py
#    scans every file of a real run, checkpoint and export for the value.

SECRET = "hf_FaultsV4SecretValue"


def no_secret_under(folder: Path) -> Optional[str]:
    """Every file under `folder` (the run, its checkpoints, crash logs, the cache's logs), scanned for SECRET."""
    for path in folder.rglob("*"):
        if path.is_file() and SECRET.encode() in path.read_bytes():
            return f"{path} holds the secret"
    return None


CASES += [
    Fault("--check with a hub_token prints its placeholder", lambda d: [*quick(d, "--hub_token", SECRET), "--check"],
          "hub_token='<HUB_TOKEN>'", exit_code=0, absent=SECRET, after=no_secret_under),
    Fault("a crash of a run given --hub_token logs no token", lambda d: quick(d, "--hub_token", SECRET),
          "a bug in grpo-pipeline", exit_code=1, absent=SECRET, after=no_secret_under,
          env={"GRPO_CACHE_DIR": "grpo-v4-cache"}, patch=raise_in("pipeline.train._data", RuntimeError(SECRET))),
    Fault("a recipe's hub_token refused by a check is not printed",
          lambda d: [*train(d, f"hub_token: {SECRET}\nmax_steps: 0\n"), "--check"], "max_steps", absent=SECRET),
]


# 2. code from shared files: trust_remote_code never from a file (pipeline/run/manifest.py NEVER_FROM_FILES,
#    pipeline/infer/session.py remote_code); `grpo plan` and `grpo data` import no reward module
#    (pipeline/config/validate.py run_user_code, rewards/registry.py check_reward_names and reads_reference).


def ran(marker: str) -> Callable[[Path], Optional[str]]:
    return lambda folder: f"user code ran: {marker} was made" if (folder / marker).exists() else None


def importing_writes_a_marker(folder: Path, module: str) -> str:
    """A reward module that leaves `folder/<module>.ran` when it is imported (a reward no command should run)."""
    (folder / f"{module}.py").write_text(f"open({str(folder / (module + '.ran'))!r}, 'w').close()\n\n\n"
                                         "def score(prompts, completions, **kwargs):\n"
                                         "    return [0.0] * len(completions)\n", encoding="utf-8")
    return f"{module}:score"


def remote_code_adapter(folder: Path) -> list[str]:
    """A shared adapter whose grpo_adapter.json says trust_remote_code: true, on a base folder whose config.json
    names its own code (auto_map -> modeling_shared.py, which leaves a marker when it runs)."""
    from pipeline.data.tokenizer import resolve_model_path

    base = folder / "shared-base"
    shutil.copytree(resolve_model_path("tiny-qwen2.5"), base)
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_shared.SharedForCausalLM"}
    (base / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (base / "modeling_shared.py").write_text(f"open({str(folder / 'remote.ran')!r}, 'w').close()\n", encoding="utf-8")
    lora = adapter(folder)
    (folder / "run" / "manifest.json").unlink()
    metadata = {"base_model": str(base), "system_prompt": "s", "max_completion_length": 8,
                "config": {"trust_remote_code": True}}
    (lora / "grpo_adapter.json").write_text(json.dumps(metadata), encoding="utf-8")
    return ["generate", "--lora", str(lora), "--prompt", "1+1?", "--backend", "plain"]


CASES += [
    Fault("an adapter's trust_remote_code: true is not applied", remote_code_adapter,
          "pass --trust_remote_code to run that code", after=ran("remote.ran")),
    Fault("grpo data imports no reward module",
          lambda d: ["data", "--config",
                     str(recipe(d, f"reward_funcs: [{importing_writes_a_marker(d, 'v4_data')}]\n"))],
          "data:", exit_code=0, after=ran("v4_data.ran")),
    Fault("grpo plan imports no reward module",
          lambda d: ["plan", "--config", str(ROOT / "configs" / "qwen2.5-1.5b-gsm8k.yaml"), "--reward_funcs",
                     importing_writes_a_marker(d, "v4_plan"), "--gpu_memory_gb", "24"], "GiB", exit_code=0,
          after=ran("v4_plan.ran")),  # the module is found in the working folder
]


# 5. the reward boundary: rewards/contract.py check_rewards (every value read inside the guard), reward_deadline
#    (reward_timeout); pipeline/train.py _train_once (a second signal). tests/test_reward_boundary_values.py runs
#    every kind of value.


def plugin_reward(folder: Path, module: str, body: str, *extra: str, command: str = "train") -> list[str]:
    """A run whose only reward is `module:bad`, a file beside the recipe with `body` as its function's body."""
    (folder / f"{module}.py").write_text("import os, signal, time\n\n\ndef bad(prompts, completions, **kwargs):\n"
                                         + "".join(f"    {line}\n" for line in body.splitlines()), encoding="utf-8")
    text = SHORT_RUN.replace("max_steps: 1", "max_steps: 2") + f"reward_funcs: [{module}:bad]\n"
    return [command, "--config", str(recipe(folder, text)), *extra]


HANG_IN_TRAINING = "if kwargs.get('trainer_state') is not None and kwargs['trainer_state'].global_step >= 1:\n"


def summary_says(status: str) -> Callable[[Path], Optional[str]]:
    def after(folder: Path) -> Optional[str]:
        path = folder / "run" / "summary.json"
        found = json.loads(path.read_text(encoding="utf-8")).get("status") if path.is_file() else None
        return None if found == status else f"summary.json status {found!r}, expected {status!r}"
    return after


CASES += [
    Fault("a reward returning 10**400", lambda d: plugin_reward(d, "v4_huge", "return [10**400 for c in completions]",
                                                                "--check"), "which is no float (OverflowError"),
    Fault("a reward returning a meta-device tensor",
          lambda d: plugin_reward(d, "v4_meta", "import torch\nreturn torch.zeros(len(completions), device='meta')",
                                  "--check"), "a Tensor on device meta that cannot be read"),
    Fault("a reward that hangs past reward_timeout",
          lambda d: plugin_reward(d, "v4_hang",
                                  HANG_IN_TRAINING + "    time.sleep(60)\nreturn [0.0] * len(completions)",
                                  "--reward_timeout", "1"),
          "did not return within reward_timeout (1 s)", exit_code=3, after=summary_says("stopped")),
    Fault("a second signal during a hung reward ends the run, with a summary",
          lambda d: plugin_reward(d, "v4_twice", HANG_IN_TRAINING + "    os.kill(os.getpid(), signal.SIGTERM)\n"
                                  "    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(60)\n"
                                  "return [0.0] * len(completions)"),
          "resume with: grpo train", exit_code=130, after=summary_says("interrupted")),
]


# 3. checkpoints checked for what they hold: pipeline/run/checkpoint_contents.py contents_problem (from the resume
#    check, pipeline/preflight.py check_resume). 4. resume knows its data: pipeline/run/resume.py data_mismatch (from
#    the data check). tests/test_checkpoint_contents.py runs every file of a real checkpoint.

ROWS = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]
_TRAINED: dict[str, Path] = {}


def rows_file(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def trained_checkpoint(folder: Path, rows: list[dict] = ROWS, *extra: str) -> list[str]:
    """`grpo train` resuming a real checkpoint-1 (trained once a process on ROWS, then copied into `folder/run`),
    on a data file of `rows`, for max_steps 2."""
    from pipeline.cli import main as grpo

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


def checkpoint_with(change: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    def setup(folder: Path) -> list[str]:
        argv = trained_checkpoint(folder)
        change(folder / "run" / "checkpoint-1")
        return argv
    return setup


def other_optimizer(checkpoint: Path) -> None:
    import torch

    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    state["state"][0]["exp_avg"] = torch.zeros(16, 64)  # another model's first parameter
    torch.save(state, checkpoint / "optimizer.pt")


def other_adapter(checkpoint: Path) -> None:
    """Another run's adapter of rank 8 (its config copied with it)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(checkpoint / "adapter_model.safetensors"))
    cut = {name: t[:8] if ".lora_A." in name else t[:, :8] if ".lora_B." in name else t for name, t in tensors.items()}
    save_file({name: t.contiguous() for name, t in cut.items()}, str(checkpoint / "adapter_model.safetensors"))
    config = json.loads((checkpoint / "adapter_config.json").read_text(encoding="utf-8"))
    (checkpoint / "adapter_config.json").write_text(json.dumps({**config, "r": 8}), encoding="utf-8")


class _Payload:
    """What a pickle runs when loaded without weights_only: here, a file made beside the checkpoint."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def pickle_payload(checkpoint: Path) -> None:
    import torch

    torch.save(_Payload(checkpoint.parent / "PAYLOAD-RAN"), checkpoint / "optimizer.pt")


CASES += [
    Fault("resume from a checkpoint without optimizer.pt", checkpoint_with(lambda c: (c / "optimizer.pt").unlink()),
          "optimizer.pt is missing: a resume would start a fresh optimizer"),
    Fault("resume from a checkpoint without scheduler.pt", checkpoint_with(lambda c: (c / "scheduler.pt").unlink()),
          "scheduler.pt is missing"),
    Fault("resume with another run's optimizer.pt", checkpoint_with(other_optimizer),
          "is the optimizer of another model"),
    Fault("resume with another run's adapter", checkpoint_with(other_adapter), "holds a LoRA of rank [8]"),
    Fault("resume from a pickle payload", checkpoint_with(pickle_payload), "is not a checkpoint this run can read",
          after=nothing_at("run/PAYLOAD-RAN")),
    Fault("resume on a data file replaced by other rows",
          lambda d: trained_checkpoint(d, [{"question": f"What is {i} + 2?", "answer": str(i + 2)} for i in range(9)]),
          "was trained on other data: dataset_name"),
    Fault("resume on other data with --resume_other_data",
          lambda d: trained_checkpoint(d, ROWS[::-1], "--resume_other_data", "true"), "resuming on other data",
          exit_code=0),
]


# 6. paths and locales: env/path_check.py library_name_problem (a folder the Rust libraries also use), env/paths.py
#    shell_word and json_text, env/kept.py state_key (surrogatepass), env/text.py printable (the crash handler's one
#    way to text). tests/test_unprintable.py feeds the crash handler every kind of unprintable value.

NOT_UTF8 = os.fsdecode(b"caf\xe9")  # a name whose bytes are not UTF-8, as Python reads it (surrogate escapes)


def latin1_locale(monkeypatch, folder: Path) -> None:
    """A Latin-1 locale's file-name encoding (this machine has only C and C.UTF-8 installed)."""
    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: "iso8859-1")
    monkeypatch.setenv("LC_ALL", "de_DE.ISO-8859-1")


def unprintable_error() -> BaseException:
    class Unprintable(RuntimeError):
        def __str__(self):
            raise ValueError("no text")

    return Unprintable(f"path {NOT_UTF8} \ud800")


CASES += [
    Fault("a data file named with a non-UTF-8 byte", lambda d: ["data", "--config", str(recipe(
        d, "sft_warmup_steps: 0\n")), "--dataset_name", str(rows_file(d / f"{NOT_UTF8}.jsonl", ROWS))], "8 kept",
          exit_code=0),
    Fault("an output_dir named with a non-UTF-8 byte", lambda d: quick(d, "--output_dir", str(d / NOT_UTF8)),
          "is not UTF-8 text", after=nothing_at(NOT_UTF8)),
    Fault("a non-ASCII output_dir under a Latin-1 locale", lambda d: quick(d, "--output_dir", str(d / "résultats")),
          "Run under a UTF-8 locale (export LC_ALL=C.UTF-8", patch=latin1_locale, after=nothing_at("résultats")),
    Fault("a non-ASCII cache root under a Latin-1 locale", lambda d: quick(d), "`GRPO_CACHE_DIR`: the cache root",
          env={"GRPO_CACHE_DIR": "/tmp/grpo-v4-cache-é"}, patch=latin1_locale, absent="model_name_or_path"),
    Fault("a bug whose message cannot be printed", lambda d: quick(d),
          "not in your input (Unprintable: Unprintable('path caf",
          exit_code=1, env={"GRPO_CACHE_DIR": "grpo-v4-cache"},
          patch=raise_in("pipeline.train._data", unprintable_error())),
]


# 7. the cache root: env/disk.py cache_place and PLACE_ERRNOS (a failure there names GRPO_CACHE_DIR and the
#    folder, whichever writer met it). XDG_CACHE_HOME stands for HOME's .cache, GRPO_CACHE_DIR unset.

def cache_root_case(name: str, where: str, patch: Optional[Callable] = None) -> Fault:
    return Fault(f"the cache root {name}", lambda d: quick(d), "GRPO_CACHE_DIR (the cache root, now "
                 f"{where}/grpo-pipeline)", env={"GRPO_CACHE_DIR": "", "XDG_CACHE_HOME": where}, patch=patch,
                 absent="model_name_or_path")


CASES += [
    cache_root_case("under a file (HOME is a file)", "/etc/hostname"),
    cache_root_case("under a folder that cannot be made", "/proc/grpo-v4"),
    cache_root_case("on a read-only HOME", "/grpo-v4-ro-home", os_fails("mkdir", 30, under="/grpo-v4-ro-home")),
    cache_root_case("on a full disk", "/grpo-v4-full-home", os_fails("mkdir", 28, under="/grpo-v4-full-home")),
]


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
    done = subprocess.run([sys.executable, "-m", "pipeline", *argv], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    return done.returncode, done.stdout + done.stderr


def main() -> int:
    held, tried, skipped = 0, 0, []
    start = time.time()
    for case in CASES:
        reason = None
        if case.patch is not None:
            reason = "simulates an OS fault in-process (tests/test_faults.py runs it)"
        if reason:
            skipped.append((case.name, reason))
            continue
        with tempfile.TemporaryDirectory() as tmp:
            case_start = time.time()
            code, output = run_subprocess(case, Path(tmp))
        problem = judge(case, code, output)
        tried += 1
        held += problem is None
        print(f"{'held' if problem is None else 'FAILED':<6} {time.time() - case_start:5.1f}s  {case.name}"
              + (f": {problem}\n{output[-2000:]}" if problem else ""), flush=True)
    for name, reason in skipped:
        print(f"skip   {name}: {reason}")
    print(f"\n{held} of {tried} faults held ({len(skipped)} skipped; {len(CASES)} in the table; "
          f"{time.time() - start:.0f} s)")
    return 0 if held == tried else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
