"""Where the project keeps its own files: the one cache root.

Below env/paths.py and env/disk.py, which both need it: the writers under it, and the storage-failure message that
names GRPO_CACHE_DIR for a place inside it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The project's one cache folder: $GRPO_CACHE_DIR, else $XDG_CACHE_HOME/grpo-pipeline, else
    ~/.cache/grpo-pipeline. Prepared datasets, the unpacked tokenizer and the built-in models live under it."""
    root = os.environ.get("GRPO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "grpo-pipeline"
    )
    return Path(root)
