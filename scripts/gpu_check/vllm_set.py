"""What the GPU check kit's wheel lists stand on: the GPU machine's Python, the error a wheel set raises, package
names in canonical form; and the vLLM set of the parts mode (wheels.py build --vllm): the version carried, its
requirements as pip read them (`resolve-vllm`), what the offline engine imports (`probe-vllm` checks it), what is
left out of the set or dropped from the wheel when trimming, and why."""

from __future__ import annotations

import json
from pathlib import Path


PYTHON_VERSION = "3.12"  # the GPU machine's python3

# vLLM for the parts mode. 0.26.0, not the pinned 0.31.0 (env/known_good.toml): 0.26.0 pins torch==2.11.0,
# torchvision==0.26.0 and torchaudio==2.11.0, which is the lent machine's image, and its kernels link
# libcudart.so.13 (the image's CUDA 13.0); 0.31.0 pins torch 2.13, which the image lacks and cannot carry.
VLLM_VERSION = "0.26.0"

# Its Requires-Dist as pip's resolver read them for CPython 3.12 on manylinux x86_64 (`wheels.py resolve-vllm`).
VLLM_RECORD = Path(__file__).with_name(f"vllm-{VLLM_VERSION}-requires.json")
# The same for the roots the one-call set carries at their env/known_good.toml pins (wheels.PINNED_ROOTS), as
# `python -m pip install --dry-run --no-deps --ignore-installed --report - NAME==VERSION ...` read them.
ROOTS_RECORD = Path(__file__).with_name("roots-requires.json")

# What the image lacks of vLLM's closure and the offline engine imports: the modules that `vllm.LLM`, the V1
# engine core, the GPU worker and model runner, Qwen2, LoRA, bitsandbytes and the FLASH_ATTN backend load, read
# for their module-level imports (an import inside a function or under `if`/`try: ... except ImportError` is
# lazy or optional), plus those packages' own requirements; then checked by importing those modules on CPU from the
# assembled set with Python 3.12 and torch 2.11 (docs/gpu.md), which found what reading missed: a class body that
# annotates with a LazyLoader's attribute loads the module at import (llguidance, xgrammar). Versions: pip's
# resolution for vllm==0.26.0 on 2026-12-04. pydantic, pydantic-core, msgspec, annotated-types and
# typing-inspection are in DEPENDENCIES.
VLLM_DEPENDENCIES = {
    "cachetools": "8.0.2",  # vllm.utils.cache
    "cbor2": "6.3.0",  # vllm.utils.hashing (prefix-cache block hashes)
    "compressed-tensors": "0.17.0",  # get_quantization_config imports every config class, compressed-tensors' too
    "loguru": "0.7.3",  # compressed-tensors
    "fastapi": "0.136.3",  # vllm.entrypoints.serve.utils.api_utils, reached from vllm.entrypoints.llm
    "starlette": "1.10.0",  # fastapi; vllm: starlette>=1.0.1
    "openai": "3.63.0",  # vllm.entrypoints.chat_utils (imported by vllm.entrypoints.llm)
    "httpx2": "2.17.0",  # openai 3.63
    "httpcore2": "2.17.0",  # httpx2
    "truststore": "0.10.5",  # httpx2, httpcore2
    "jiter": "0.19.0",  # openai
    "sniffio": "1.3.1",  # openai
    "openai-harmony": "0.0.8",  # vllm.entrypoints.chat_utils
    "partial-json-parser": "0.2.1.1.post7",  # vllm.tool_parsers.utils
    "pybase64": "1.5.1",  # vllm.utils.serial_utils
    "pyzmq": "27.3.0",  # vllm.utils.network_utils, vllm.v1.serial_utils (engine-core messages)
    "blake3": "1.0.11",  # vllm.multimodal.hasher (lazy, but 0.4 MiB: cheaper to carry than to be wrong about)
    # vllm.v1.structured_output imports backend_guidance and backend_xgrammar, whose dataclass fields are annotated
    # `llguidance.LLMatcher` / `xgr.GrammarMatcher`: evaluated when the class is made, so the LazyLoader loads them.
    "llguidance": "1.7.6",
    "xgrammar": "0.2.7",
    "apache-tvm-ffi": "0.1.10",  # xgrammar
}

