"""The GPU check's steps (run_check.py): their names and order, the units a step runs, the time each may take of
the budget, and which steps `--only` chose."""

from __future__ import annotations

from cases import BENCH_SHAPES, CHAIN_MODELS, PRECISIONS, TINY_MODEL, VLLM_CHAIN_CASES, VLLM_CHAIN_SUBSTEPS, VLLM_LABEL


# The product's own path first: the Unsloth chain (with vLLM where it is installed, then without) right after the
# quick steps, then the plain chain, then the benchmark, which is what the budget cuts if anything is cut.
STEPS = ("image", "env", "models", "chain-unsloth-vllm", "chain-unsloth", "chain-plain", "bench-plain",
         "bench-unsloth", "bench-unsloth-vllm")

VLLM_STEPS = ("chain-unsloth-vllm", "bench-unsloth-vllm")  # planned only where vllm is installed (the parts mode)


PROCESS_PER_UNIT = ("chain-unsloth-vllm",)  # one vLLM engine per process: a child per unit (a sub-step)

# Each step's weight in the budget (seconds, restarts of a crashed child included): the steps planned share the
# whole budget in these proportions, so a step that overruns its share only takes time from the steps after it,
# never from the ones before. Without vllm the steps planned are all but VLLM_STEPS, whose weights add up to
# BUDGET_S: those shares are the seconds written here.
# Estimated for an H200; the first run there (2026-12-04, docs/gpu.md) measured about 170 s for one tiny-model
# Unsloth unit alone (compile), so this plan reaches the tiny models only: use --only for the rest (the budget is
# then shared among the steps chosen). The vLLM chain's five processes each import Unsloth and start an engine.
STEP_CAPS = {"image": 5, "env": 20, "models": 25, "chain-unsloth-vllm": 300, "chain-unsloth": 190, "chain-plain": 110,
             "bench-plain": 60, "bench-unsloth": 70, "bench-unsloth-vllm": 80}

DRY_RUN_CAP_S = 300  # per step on CPU (the tests' dry run), where the GPU estimates do not apply


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def step_units(step: str, dry_run: bool = False) -> list[str]:
    """The units a step runs, in order ([] for the steps that start no child); a unit of the vLLM chain is one
    sub-step of a case (chain/unsloth-vllm/<model>/<precision>/<sub-step>).

    >>> step_units("chain-unsloth-vllm")[:2]
    ['chain/unsloth-vllm/qwen2.5-0.5b/nf4/train', 'chain/unsloth-vllm/qwen2.5-0.5b/nf4/resume']
    """
    if step == "models":
        return ["models"]
    if step in ("image", "env"):
        return []
    kind, backend = step.split("-", 1)
    if kind == "chain" and backend == VLLM_LABEL:
        return [f"chain/{backend}/{m}/{p}/{sub}" for m, p in VLLM_CHAIN_CASES for sub in VLLM_CHAIN_SUBSTEPS]
    if kind == "chain":
        return [f"chain/{backend}/{m}/{p}" for m in CHAIN_MODELS for p in PRECISIONS]
    return [f"bench/{backend}/{s}" for s in ((TINY_MODEL,) if dry_run else BENCH_SHAPES)]
