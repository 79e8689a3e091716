"""manifest.json: everything needed to use a trained adapter the way it was trained (base model, system prompt,
chat template, max lengths), read by `grpo generate` / `grpo eval`. The adapter folder carries the part generation
needs in `grpo_adapter.json`, written with the weights: an adapter copied away from its run generates as trained.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.kept import versions
from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.env.paths import atomic_write_json, atomic_write_text
from grpo_pipeline.env.secret_fields import masked, unmasked
from grpo_pipeline.pipeline.demo.gguf_model import gguf_model_dir, is_gguf_file, provenance
from grpo_pipeline.pipeline.demo.registry import builtin_model

MANIFEST_NAME = "manifest.json"
ADAPTER_METADATA_NAME = "grpo_adapter.json"
# What generate/eval/export need from a run; copied into the adapter folder itself.
ADAPTER_METADATA_KEYS = ("base_model", "base_weights", "backend", "system_prompt", "system_prompt_note",
                         "chat_template", "max_prompt_length", "max_completion_length", "max_seq_length",
                         "max_lora_rank")
RECORDED_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "unsloth", "unsloth_zoo",
                     "vllm", "bitsandbytes")


def git_commit(cwd: Optional[Path] = None) -> Optional[str]:
    """The project's git commit when run from a checkout, else None."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def build_manifest(*, cfg_dict: dict[str, Any], backend: str, base_model: str, system_prompt: str,
                   chat_template: Optional[str], max_prompt_length: int, max_completion_length: int,
                   data_fingerprint: str, adapter_dir: Path, formats: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """`formats`: the data report's prompt_format (pipeline/data/columns.py): the system prompt recorded is the one
    the training rows carried, `system_prompt` only stands in for a report without one."""
    formats = formats or {}
    return {
        # "standard" (TRL's text prompts, given to the model as written) or "conversational" (chats through the
        # chat template): `grpo generate` prompts the model as it was trained.
        "prompt_format": "standard" if formats.get("standard") else "conversational",
        "base_model": recorded_base(base_model),
        "base_weights": weights_provenance(base_model),
        "backend": backend,
        "adapter_dir": str(adapter_dir),
        "system_prompt": formats.get("system_message", system_prompt),
        "system_prompt_note": formats.get("system_message_note", ""),
        "chat_template": chat_template,
        "max_prompt_length": max_prompt_length,
        "max_completion_length": max_completion_length,
        "max_seq_length": cfg_dict.get("max_seq_length"),
        "max_lora_rank": cfg_dict.get("max_lora_rank"),
        "data_fingerprint": data_fingerprint,
        "git_commit": git_commit(),
        "versions": versions(*RECORDED_PACKAGES),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": masked(cfg_dict),  # no secret in a file (env/secret_fields.py)
    }


def weights_provenance(model: str) -> Optional[dict[str, Any]]:
    """Where weights converted from a GGUF came from (the built-in `qwen2.5-coder-0.5b`, a user's .gguf), as the
    converted folder records it (pipeline/demo/gguf_model.py); None for any other model."""
    builtin = builtin_model(model)
    if builtin is not None and builtin.gguf is not None and builtin.folder is not None:
        return provenance(builtin.folder())
    if is_gguf_file(model) and os.path.isfile(os.path.expanduser(model)):
        return provenance(gguf_model_dir(model))
    return None


def recorded_base(model: str, loaded: Optional[str] = None) -> str:
    """The base-model name every writer records (manifest.json, adapter folders, checkpoints, exports) for a model
    the recipe names `model` and that, loaded, calls itself `loaded` (adapter_config.json's
    base_model_name_or_path as peft or Unsloth saved it): a built-in name as it is, never its cache folder; a local
    folder as its absolute path; a hub id as `loaded` when that is a hub id too (Unsloth's pre-quantised repo),
    else as given: never a ModelScope snapshot or hub cache folder of this machine.

    >>> recorded_base("unsloth/Qwen2.5-1.5B-Instruct", "/root/.cache/modelscope/models/unsloth/Qwen2___5-1___5B")
    'unsloth/Qwen2.5-1.5B-Instruct'
    >>> recorded_base("tiny-demo", "/root/.cache/grpo-pipeline/tiny-demo-2")
    'tiny-demo'
    """
    if builtin_model(model) is not None:
        return model
    if os.path.isdir(model) or (is_gguf_file(model) and os.path.isfile(os.path.expanduser(model))):
        return str(absolute_path(model))
    if isinstance(loaded, str) and loaded and not _local_path(loaded):
        return loaded
    return model


def _local_path(name: str) -> bool:
    """A path of this machine rather than a hub id (`org/name`): absolute, ~, ./, deeper than one slash, or there."""
    return (os.path.isabs(name) or name.startswith(("~", ".")) or name.count("/") > 1
            or os.path.exists(os.path.expanduser(name)))


def record_adapter_base(folder: Path, model: str) -> None:
    """Rewrite every adapter_config.json under `folder` (and peft's model card beside it, README.md) to name
    recorded_base(model, <what the saver wrote>): peft and Unsloth write the loaded model's folder, which for a
    built-in model or a ModelScope snapshot is a folder of this machine."""
    from huggingface_hub import ModelCard  # lazy: only where an adapter is saved

    for config_file in sorted(Path(folder).rglob("adapter_config.json")):
        config = json.loads(config_file.read_text(encoding="utf-8"))
        name = recorded_base(model, config.get("base_model_name_or_path"))
        if config.get("base_model_name_or_path") != name:
            config["base_model_name_or_path"] = name
            atomic_write_json(config_file, config)
        card_file = config_file.with_name("README.md")
        if card_file.is_file():
            card = ModelCard.load(card_file)
            tags = [f"base_model:adapter:{name}" if str(tag).startswith("base_model:adapter:") else tag
                    for tag in card.data.get("tags") or []]
            if card.data.get("base_model") not in (None, name) or tags != (card.data.get("tags") or []):
                card.data.base_model, card.data.tags = name, tags or None
                atomic_write_text(card_file, str(card))