# The modules of the offline engine's path that `probe-vllm` imports: the closure VLLM_DEPENDENCIES was read from.
VLLM_ENGINE_MODULES = (
    "vllm", "vllm.entrypoints.llm", "vllm.v1.engine.core", "vllm.v1.engine.llm_engine", "vllm.v1.engine.core_client",
    "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner",
    "vllm.model_executor.models.qwen2", "vllm.model_executor.model_loader.bitsandbytes_loader",
    "vllm.model_executor.layers.quantization.bitsandbytes", "vllm.model_executor.layers.quantization.compressed_tensors"
    ".compressed_tensors", "vllm.lora.request", "vllm.lora.worker_manager", "vllm.lora.lora_model",
    "vllm.lora.model_manager", "vllm.lora.peft_helper", "vllm.v1.worker.lora_model_runner_mixin",
    "vllm.v1.attention.backends.flash_attn", "vllm.v1.sample.sampler", "vllm.device_allocator.cumem",
    "vllm.compilation.backends", "vllm.v1.structured_output", "vllm.utils.platform_utils",
    "vllm.model_executor.warmup.kernel_warmup",
)

_SERVER = "the OpenAI-compatible server (`vllm serve`) and its tooling; the offline LLM engine imports none of it"


_GRAMMAR = ("a structured-outputs backend (guided decoding) that vllm.v1.structured_output does not import: "
            "loaded only for a request that asks for it, and GRPO rollouts ask for none")

_MEDIA = "multimodal inputs (video/audio decoding, Mistral's tokenizer and images); Qwen2.5 is text-only"


_KERNELS = ("kernels for other paths: vLLM imports them inside functions or behind importlib.util.find_spec / "
            "`try: ... except ImportError`, and a dense Qwen2 on sm90 runs FLASH_ATTN (FA3) and vLLM's own "
            "_C_stable_libtorch ops")

# vLLM's requirements that the image lacks and the parts mode leaves behind, with the reason.
VLLM_LEFT_OUT = {
    "anthropic": _SERVER, "mcp": _SERVER, "model-hosting-container-standards": _SERVER,
    "prometheus-fastapi-instrumentator": _SERVER, "watchfiles": _SERVER, "python-json-logger": _SERVER,
    "ijson": _SERVER + " (the Mistral tool parser)",
    "setproctitle": "names worker processes only, behind `try: import setproctitle except ImportError: return`",
    "opentelemetry-sdk": _SERVER + " (tracing, behind `try`)", "opentelemetry-api": _SERVER + " (tracing)",
    "opentelemetry-exporter-otlp": _SERVER + " (tracing)",
    "opentelemetry-semantic-conventions-ai": _SERVER + " (tracing)",
    "outlines-core": _GRAMMAR, "lark": _GRAMMAR,
    "lm-format-enforcer": _GRAMMAR, "jsonschema": _GRAMMAR + " (vllm 0.26.0 imports jsonschema nowhere)",
    "mistral-common": _MEDIA, "torchcodec": _MEDIA, "pynvvideocodec": _MEDIA,
    "flashinfer-python": ("an optional attention/sampling backend: vllm.utils.flashinfer.has_flashinfer() finds it "
                          "with importlib.util.find_spec and it needs nvcc or its cubins; Hopper's default for "
                          "Qwen2 is FLASH_ATTN with FA3 (fa_utils.get_flash_attn_version)"),
    "tilelang": _KERNELS + " (DeepSeek mHC)",
    "nvidia-cudnn-frontend": _KERNELS + " (FA CuTe benchmarks)",
    "nvidia-cutlass-dsl": _KERNELS + " (FA4, ll_bf16 router GEMM behind is_available())",
    "quack-kernels": _KERNELS + " (CuTe DSL)", "tokenspeed-mla": _KERNELS + " (MLA attention)",
    "humming-kernels": _KERNELS + " (humming quantization)", "nvtx": _KERNELS + " (profiling annotations)",
    "fastsafetensors": _KERNELS + " (an optional weight loader, behind `try`)",
    "depyf": "only with CompilationConfig's debug dump path (vllm.compilation.monitor)",
}

