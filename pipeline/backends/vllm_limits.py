"""What a vLLM engine started in this process will refuse, found by `grpo train --check` before any model loads
(pipeline/preflight.py, its "engine" step), each naming the option to change: exit 2, never an engine that fails
after the model loaded, nor "an internal error".

The rules are the installed vLLM's own, read from it, not lists kept here:
- the model's attention head size against the attention backend vLLM picks on its CPU build
  (vllm/v1/attention/backends/cpu_attn.py `CPUAttentionBackend.supports_head_size`), the head size worked out as
  vLLM works it out (vllm/transformers_utils/model_arch_config_convertor.py);
- `vllm_max_model_length` against the model's own limit (vllm/config/model.py `_get_and_verify_max_len`, which
  raises at start-up), and against the prompt + completion the data needs (vLLM refuses a longer request at the
  first rollout);
- the memory share (`gpu_memory_utilization`, TRL's `vllm_gpu_memory_utilization`) against the memory free now:
  vLLM refuses to start when total x share is more than is free (vllm/v1/worker/utils.py `request_memory` on a GPU,
  vllm/v1/worker/cpu_worker.py on its CPU build, where the share is one of RAM, read with vLLM's own
  `get_memory_node_info`, cgroup limits included). The model the run loads first only takes more;
- `max_lora_rank`: one of the ranks vLLM's LoRA takes (vllm/config/lora.py `MaxLoRARanks`);
- `vllm_tensor_parallel_size`: it must divide the number of processes (TRL's VLLMGeneration._init_vllm).

vLLM is imported only inside these functions, and only when the run will start an engine here.
"""

from __future__ import annotations

import os
import typing
from typing import Any, Callable, Mapping, Optional

from pipeline.backends.settings import BackendSettings
from pipeline.backends.vllm_engine import on_cpu_build, trl_default_share, vllm_installed
from pipeline.config import ConfigError

GIB = 1024 ** 3


def check_run_engine(backend: Any, settings: BackendSettings, trl_args: Mapping[str, Any],
                     done: Mapping[str, Any]) -> str:
    """`check_engine` for a run: the model's config as the run reads it, the longest prompt + completion of the
    prepared training data (`done["train"]`, run_checks' record: a PreparedData; absent when the data check failed),
    the share the engine will be given."""
    # lazy: transformers imports torch (after the backend's prepare_environment)
    from pipeline.data.lora_targets import model_config

    train = done.get("train")
    longest = None if train is None else train.max_prompt_length + train.max_completion_length
    return check_engine(backend, settings, trl_args,
                        lambda: model_config(settings.model_name_or_path, settings.trust_remote_code), longest,
                        engine_share(backend, settings))


def check_engine(backend: Any, settings: BackendSettings, trl_args: Mapping[str, Any], hf_config: Callable[[], Any],
                 needed_length: Optional[int], share: Optional[float]) -> str:
    """Every rule above for a run that starts an engine here (else a line saying none is started). `hf_config`
    reads the model's transformers config; `needed_length`: the longest prompt + completion of the prepared data
    (None when the data check failed); `share`: the memory share the engine will be given (None: the backend
    decides it from the GPU, Unsloth's `auto`)."""
    if not backend.starts_vllm_engine(settings):
        return "no vLLM engine in this process"
    if not vllm_installed():
        return "not checked: vLLM is not installed (the trl check says how to install it)"
    # Unsloth runs vLLM's GPU build only. vLLM is imported from here on (the run imports it next anyway).
    cpu = backend.VLLM_ENGINE == "trl" and on_cpu_build()
    unread: list[str] = []  # rules whose vLLM module this vLLM lacks (another release's layout): said, not guessed
    limits = read_from_vllm(lambda: model_limits(hf_config(), trl_args.get("vllm_max_model_length")), unread)
    head_size, model_length = limits or (None, None)
    if cpu and head_size is not None:
        read_from_vllm(lambda: check_head_size(head_size, settings.model_name_or_path), unread)
    read_from_vllm(lambda: check_lora_rank(settings.max_lora_rank), unread)
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
    """`rule()`, or None with the missing module's name added to `unread` when this vLLM has no such module."""
    try:
        return rule()
    except ImportError as err:
        unread.append(getattr(err, "name", None) or str(err))
        return None


