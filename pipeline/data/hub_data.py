"""Hub datasets (Hugging Face Hub or ModelScope, per `model_source`): downloaded once through `datasets`, kept
as a `save_to_disk` copy under the data cache and read from there, so the second run needs no network.
Downloads honour HF_ENDPOINT (e.g. https://hf-mirror.com on AutoDL) and HF_HOME; we never override them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

from huggingface_hub import constants as hub_constants

from grpo_pipeline.env.hubs import download_dataset, endpoint
from grpo_pipeline.env.paths import publish_once
from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.data.data_files import is_saved_copy
from grpo_pipeline.pipeline.data.source_spec import DataSourceError, SourceSpec


def hub_saved_copy_dir(cache_root: Path, name: str, dataset_config: Optional[str], revision: Optional[str],
                       source: str = "hf") -> Path:
    """Where the hub dataset's `save_to_disk` copy lives (a DatasetDict with all splits), per `model_source`.

    >>> hub_saved_copy_dir(Path("/c"), "openai/gsm8k", "main", None).as_posix()
    '/c/hub/openai__gsm8k__main__default'
    >>> hub_saved_copy_dir(Path("/c"), "AI-ModelScope/gsm8k", "main", None, "modelscope").as_posix()
    '/c/modelscope/AI-ModelScope__gsm8k__main__default'
    """
    slug = "__".join([name.replace("/", "__"), dataset_config or "default", revision or "default"])
    return cache_root / ("modelscope" if source == "modelscope" else "hub") / slug


def hub_endpoint() -> str:
    """The hub address `datasets` will use: $HF_ENDPOINT when set (mirrors), else huggingface.co."""
    return hub_constants.ENDPOINT  # huggingface_hub reads $HF_ENDPOINT into it when it is first imported


def load_hub_splits(spec: SourceSpec, cache_root: Path, source: str = "hf") -> Any:
    """All splits of a hub dataset (a DatasetDict): from our saved copy when there is one, else downloaded
    (from ModelScope when `model_source: modelscope`)."""
    from datasets import load_from_disk  # lazy: datasets imports torch

    saved = hub_saved_copy_dir(cache_root, spec.name, spec.config, spec.revision, source)
    if not is_saved_copy(saved):
        if source == "modelscope":
            splits = _download_from_modelscope(spec.name, spec.config, spec.revision)
        else:
            splits = _download(spec, saved)
        publish_once(saved, lambda staging: splits.save_to_disk(str(staging)), is_complete=is_saved_copy,
                     option="data_cache_dir")
        print(f"[grpo data] saved a copy at {saved}; later runs read it offline", file=sys.stderr)
    return load_from_disk(str(saved))


def _download(spec: SourceSpec, saved: Path) -> Any:
    from datasets import load_dataset  # lazy: datasets imports torch

    name, config = spec.name, spec.config
    endpoint = hub_endpoint()
    hf_home = os.environ.get("HF_HOME", "~/.cache/huggingface (default)")
    print(f"[grpo data] downloading {name} ({config}) from {endpoint} (HF_ENDPOINT); HF cache: {hf_home}",
          file=sys.stderr)
    try:
        splits = load_dataset(name, config, revision=spec.revision)
    except Exception as err:
        if "BuilderConfig" in str(err) or "config name" in str(err).lower():
            raise ConfigError(spec.config_option, f"hub dataset {excerpt(name)} ({spec.name_option}) has no config "
                              f"{excerpt(config)}: {err}. Set {spec.config_option} to one of its configs, or to null "
                              "for a dataset with one.") from None
        raise ConfigError(
            spec.name_option,
            f"could not load dataset {excerpt(name)} (config {excerpt(config)}) from {endpoint}: "
            f"{type(err).__name__}: {err}\nNo saved copy at {saved}, and no local file or folder {excerpt(name)} "
            "either. "
            "Fixes: check the network; in mainland China set HF_ENDPOINT=https://hf-mirror.com; offline, copy a "
            f"`save_to_disk` folder of the dataset to that path, or give {spec.name_option} a local path."
        ) from err
    return splits


def _download_from_modelscope(name: str, dataset_config: Optional[str], revision: Optional[str]) -> Any:
    """`model_source: modelscope`: the dataset repository's files from ModelScope (grpo_pipeline.env.hubs, the network
    boundary), read by `datasets` as a local folder (its data files and README configs), saved like a hub copy."""
    from datasets import load_dataset  # lazy: datasets imports torch

    print(f"[grpo data] downloading {name} ({dataset_config}) from ModelScope ({endpoint('modelscope')}); "
          f"cache: {os.environ.get('MODELSCOPE_CACHE', '~/.cache/modelscope (default)')} (MODELSCOPE_CACHE)",
          file=sys.stderr)
    folder = download_dataset(name, revision)
    try:
        splits = load_dataset(str(folder), dataset_config)
    except Exception as err:
        raise DataSourceError(f"could not read ModelScope dataset {excerpt(name)} (config {excerpt(dataset_config)}) "
                              f"downloaded to {folder}: {type(err).__name__}: {err}\nCheck dataset_config (None for "
                              "a single one) and that the repository holds .jsonl/.csv/.parquet data files.") from err
    return splits