# What trimming removes from the vllm wheel (keep_file), and why a dense model on sm90 never needs it; read in the
# wheel: vllm/vllm_flash_attn/flash_attn_interface.py imports _vllm_fa2_C and _vllm_fa3_C each in its own
# `try: ... except ImportError` (FA2_AVAILABLE / FA3_AVAILABLE), v1/attention/backends/fa_utils.py picks FA3 on
# compute capability 9.x when it is available (FA2 only for ALiBi, batch invariance or when FA3 is missing),
# and flash_attn.py passes that version to every call; platforms/cuda.py import_kernels loads
# _moe_C_stable_libtorch under contextlib.suppress(ImportError), and _custom_ops.py calls torch.ops._moe_C only
# inside the MoE functions (moe_align_block_size, topk_softmax, grouped_topk, moe_wna16_*, shuffle_rows) and
# registers its one fake op behind hasattr(torch.ops, "_moe_C"); unsloth's disable_broken_vllm skips a
# ModuleNotFoundError for it.
VLLM_DROPPED = {
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "FlashAttention 2 (290 MiB unpacked): Hopper runs FA3",
    "vllm/_moe_C_stable_libtorch.abi3.so": "the fused-MoE kernels: Qwen2.5 is dense",
    "vllm/vllm-rs": "the Rust HTTP frontend, used only with VLLM_USE_RUST_FRONTEND=1 (envs.py)",
}

# C/C++/CUDA sources under vllm/third_party/ (DeepGEMM's and fmha_sm100's JIT headers: FP8 block GEMM and
# Blackwell attention), and DeepGEMM's extension builds for the Pythons other than the machine's 3.12.
VLLM_DROPPED_THIRD_PARTY_SUFFIXES = (".h", ".hpp", ".cuh", ".inl", ".cu")

VLLM_THIRD_PARTY = "vllm/third_party/"


class WheelSetError(Exception):
    """The wheel set cannot be built or used; the message says why and what to do."""


def canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def stored_records(path: Path = VLLM_RECORD) -> dict[str, dict]:
    """The stored Requires-Dist records, by canonical name: of vllm VLLM_VERSION and the packages of its closure
    (resolve-vllm wrote them), or with ROOTS_RECORD of the carried roots."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return {canonical(record["name"]): record for record in data["records"]}


def requirement_applies(requirement, python: str = PYTHON_VERSION) -> bool:
    """Whether a Requires-Dist line applies on CPython `python` on linux x86_64 with no extra requested.

    >>> from packaging.requirements import Requirement
    >>> requirement_applies(Requirement('torch; python_version < "3.12"')), requirement_applies(Requirement('x; extra == "a"'))
    (False, False)
    """
    if requirement.marker is None:
        return True
    return requirement.marker.evaluate({"python_version": python, "python_full_version": f"{python}.0", "extra": "",
                                        "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                                        "os_name": "posix", "implementation_name": "cpython",
                                        "platform_python_implementation": "CPython"})


def probe_imports(modules=VLLM_ENGINE_MODULES) -> tuple[dict[str, str], dict[str, str]]:
    """Import each module; returns ({module: the third-party module it lacks}, {module: any other error}). Run
    with the installed set on PYTHONPATH (`probe-vllm`): on CPU a missing package shows here, while what needs the
    GPU machine (libcuda.so.1, the CUDA kernels) shows as another error.

    >>> probe_imports(("json", "no_such_package_xyz.sub"))
    ({'no_such_package_xyz.sub': 'no_such_package_xyz'}, {})
    """
    import importlib

    missing, other = {}, {}
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if (err.name or "").split(".")[0] == module.split(".")[0] and module.split(".")[0] == "vllm":
                other[module] = f"ModuleNotFoundError: {err.name}"
            else:
                missing[module] = err.name or str(err)
        except Exception as err:  # noqa: BLE001 - each module's failure is reported, the probe goes on
            other[module] = f"{type(err).__name__}: {str(err)[:200]}"
    return missing, other
