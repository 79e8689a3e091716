"""manifest.json: everything needed to use a trained adapter the way it was trained.

`grpo generate` / `grpo eval` read it so generation uses the same base model, system prompt,
chat template and max lengths as training (mismatched sampling limits are a top cause of
"extract_xml_answer fails after training").

The adapter folder (lora/) also carries the part of it that generation needs, in `grpo_adapter.json`,
written inside the folder before it is published (so atomically with the weights): an adapter copied
away from its run still generates as trained.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from env.paths import absolute_path, atomic_write_json

MANIFEST_NAME = "manifest.json"
ADAPTER_METADATA_NAME = "grpo_adapter.json"
# What generate/eval/export need from a run; copied into the adapter folder itself.
ADAPTER_METADATA_KEYS = ("base_model", "backend", "system_prompt", "chat_template",
                         "max_prompt_length", "max_completion_length", "max_seq_length", "max_lora_rank")
RECORDED_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "unsloth", "unsloth_zoo",
                     "vllm", "bitsandbytes")


def package_versions() -> dict[str, Optional[str]]:
    versions: dict[str, Optional[str]] = {}
    for name in RECORDED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


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
                   data_fingerprint: str, adapter_dir: Path, prompt_format: str = "conversational") -> dict[str, Any]:
    return {
        # "standard" (TRL's text prompts, given to the model as written) or "conversational" (chats through the
        # chat template): `grpo generate` prompts the model as it was trained.
        "prompt_format": prompt_format,
        "base_model": recorded_model(base_model),
        "backend": backend,
        "adapter_dir": str(adapter_dir),
        "system_prompt": system_prompt,
        "chat_template": chat_template,
        "max_prompt_length": max_prompt_length,
        "max_completion_length": max_completion_length,
        "max_seq_length": cfg_dict.get("max_seq_length"),
        "max_lora_rank": cfg_dict.get("max_lora_rank"),
        "data_fingerprint": data_fingerprint,
        "git_commit": git_commit(),
        "versions": package_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": cfg_dict,
    }


def recorded_model(model: str) -> str:
    """A local model folder as an absolute path (a relative one would be read against the cwd of whoever runs
    generate later), a hub id or built-in name as it is.

    >>> recorded_model("unsloth/Qwen2.5-1.5B-Instruct")
    'unsloth/Qwen2.5-1.5B-Instruct'
    """
    return str(absolute_path(model)) if os.path.isdir(model) else model


def _resolve_relative_model(manifest: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A relative `base_model` that names a folder next to the manifest (a hand-written or older manifest)
    made absolute against the manifest's own folder, never against the current directory."""
    model = manifest.get("base_model")
    if isinstance(model, str) and model and not os.path.isabs(model) and (folder / model).is_dir():
        manifest["base_model"] = str(absolute_path(folder / model))
    return manifest


def write_manifest(output_dir: Path, manifest: dict[str, Any]) -> Path:
    path = output_dir / MANIFEST_NAME
    atomic_write_json(path, manifest)
    return path


class ManifestError(ValueError):
    """A manifest.json that exists but cannot be used (not JSON, not an object); the message names it."""


def write_adapter_metadata(adapter_dir: Path, manifest: dict[str, Any]) -> Path:
    """The generation settings of `manifest` (plus the run's config) inside the adapter folder."""
    metadata = {key: manifest.get(key) for key in ADAPTER_METADATA_KEYS}
    metadata["config"] = manifest.get("config")
    path = adapter_dir / ADAPTER_METADATA_NAME
    atomic_write_json(path, metadata)
    return path


def find_manifest(adapter_dir: Path) -> Optional[dict[str, Any]]:
    """How an adapter was trained: the run's manifest (in the adapter folder or its parent, output_dir/lora),
    else the metadata the adapter folder carries itself; None when there is neither.

    A corrupt one is a ManifestError, never silently skipped: without it generation would fall back to the
    default system prompt and template and give wrong answers with exit 0.
    """
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
            return _resolve_relative_model(manifest, candidate.parent)
    return None
