"""The fault table's cases (tests/fault_table.py) of faults v5 (issue 59) about the environment around the engine: a fault
of the machine or of another process is exit 2 with what happened and the fix, never "a bug in grpo-pipeline".
Each raises what torch or vLLM raise (their classes' texts, env/faults.py) where a run would meet it."""

from __future__ import annotations

from fault_kit import Fault, quick, raise_in

# gloo's text when the other process of a 2-process group was killed (printed by a real group; gloo/transport/tcp)
GLOO_PEER_GONE = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                  "[127.0.0.1]:1736. This is typically caused by a remote worker crashing. Check the logs of the "
                  "remote worker before reporting an error.")
# vLLM's CPU worker refusing its share at start-up (vllm/v1/worker/cpu_worker.py)
VLLM_NO_MEMORY = ("Available memory on node 0 (17.7/23.5 GiB) on startup is less than desired CPU memory utilization "
                  "(0.9, 21.2 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls the fraction of "
                  "CPU memory reserved (despite its name).")

CASES: list[Fault] = [
    Fault("a DDP peer that died is exit 2 naming the other process", lambda d: quick(d),
          "another process of this run stopped", patch=raise_in("grpo_pipeline.pipeline.train._data", RuntimeError(GLOO_PEER_GONE)),
          absent="a bug in grpo-pipeline"),
    Fault("vLLM refusing its memory share at start-up is exit 2 naming the share", lambda d: quick(d),
          "gpu_memory_utilization", patch=raise_in("grpo_pipeline.pipeline.train._data", ValueError(VLLM_NO_MEMORY)),
          absent="a bug in grpo-pipeline"),
]