def _base_key(name: str) -> tuple[str, str]:
    """What a base name is, to compare two: ("builtin", name), ("path", folder) or ("hub", model name without the
    organisation and Unsloth's 4-bit suffixes: its mapper.py loads 'Qwen/Qwen2.5-1.5B-Instruct' in 4-bit as
    'unsloth/qwen2.5-1.5b-instruct-unsloth-bnb-4bit')."""
    if builtin_model(name) is not None:
        return "builtin", name
    if _local_path(name):
        return "path", os.path.realpath(os.path.expanduser(name))
    base = name.rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix in ("-unsloth-bnb-4bit", "-bnb-4bit", "-unsloth"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return "hub", base


def other_base(recorded: Optional[str], given: str) -> bool:
    """Whether an adapter that records `recorded` as its base is known to be for another model than `given`. A folder
    against a name is not known to differ (an older adapter names a cache or snapshot folder; the LoRA's shapes are
    checked anyway: pipeline/infer/session.py adapter_mismatch).

    >>> other_base("unsloth/qwen2.5-1.5b-instruct-unsloth-bnb-4bit", "Qwen/Qwen2.5-1.5B-Instruct")
    False
    >>> other_base("tiny-demo", "Qwen/Qwen2.5-1.5B-Instruct")
    True
    """
    if not recorded:
        return False
    (kind, key), (given_kind, given_key) = _base_key(recorded), _base_key(given)
    if "path" in (kind, given_kind) and kind != given_kind:
        return False
    return (kind, key) != (given_kind, given_key)


def write_manifest(output_dir: Path, manifest: dict[str, Any]) -> Path:
    path = output_dir / MANIFEST_NAME
    atomic_write_json(path, manifest)
    return path


class ManifestError(ValueError):
    """A manifest.json that exists but cannot be used (not JSON, not an object); the message names it."""


def write_adapter_metadata(adapter_dir: Path, manifest: dict[str, Any]) -> Path:
    """The generation settings of `manifest` (plus the run's config) inside the adapter folder, and the base it names
    in adapter_config.json too (record_adapter_base), where peft, Unsloth and vLLM read it."""
    metadata = {key: manifest.get(key) for key in ADAPTER_METADATA_KEYS}
    metadata["config"] = masked(manifest.get("config"))  # an older manifest's secrets stay out of copies
    if manifest.get("base_model"):
        metadata["base_model"] = recorded_base(manifest["base_model"])
        record_adapter_base(adapter_dir, manifest["base_model"])
    path = adapter_dir / ADAPTER_METADATA_NAME
    atomic_write_json(path, metadata)
    return path


def find_manifest(adapter_dir: Path) -> Optional[dict[str, Any]]:
    """How an adapter was trained: the run's manifest (in the adapter folder or its parent), else the adapter's own
    metadata; None when there is neither. A corrupt one is a ManifestError, never skipped: generation would fall
    back to the default system prompt and template and give wrong answers with exit 0."""
    for candidate in (adapter_dir / MANIFEST_NAME, adapter_dir.parent / MANIFEST_NAME,
                      adapter_dir / ADAPTER_METADATA_NAME):
        if candidate.is_file():
            try:
                manifest = json.loads(candidate.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise ManifestError(f"{candidate} is corrupt ({err}). It records the base model, system prompt "
                                    "and chat template the adapter was trained with: restore it from a backup or "
                                    "re-run training; to use the adapter anyway, move the file away and pass "
                                    "--model and --system_prompt yourself.") from None
            if not isinstance(manifest, dict):
                raise ManifestError(f"{candidate} is corrupt: it holds a JSON {type(manifest).__name__}, not an "
                                    "object. Restore it or move it away and pass --model and --system_prompt.")
            manifest = _as_shared_file(manifest)
            model = manifest.get("base_model")  # a relative folder (hand-written manifest): against the manifest's
            if isinstance(model, str) and model and not os.path.isabs(model) and (candidate.parent / model).is_dir():
                manifest["base_model"] = str(absolute_path(candidate.parent / model))
            return manifest
    return None


# Settings a file may not make, whoever wrote it (an adapter, an export or a run folder can come from anyone):
# trust_remote_code runs the base folder's modeling_*.py, so it comes only from the user's own option at the time
# of the command (pipeline/infer/session.py remote_code). docs/security.md states the promise.
NEVER_FROM_FILES = ("trust_remote_code",)


def _as_shared_file(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest's config without what a file may not set (kept aside under `recorded`) and without secrets'
    placeholders (env/secret_fields.py unmasked)."""
    config = manifest.get("config")
    if isinstance(config, dict):
        config = unmasked(config)
        manifest["recorded"] = {name: config.pop(name) for name in NEVER_FROM_FILES if name in config}
        manifest["config"] = config
    return manifest


def agent_options(tools: Any, environment_factory: Any) -> list[str]:
    """The command-line words naming a run's tools and environments (`grpo generate` runs them only when named).

    >>> agent_options(["calc:add"], {"count": "env:Counter"})
    ['--tools', 'calc:add', '--environment_factory', '{"count": "env:Counter"}']
    >>> agent_options([], None)
    []
    """
    words = ["--tools", *map(str, tools)] if tools else []
    if environment_factory:
        words += ["--environment_factory", environment_factory if isinstance(environment_factory, str)
                  else json.dumps(dict(environment_factory))]
    return words