def engine_share(backend: Any, settings: BackendSettings) -> Optional[float]:
    """The memory share the engine will be given: the recipe's gpu_memory_utilization, or on the plain backend TRL's
    vllm_gpu_memory_utilization default (vllm_engine.trl_default_share); None where Unsloth decides it from the GPU
    (pipeline/backends/gpu_settings.py)."""
    if settings.gpu_memory_utilization != "auto":
        return float(settings.gpu_memory_utilization)
    if backend.VLLM_ENGINE == "trl":
        return trl_default_share()
    return None


def model_limits(hf_config: Any, max_model_len: Optional[int] = None) -> tuple[int, int]:
    """(head size, max_model_len) as vLLM works them out from the model's config; vLLM's own ValueError when
    `max_model_len` is above what the model takes."""
    # lazy: vLLM; vllm.config first (its model_arch_config_convertor import is circular the other way round)
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
        raise ConfigError("vllm_max_model_length", f"vLLM refuses {max_model_len}: {first_sentence(err)} Set "
                          f"vllm_max_model_length to at most {arch.derived_max_model_len_and_key[0]:g}, or leave "
                          "it unset (the model's own).") from None
    return int(arch.head_size), int(length)


def check_head_size(head_size: int, model: str) -> None:
    """vLLM's CPU attention takes only some head sizes ("Unsupported CPU attention configuration" at start-up)."""
    # lazy: vLLM
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    if not CPUAttentionBackend.supports_head_size(head_size):
        sizes = ", ".join(map(str, CPUAttentionBackend.get_supported_head_sizes()))
        raise ConfigError("vllm_mode", f"vLLM's CPU build cannot run {model}: its attention heads are {head_size} "
                          f"wide, and vLLM's CPU attention takes head sizes {sizes}. Set vllm_mode: none "
                          "(transformers generates the rollouts), or choose a model whose heads vLLM takes "
                          "(e.g. model_name_or_path: tiny-demo-vllm).")


def lora_ranks() -> tuple[int, ...]:
    """The max_lora_rank values vLLM's LoRAConfig takes (its `MaxLoRARanks` Literal)."""
    # lazy: vLLM
    from vllm.config.lora import MaxLoRARanks

    return tuple(typing.get_args(MaxLoRARanks))


def check_lora_rank(rank: int) -> None:
    ranks = lora_ranks()
    if rank not in ranks:
        above = [r for r in ranks if r >= rank]
        raise ConfigError("max_lora_rank", f"vLLM takes a max_lora_rank of {', '.join(map(str, ranks))} only, not "
                          f"{rank}. Set max_lora_rank: {above[0] if above else ranks[-1]}.")


def check_model_length(max_model_len: Optional[int], model_length: int, needed: Optional[int]) -> None:
    """The engine's length must hold the longest prompt and its completion (vLLM refuses a longer request)."""
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
    """(total, free, what) as vLLM reads them at start-up: RAM of memory node 0 on its CPU build (None, None when
    VLLM_CPU_KVCACHE_SPACE fixes the KV cache: vLLM then skips the check), the GPU's otherwise."""
    if cpu:
        if os.environ.get("VLLM_CPU_KVCACHE_SPACE", ""):
            return None, None, "RAM"
        # lazy: vLLM
        from vllm.utils.cpu_resource_utils import get_memory_node_info

        node = get_memory_node_info(0)
        return int(node.total_memory), int(node.available_memory), "RAM"
    import torch  # lazy: imported by the backend already

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


def first_sentence(err: BaseException) -> str:
    text = str(err)
    return text.split(". ", 1)[0].rstrip(".") + "."
