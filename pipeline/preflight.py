"""Checks that run before anything heavy loads: config, output folder, packages, GPU, model, data, resume.

`grpo train` runs them all before the tokenizer and the model; the first failure ends the run with
one message (exit 2). `grpo train --check` runs them all, prints one JSON object, and stops.

Everything here is cheap: no torch, no model, no tokenizer, and at most one short network probe
(only when the model is neither a local folder nor in the Hugging Face cache).
"""

from __future__ import annotations

import errno
import importlib.util
import os
import socket
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

from pipeline.config import ConfigError, PipelineConfig, validate

# report_to name -> the module transformers' integration imports, and how to install it.
REPORTER_PACKAGES = {
    "tensorboard": ("tensorboard", "pip install 'grpo-pipeline[tensorboard]'  (or: pip install tensorboard)"),
    "wandb": ("wandb", "pip install wandb, then `wandb login`"),
}


@dataclass
class Check:
    name: str
    ok: bool
    message: str


def nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(output_dir: str) -> str:
    """Raise ConfigError("output_dir") unless the folder (or its nearest existing parent) takes new files.

    Tries a real temporary file: permissions bits say nothing about read-only mounts or quotas.
    """
    from env.paths import absolute_path

    path = absolute_path(output_dir)
    existing = nearest_existing(path)
    if existing.exists() and not existing.is_dir():
        raise ConfigError("output_dir", f"{existing} is a file, not a folder. Choose another output_dir, "
                          "e.g. outputs/my-run.")
    try:
        fd, probe = tempfile.mkstemp(prefix=".grpo-write-test-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        why = "is on a read-only file system" if err.errno == errno.EROFS else f"is not writable ({err.strerror})"
        raise ConfigError("output_dir", f"{existing} {why}, so the run could not save checkpoints there. Point "
                          "output_dir at a writable folder (e.g. under your home folder, /content on Colab, "
                          "/root/autodl-tmp on AutoDL).") from None
    import shutil

    free_gib = shutil.disk_usage(existing).free / 2**30
    return (f"{path} is writable" + ("" if existing == path else f" (will be created in {existing})")
            + f"; {free_gib:.1f} GiB free there")


def check_report_to(names: list[str], output_dir: str) -> str:
    notes = []
    for name in names:
        module, fix = REPORTER_PACKAGES.get(name, (name, f"pip install {name}"))
        if importlib.util.find_spec(module) is None:
            raise ConfigError("report_to", f"`{name}` needs the {module} package, which is not installed. "
                              f"Install it: {fix}; or set report_to: none.")
        if name == "tensorboard":
            notes.append(tensorboard_hint(output_dir))
    return "; ".join(notes) or ("report_to: " + (", ".join(names) or "none"))


def check_packages(cfg: PipelineConfig) -> str:
    """The packages the config's options need: report_to's loggers (refused when missing) and a bitsandbytes
    `optim` (replaced by adamw_torch when missing: pipeline.config.resolve_optim, which `grpo train` applies)."""
    from pipeline.config import resolve_optim

    _, optim_note = resolve_optim(cfg)
    return "; ".join(filter(None, [check_report_to(cfg.grpo.reporters(), cfg.grpo.output_dir), optim_note]))


def tensorboard_hint(output_dir: str | os.PathLike[str]) -> str:
    """Where transformers' TensorBoardCallback writes (TENSORBOARD_LOGGING_DIR, else output_dir/runs/<run>)."""
    logdir = os.environ.get("TENSORBOARD_LOGGING_DIR") or os.path.join(output_dir, "runs")
    return f"tensorboard logs go to {logdir}: run `tensorboard --logdir {logdir}`"


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _hub_reachable(endpoint: str, timeout: float = 3.0) -> bool:
    """One TCP connect to the hub, instead of huggingface_hub's minute of retries."""
    url = urlparse(endpoint)
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=timeout):
            return True
    except OSError:
        return False


