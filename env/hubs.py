"""Where hub ids are downloaded from: the Hugging Face Hub (`model_source: hf`) or ModelScope (`modelscope`).

`download_model` and `download_dataset` are the only calls into the `modelscope` package; both return a local folder
loaded like any other. ModelScope honours MODELSCOPE_CACHE (on AutoDL put it on /root/autodl-tmp) and
MODELSCOPE_DOMAIN; the Hugging Face side HF_ENDPOINT and HF_HOME. We never override them.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

SOURCES = ("hf", "modelscope")
MODELSCOPE_INSTALL = "pip install 'grpo-pipeline[modelscope]'"


class HubSourceError(ValueError):
    """`model_source: modelscope` without the modelscope package; the message says how to install it."""


def endpoint(source: str) -> str:
    """The address downloads from `source` go to, as its own client resolves it (MODELSCOPE_DOMAIN, HF_ENDPOINT)."""
    if source == "modelscope":
        domain = os.environ.get("MODELSCOPE_DOMAIN", "www.modelscope.cn").strip().rstrip("/")
        return domain if "://" in domain else f"https://{domain}"
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").strip().rstrip("/")


def reachable(address: str, timeout: float = 2.0) -> bool:
    """One TCP connect to the hub's host, instead of a client's minute of retries."""
    url = urlparse(address)
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=timeout):
            return True
    except (OSError, TypeError, ValueError):
        return False


def modelscope_installed() -> bool:
    return importlib.util.find_spec("modelscope") is not None


def require_modelscope() -> None:
    """Raise HubSourceError, with the install command, unless the modelscope package is importable."""
    if not modelscope_installed():
        raise HubSourceError(f"model_source: modelscope needs the modelscope package, which is not installed. "
                             f"Install it: {MODELSCOPE_INSTALL}; or set model_source: hf.")


def download_model(model_id: str, revision: Optional[str] = None) -> str:
    """The local folder of a ModelScope model (downloaded once into MODELSCOPE_CACHE)."""
    return str(_download("snapshot_download", "model", model_id, revision))


def download_dataset(dataset_id: str, revision: Optional[str] = None) -> Path:
    """The local folder of a ModelScope dataset repository (its data files, as uploaded)."""
    return Path(_download("dataset_snapshot_download", "dataset", dataset_id, revision))


def _download(function: str, what: str, repo_id: str, revision: Optional[str]) -> str:
    require_modelscope()
    import modelscope

    try:
        return getattr(modelscope, function)(repo_id, revision=revision)
    except Exception as err:
        raise RuntimeError(
            f"could not download {what} {repo_id!r} from ModelScope ({endpoint('modelscope')}): {type(err).__name__}: "
            f"{err}\nFixes: check the id on modelscope.cn (ModelScope ids can differ from the Hugging Face ones), check "
            "the network (on AutoDL: `source /etc/network_turbo`), or set model_source: hf (in mainland China with "
            "HF_ENDPOINT=https://hf-mirror.com).") from err
