"""Checks that run before anything heavy loads: config, output folder, packages, GPU, model, data, resume,
rewards, LoRA targets.

`run_checks` is the contract of `grpo train --check`: the run calls the same function before the model loads
(the first failure ends it with one message, exit 2), so when `--check` passes, the run does not fail for any
of these reasons. `grpo train --check` runs them all, prints one JSON object, and stops.

Everything here is cheap: no model weights, at most one short network probe (only when the model is neither a
local folder nor in the Hugging Face cache). The rewards check reads the tokenizer and a few data rows; the LoRA
check builds the model's architecture on the meta device (no weights) to learn its module names. Both import
torch, after the backend's `prepare_environment` (Unsloth must be imported first).
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


PROBE_PROMPTS = 2  # prompts from the data, each with the completions below (TRL repeats a prompt per completion)


def _probe_completions(answer: str) -> list[str]:
    """Completions a reward will meet: right and wrong in the format, plain text, and empty."""
    return [f"<reasoning>\nWorking it out.\n</reasoning>\n<answer>\n{answer}\n</answer>\n",
            "<reasoning>\nA guess.\n</reasoning>\n<answer>\n0\n</answer>\n",
            f"The answer is {answer}.", ""]


def _probe_rows(cfg: PipelineConfig) -> tuple[list[Any], str]:
    """A few cleaned rows of the run's data (hub data not yet downloaded: the bundled GSM8K sample instead)."""
    from pipeline.data.cache import data_cache_root
    from pipeline.data.clean import clean_rows
    from pipeline.data.sources import resolve_source
    from rewards import extract_hash_answer

    cache_root = data_cache_root(cfg.data.data_cache_dir)
    source = resolve_source(cfg, cfg.data.dataset_split, cache_root)
    where = "rows of the run's data"
    if source.kind == "hub" and not (Path(source.description["saved_copy"]) / "dataset_dict.json").is_file():
        source = resolve_source(cfg.replace(dataset_name="sample"), "train", cache_root)
        where = f"rows of the bundled GSM8K sample ({cfg.data.dataset_name} is not downloaded yet)"
    from pipeline.data.prepare import _quiet_datasets

    with _quiet_datasets():
        raw = source.load()
    rows, _ = clean_rows(raw.questions, raw.answers, raw.ids, extract_hash_answer)
    return rows[:PROBE_PROMPTS], where


def reward_probe_batch(cfg: PipelineConfig, tokenizer: Any) -> tuple[list[Any], list[Any], dict[str, Any], str]:
    """prompts, completions and keyword arguments as TRL's `GRPOTrainer._calculate_rewards` passes them: chat
    prompts and completions (our prompts are chats, so completions are `[{"role": "assistant", ...}]`), the
    training set's other columns, `completion_ids`, `trainer_state`, `log_extra` and `log_metric`."""
    from transformers import TrainerState

    from pipeline.data.prepare import training_columns
    from pipeline.data.prompts import build_prompt, count_prompt_tokens

    rows, where = _probe_rows(cfg)
    conversations = [build_prompt(cfg.data.system_prompt, row.question) for row in rows]
    columns = training_columns(conversations, rows, count_prompt_tokens(tokenizer, conversations).counts)
    texts = [_probe_completions(str(row.answer)) for row in rows]
    per_prompt = len(texts[0]) if texts else 0
    repeat = lambda values: [value for value in values for _ in range(per_prompt)]  # noqa: E731
    prompts = repeat(columns.pop("prompt"))
    completions = [[{"role": "assistant", "content": text}] for group in texts for text in group]
    kwargs: dict[str, Any] = {key: repeat(values) for key, values in columns.items()}
    kwargs["completion_ids"] = [tokenizer.encode(c[0]["content"], add_special_tokens=False) for c in completions]
    kwargs["trainer_state"] = TrainerState(max_steps=cfg.grpo.max_steps)
    kwargs["log_extra"] = lambda column, values: None
    kwargs["log_metric"] = lambda name, value: None
    return prompts, completions, kwargs, f"{len(completions)} completions of {len(rows)} {where}"


def check_rewards(cfg: PipelineConfig) -> str:
    """Call every reward function as the trainer will, on completions of real prompts: a raise, a wrong
    signature, a wrong length, a non-number or NaN/inf is refused here, naming the function and what it did."""
    from pipeline.data.tokenizer import load_tokenizer
    from rewards import get_reward_funcs
    from rewards.contract import RewardFailure, probe_rewards

    tokenizer = load_tokenizer(cfg.model.model_name_or_path, cfg.model.trust_remote_code)
    prompts, completions, kwargs, what = reward_probe_batch(cfg, tokenizer)
    try:
        lines = probe_rewards(get_reward_funcs(list(cfg.grpo.reward_funcs)), prompts, completions, kwargs)
    except RewardFailure as err:
        raise ConfigError("reward_funcs", f"{err}. It was called before the model loads, as the trainer calls "
                          f"it, on {what}. The contract: docs/rewards.md.") from None
    except ValueError as err:  # a name that does not resolve (validate() names it first in a run)
        raise ConfigError("reward_funcs", str(err)) from None
    return f"called on {what}: " + "; ".join(lines)


