"""This checkout importable as `grpo_pipeline` without installing it: the GPU machine gets the working tree, not an
install. A folder holding grpo_pipeline/{pipeline,rewards,env} as links to the checkout's folders goes first on
sys.path (and on the children's PYTHONPATH); where the project is installed from this checkout (`pip install -e .`)
the same files load either way."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("pipeline", "rewards", "env")  # setup.py's: each installs as grpo_pipeline.<folder>


def checkout_site() -> Path:
    """The folder to put on the import path; made (links replaced atomically) on first use, then reused."""
    site = Path(tempfile.gettempdir()) / f"grpo-pipeline-site-{hashlib.sha1(bytes(REPO_ROOT)).hexdigest()[:12]}"
    package = site / "grpo_pipeline"
    package.mkdir(parents=True, exist_ok=True)
    for folder in FOLDERS:
        link = package / folder
        if not (link.is_symlink() and link.resolve() == REPO_ROOT / folder):
            staged = package / f".{folder}.{os.getpid()}"
            staged.symlink_to(REPO_ROOT / folder, target_is_directory=True)
            os.replace(staged, link)
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    return site
