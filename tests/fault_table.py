"""The fault table: bad inputs and faults a user meets, each driven through the real `grpo` CLI by
tests/test_faults.py (one parametrized test per case, its id the case's name).

A case holds when the command exits with the expected code, its output contains the expected text (the
field or file and the fix) and no "Traceback" (fault_kit.judge).

The table is data: append a `Fault` to CASES to add a case (here, or in one of its parts: fault_inputs.py,
fault_storage.py, fault_boundaries.py, fault_engine.py; the set-ups they share are in fault_kit.py).
`setup(folder)` writes whatever the case needs into an empty folder and returns the argv after `grpo`; `patch`
simulates an OS fault at its boundary with pytest's monkeypatch; `hide` names packages the case runs without (a
fresh process that cannot see them, whether or not they are installed). Not a test module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import fault_boundaries
import fault_engine
import fault_inputs
import fault_storage
from fault_kit import (
    Fault,
    OFFLINE_ENV,
    QUICK,
    SHORT_RUN,
    adapter,
    adapter_without_metadata,
    broken_checkpoint,
    checkpoint_of_another_shape,
    corrupt_manifest,
    data_file,
    disk_full,
    disk_full_enospc,
    empty_folder,
    export_onto,
    generate_with,
    no_partial_checkpoint,
    other_base,
    quick,
    raise_in,
    rank_mismatch,
    read_only,
    recipe,
    train,
)

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


def disk_full_safetensors(monkeypatch, folder: Path) -> None:
    """safetensors' own exception class (neither OSError nor RuntimeError) for a full disk, at the checkpoint."""
    import peft.peft_model

    class SafetensorError(Exception):
        pass

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(peft.peft_model, "safe_save_file", full)

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


def read_only_dir(folder: Path) -> str:
    (folder / "ro").mkdir()
    return str(folder / "ro" / "c")


def run_intact(folder: Path) -> Optional[str]:
    from grpo_pipeline.env.adapters import AdapterError, verify_adapter_dir

    try:
        verify_adapter_dir(folder / "run" / "lora")
    except AdapterError as err:
        return f"the adapter was damaged: {err}"
    return None if (folder / "run" / "manifest.json").is_file() else "the run's manifest.json is gone"


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
          patch=raise_in("grpo_pipeline.pipeline.data.model_check.check_model", RuntimeError("injected"))),
    Fault("Ctrl-C before training is exit 130", lambda d: quick(d),
          "interrupted", exit_code=130, patch=raise_in("grpo_pipeline.pipeline.preflight.check_report_to", KeyboardInterrupt())),
]
CASES += PATH_CASES


# The rest of the table, in its order: each part keeps its cases beside their set-ups.
CASES += fault_inputs.CASES + fault_storage.CASES + fault_boundaries.CASES + fault_engine.CASES