def check_model(name: str) -> str:
    """A built-in name, a local model folder, a hub id in the local cache, or a hub id we can reach."""
    from pipeline.demo.registry import builtin_model

    if builtin_model(name) is not None:
        return f"{name}: built in"
    path = Path(name).expanduser()
    looks_local = path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
    if path.exists() or looks_local:
        if not path.is_dir():
            raise ConfigError("model_name_or_path", f"{path.resolve()} is not a model folder (it does not exist "
                              "or is a file). Give a folder with config.json and the weights, or a hub id such "
                              "as unsloth/Qwen2.5-1.5B-Instruct.")
        if not (path / "config.json").is_file():
            raise ConfigError("model_name_or_path", f"{path.resolve()} has no config.json, so it is not a "
                              "transformers model folder. Point at the folder that holds config.json.")
        return f"{path.resolve()}: local folder"
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return f"{name}: in the Hugging Face cache"
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    endpoint = _hub_endpoint()
    if offline or not _hub_reachable(endpoint):
        why = "HF_HUB_OFFLINE is set" if offline else f"{endpoint} cannot be reached"
        raise ConfigError("model_name_or_path", f"model {name!r} is not in the local Hugging Face cache and "
                          f"{why}. Fixes: download it where there is network (`huggingface-cli download {name}`, "
                          "then copy ~/.cache/huggingface over) or set model_name_or_path to a local model folder; "
                          "in mainland China set HF_ENDPOINT=https://hf-mirror.com.")
    return f"{name}: will be downloaded from {endpoint}"


def check_data(cfg: PipelineConfig) -> str:
    """Read a local file's rows (empty, not UTF-8, broken JSON fail here); hub data is only located."""
    from pipeline.data.cache import data_cache_root
    from pipeline.data.sources import resolve_source

    source = resolve_source(cfg, cfg.data.dataset_split, data_cache_root(cfg.data.data_cache_dir))
    if source.kind == "file":
        rows = source.load()
        return f"{source.description['path']}: {len(rows.ids)} rows readable"
    if source.kind == "hub":
        return f"{cfg.data.dataset_name}: hub dataset (saved copy: {source.description['saved_copy']})"
    return f"{cfg.data.dataset_name}: built in"


def check_resume(resume: str, output_dir: str) -> str:
    """`auto`, `never`, or a complete checkpoint folder; anything else fails before the warm-up."""
    from env.paths import absolute_path
    from pipeline.run.checkpoints import checkpoint_problem

    if resume in ("auto", "never"):
        return f"resume: {resume}"
    path = absolute_path(resume)
    if not path.is_dir():
        if os.sep not in resume and "/" not in resume:
            raise ConfigError("resume", f"got {resume!r}, which is neither auto, never nor a checkpoint folder "
                              f"({path} does not exist). Use --resume auto (newest complete checkpoint), --resume "
                              "never (start over), or a folder such as OUTPUT_DIR/checkpoint-50.")
        raise ConfigError("resume", f"no checkpoint folder at {path}. Use --resume auto to pick the newest "
                          f"complete checkpoint in {absolute_path(output_dir)}, or --resume never.")
    problem = checkpoint_problem(path)
    if problem:
        raise ConfigError("resume", f"{path} cannot be resumed from: {problem}. Pick another checkpoint, or "
                          "use --resume auto (it skips incomplete checkpoints).")
    return f"resume from {path}"


def check_gpu(cfg: PipelineConfig, choice: Any = None) -> str:
    from pipeline.backends import choose_backend, refuse_gpu_recipe_without_cuda

    choice = choice or choose_backend(cfg.model.backend, cfg.model.fast_inference)
    refuse_gpu_recipe_without_cuda(cfg, choice)  # a GPU recipe is never trained on CPU by accident
    return f"backend {choice.name} ({choice.reason})"


def run_checks(cfg: PipelineConfig, stop_at_first: bool = True, choice: Any = None) -> list[Check]:
    """Run every check in order. With `stop_at_first`, the first failure raises its error.

    `choice` is a BackendChoice already made by the caller (the gpu check then reports it)."""
    from pipeline.data.prepare import DataError
    from pipeline.data.sources import DataFileError

    g = cfg.grpo
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("config", lambda: (validate(cfg, backend=choice.name if choice else None), "config values are valid")[1]),
        ("output_dir", lambda: check_output_dir(g.output_dir)),
        ("packages", lambda: check_packages(cfg)),
        ("gpu", lambda: check_gpu(cfg, choice)),
        ("model", lambda: check_model(cfg.model.model_name_or_path)),
        ("data", lambda: check_data(cfg)),
        ("resume", lambda: check_resume(g.resume, g.output_dir)),
    ]
    results = []
    for name, step in steps:
        try:
            results.append(Check(name, True, str(step())))
        except (ConfigError, DataError, DataFileError, FileNotFoundError) as err:
            if stop_at_first:
                raise
            results.append(Check(name, False, str(err)))
    return results


def as_json(results: list[Check]) -> dict[str, Any]:
    return {"ok": all(c.ok for c in results), "checks": [asdict(c) for c in results]}
