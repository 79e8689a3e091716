"""A fault of the environment, not of grpo-pipeline nor of the input, recognised at the command boundary
(pipeline/errors.py run_command) anywhere in an exception's chain, so it ends in exit 2 with the fix, never as "a bug
in grpo-pipeline". Read from the raising library's source (torch 2.13, vLLM 0.31), matched by class name and module
(no import of torch or vLLM) and by text:
- another process of the run is gone: torch.distributed's DistError family (NCCL's "communicator was aborted", its
  watchdog's timeout, the rendezvous store's), gloo's "Connection closed by peer" (gloo/transport/tcp/pair.cc);
- vLLM's engine process died: vllm.v1.engine.exceptions.EngineDeadError;
- not enough memory: vLLM's start-up and KV-cache refusals (vllm/v1/worker/utils.py request_memory,
  v1/worker/cpu_worker.py, v1/core/kv_cache_utils.py) and torch's OutOfMemoryError.
"""

from __future__ import annotations

from typing import Optional

from grpo_pipeline.env.text import exception_chain, printable, shorten

# (class name, module prefix) of torch.distributed's errors: torch._C._DistError and its subclasses, as
# torch/distributed/__init__.py exports them.
DIST_ERRORS = {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}
PEER_TEXTS = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing",
              "communicator was aborted", "Watchdog caught collective operation timeout")
MEMORY_TEXTS = ("on startup is less than desired", "is less than requested memory for kv",
                "No available memory for the cache blocks",
                "larger than the available KV cache memory", "CUDA out of memory")

RESUME = ("then run the same command again (`grpo train` resumes from the newest checkpoint: --resume auto, its "
          "default)")


def environment_fault(err: BaseException) -> Optional[str]:
    """What happened and the fix, for an environment's fault anywhere in `err`'s chain; None for anything else.

    >>> environment_fault(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1736."))[:44]
    'another process of this run stopped or canno'
    >>> environment_fault(RuntimeError("list index out of range")) is None
    True
    """
    for cause in exception_chain(err):
        kind, text = type(cause), printable(cause)
        said = shorten(f"{kind.__name__}: {text}".splitlines()[0] if text else kind.__name__, 300)
        if kind.__name__ == "EngineDeadError" and kind.__module__.startswith("vllm"):
            return (f"vLLM's engine process died ({said}). Its cause is printed above this line, most often memory "
                    "(the machine's out-of-memory killer, or another process on the GPU). Lower "
                    f"gpu_memory_utilization or free memory, {RESUME}.")
        if any(t in text for t in MEMORY_TEXTS) or kind.__name__ == "OutOfMemoryError":
            return (f"not enough free memory ({said}). Other processes hold it, or the run asks for more than the "
                    "machine has: free memory, or lower gpu_memory_utilization (vLLM's share; on its CPU build "
                    "VLLM_CPU_KVCACHE_SPACE too, when set), "
                    "per_device_train_batch_size or max_completion_length (`grpo plan` sizes them), "
                    f"{RESUME}.")
        dist = kind.__name__ in DIST_ERRORS and kind.__module__.startswith("torch")
        if dist or any(t in text for t in PEER_TEXTS):
            return (f"another process of this run stopped or cannot be reached ({said}). Its own log (on its node) "
                    "says why, most often memory or a kill; this process cannot go on without it. Fix that, "
                    f"{RESUME}.")
    return None
