"""The fault table's cases (tests/fault_table.py) of faults v3: library errors, a recipe read once, bounded messages,
numeric bounds, outputs inside inputs, writes into the working directory; and kept state (issue 36)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

from fault_kit import (
    Fault,
    QUICK,
    ROOT,
    RUNNABLE_BASE,
    adapter,
    checkpoint_of_another_shape,
    data_file,
    generate_with,
    raise_in,
    recipe,
    train,
)

CASES: list[Fault] = []  # this part's cases, in the table's order

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

    from grpo_pipeline.pipeline.assets import qwen_tokenizer_dir

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
    return ["eval", "--lora", str(adapter(folder, RUNNABLE_BASE)), "--config", str(bare), "--limit", "2", "--max_tokens", "4",
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
          patch=raise_in("grpo_pipeline.pipeline.data.model_check.check_model", RuntimeError("injected"))),
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
    from grpo_pipeline.pipeline.cli import main as grpo

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
    from grpo_pipeline.pipeline.cli import main as grpo

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
