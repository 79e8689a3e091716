"""The fault table's cases (tests/fault_table.py) of faults v4 (issue 48): secrets, code from shared files, checkpoints
checked for what they hold, resume knowing its data, the reward boundary, paths and locales, the cache root."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Optional

from fault_kit import (
    Fault,
    ROOT,
    ROWS,
    SHORT_RUN,
    adapter,
    quick,
    raise_in,
    recipe,
    rows_file,
    train,
    trained_checkpoint,
)
from fault_storage import nothing_at, os_fails

CASES: list[Fault] = []  # this part's cases, in the table's order

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
          env={"GRPO_CACHE_DIR": "grpo-v4-cache"}, patch=raise_in("grpo_pipeline.pipeline.train._data", RuntimeError(SECRET))),
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
    from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path

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


# 5. the reward boundary: rewards/contract.py check_rewards (every value read inside the guard), rewards/worker.py
#    (reward_timeout: a reward's own process, killed at the deadline); pipeline/train.py _train_once (a second
#    signal). tests/test_reward_boundary_values.py runs
#    every kind of value.


def plugin_reward(folder: Path, module: str, body: str, *extra: str, command: str = "train",
                  define: str = "def") -> list[str]:
    """A run whose only reward is `module:bad`, a file beside the recipe with `body` as its function's body
    (`define` "async def": an async reward)."""
    (folder / f"{module}.py").write_text("import os, signal, time\n\n\n"
                                         f"{define} bad(prompts, completions, **kwargs):\n"
                                         + "".join(f"    {line}\n" for line in body.splitlines()), encoding="utf-8")
    text = SHORT_RUN.replace("max_steps: 1", "max_steps: 2") + f"reward_funcs: [{module}:bad]\n"
    return [command, "--config", str(recipe(folder, text)), *extra]


HANG_IN_TRAINING = "if kwargs.get('trainer_state') is not None and kwargs['trainer_state'].global_step >= 1:\n"
# The trainer's process, from the reward: while reward_timeout is set the reward runs in a worker process of its own
# (rewards/worker.py), whose parent is the trainer. Two signals, apart, as a user sends them.
TWO_SIGNALS_TO_THE_TRAINER = ("    import multiprocessing\n"
                              "    trainer = os.getppid() if multiprocessing.parent_process() else os.getpid()\n"
                              "    os.kill(trainer, signal.SIGTERM)\n    time.sleep(0.5)\n"
                              "    os.kill(trainer, signal.SIGTERM)\n    time.sleep(60)\n")
# Reward shapes a cooperative alarm could not stop (issue 59): each hangs in --check's call, past reward_timeout 1.
HANGS = {
    "math_verify's own timeout, then a hang": ("v5_math_verify", "def", "import math_verify\n"
                                               "math_verify.parse('$\\\\frac{1}{2}$')\ntime.sleep(60)"),
    "an async reward blocking its loop": ("v5_async", "async def", "time.sleep(60)"),
    "a ThreadPoolExecutor's hung thread": ("v5_pool", "def", "from concurrent.futures import ThreadPoolExecutor\n"
                                           "with ThreadPoolExecutor(2) as pool:\n"
                                           "    pool.submit(time.sleep, 60).result()"),
    "a reward that ignores signals": ("v5_ignores", "def",
                                      "for s in (signal.SIGALRM, signal.SIGINT, signal.SIGTERM):\n"
                                      "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"),
}


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
          lambda d: plugin_reward(d, "v4_twice", HANG_IN_TRAINING + TWO_SIGNALS_TO_THE_TRAINER
                                  + "return [0.0] * len(completions)"),
          "resume with: grpo train", exit_code=130, after=summary_says("interrupted")),
    *(Fault(f"reward_timeout holds for {shape}",
            lambda d, module=module, define=define, body=body: plugin_reward(
                d, module, body + "\nreturn [0.0] * len(completions)", "--check", "--reward_timeout", "1",
                define=define),
            "did not return within reward_timeout (1 s)") for shape, (module, define, body) in HANGS.items()),
    Fault("a reward that ends its own process",
          lambda d: plugin_reward(d, "v5_exit", "os._exit(3)", "--check", "--reward_timeout", "1"),
          "`bad` ended its own process (exit code 3)"),
]


# 3. checkpoints checked for what they hold: pipeline/run/resume.py contents_problem (from the resume
#    check, pipeline/preflight.py check_resume). 4. resume knows its data: pipeline/run/resume.py data_mismatch (from
#    the data check). tests/test_checkpoint_contents.py runs every file of a real checkpoint.


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


def saved_under_deepspeed(checkpoint: Path) -> None:
    """The checkpoint as DeepSpeed ZeRO lays it out (pipeline/run/launchers.py LAYOUTS): the optimizer in
    global_step1/, named by `latest`, and no optimizer.pt."""
    (checkpoint / "global_step1").mkdir()
    partition = checkpoint / "global_step1" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    (checkpoint / "optimizer.pt").rename(partition)
    (checkpoint / "latest").write_text("global_step1", encoding="utf-8")


def saved_by_two_processes(checkpoint: Path) -> None:
    """The checkpoint as two processes save it: grpo_shape.json's launch and one rng_state_<rank>.pth a process."""
    shape = json.loads((checkpoint / "grpo_shape.json").read_text(encoding="utf-8"))
    shape["launch"] = {**shape.get("launch", {}), "processes": 2}
    (checkpoint / "grpo_shape.json").write_text(json.dumps(shape), encoding="utf-8")
    (checkpoint / "rng_state.pth").rename(checkpoint / "rng_state_0.pth")
    shutil.copy(checkpoint / "rng_state_0.pth", checkpoint / "rng_state_1.pth")


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
    Fault("resume a DeepSpeed ZeRO checkpoint in a plain launch", checkpoint_with(saved_under_deepspeed),
          "holds its optimizer as DeepSpeed ZeRO saves it"),
    Fault("resume a checkpoint of 2 processes with 1", checkpoint_with(saved_by_two_processes),
          "was trained by 2 processes"),
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
          patch=raise_in("grpo_pipeline.pipeline.train._data", unprintable_error())),
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