# The module classes peft's LoRA can adapt (peft.tuners.lora.model LoraModel._create_new_module dispatchers).
LORA_MODULE_TYPES = ("Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "Conv1D")


def model_module_types(name: str, trust_remote_code: bool = False) -> dict[str, str]:
    """Every module path of the model -> its class name, from the architecture alone: the config read from the
    built-in folder, a local folder or the HF cache (else downloaded: config.json only), the model built on the
    meta device (accelerate's `init_empty_weights`), so no weights are read or allocated."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.data.tokenizer import resolve_model_path

    def read_config(local_only: bool):
        return AutoConfig.from_pretrained(resolve_model_path(name), trust_remote_code=trust_remote_code,
                                          local_files_only=local_only)

    try:
        try:  # a local folder or the HF cache first: no network round-trip for a model already here
            config = read_config(local_only=True)
        except OSError:
            config = read_config(local_only=False)  # config.json only
        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:  # no config.json, an architecture transformers lacks
        raise ConfigError("model_name_or_path", f"cannot read the architecture of {name} ({type(err).__name__}: "
                          f"{err}). Point at a causal-LM model folder or hub id, e.g. unsloth/Qwen2.5-1.5B-Instruct."
                          ) from None
    return {path: type(module).__name__ for path, module in model.named_modules() if path}


def _matches(target: str, path: str) -> bool:
    """peft's suffix rule (peft.tuners.tuners_utils.check_target_module_exists): the name or a `.name` tail."""
    return path == target or path.endswith("." + target)


def check_lora_targets(cfg: PipelineConfig) -> str:
    """Each `lora_target_modules` entry names LoRA-capable modules of this model, and each
    `lora_modules_to_save` entry names a module it has; otherwise refused, listing the names it has."""
    lo = cfg.lora
    types = model_module_types(cfg.model.model_name_or_path, cfg.model.trust_remote_code)
    adaptable = sorted({path.rsplit(".", 1)[-1] for path, kind in types.items() if kind in LORA_MODULE_TYPES})
    for target in lo.lora_target_modules:
        kinds = sorted({kind for path, kind in types.items() if _matches(str(target), path)})
        if not kinds:
            raise ConfigError("lora_target_modules", f"{cfg.model.model_name_or_path} has no module named "
                              f"{target!r}. Its layers LoRA can adapt: {', '.join(adaptable)}.")
        if not set(kinds) & set(LORA_MODULE_TYPES):
            raise ConfigError("lora_target_modules", f"{target!r} names {', '.join(kinds)} modules, which LoRA "
                              f"cannot adapt; name their layers instead: {', '.join(adaptable)}.")
    names = sorted({path.rsplit(".", 1)[-1] for path in types})
    for target in lo.lora_modules_to_save:
        # peft's rule here (peft.utils.other._set_trainable) is a plain suffix: `layernorm` takes input_layernorm
        if not any(path.endswith(str(target)) for path in types):
            raise ConfigError("lora_modules_to_save", f"{cfg.model.model_name_or_path} has no module named "
                              f"{target!r}. Its module names: {', '.join(names)}.")
    saved = f"; trained in full: {', '.join(map(str, lo.lora_modules_to_save))}" if lo.lora_modules_to_save else ""
    return f"LoRA on {', '.join(map(str, lo.lora_target_modules))}{saved} (all found in the model)"


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

    from pipeline.backends import choose_backend, load_backend

    g = cfg.grpo

    def after_backend(check: Callable[[PipelineConfig], str]) -> Callable[[], str]:
        # The rewards and LoRA checks import torch/transformers: the backend's set-up (Unsloth's import) first.
        def step() -> str:
            resolved = choice or choose_backend(cfg.model.backend, cfg.model.fast_inference)
            load_backend(resolved.name).prepare_environment(cfg)
            return check(cfg)

        return step

    steps: list[tuple[str, Callable[[], Any]]] = [
        ("config", lambda: (validate(cfg, backend=choice.name if choice else None), "config values are valid")[1]),
        ("output_dir", lambda: check_output_dir(g.output_dir)),
        ("packages", lambda: check_report_to(g.reporters(), g.output_dir)),
        ("gpu", lambda: check_gpu(cfg, choice)),
        ("model", lambda: check_model(cfg.model.model_name_or_path)),
        ("data", lambda: check_data(cfg)),
        ("resume", lambda: check_resume(g.resume, g.output_dir)),
        # last: these two read the tokenizer, a few rows and the model's architecture (no weights)
        ("rewards", after_backend(check_rewards)),
        ("lora", after_backend(check_lora_targets)),
    ]
    # A check that reads the model or the data says nothing new when those could not be found.
    needs = {"rewards": ("model", "data"), "lora": ("model",)}
    results: list[Check] = []
    for name, step in steps:
        failed = [c.name for c in results if not c.ok and c.name in needs.get(name, ())]
        if failed:
            results.append(Check(name, False, f"not checked: the {' and '.join(failed)} check failed"))
            continue
        try:
            results.append(Check(name, True, str(step())))
        except (ConfigError, DataError, DataFileError, FileNotFoundError) as err:
            if stop_at_first:
                raise
            results.append(Check(name, False, str(err)))
    return results


def as_json(results: list[Check]) -> dict[str, Any]:
    return {"ok": all(c.ok for c in results), "checks": [asdict(c) for c in results]}
