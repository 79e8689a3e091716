"""The vLLM half of the fake GPU boundary: SamplingParams, LoRARequest, the in-process LLM (generate,
sleep/wake_up) and unsloth_zoo.vllm_utils.load_lora, bound to the pinned wheels' signatures.

Split from tests/fake_unsloth.py (which re-exports these names and installs them as modules).
"""

from __future__ import annotations

import inspect
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tests.fake_signatures import (SAMPLING_FIELDS, SIG_LLM_GENERATE, SIG_LLM_SLEEP,
                                   SIG_LLM_WAKE_UP, SIG_LOAD_LORA, SNAPSHOT, STATE, _bind, _parameter, _record)

# ---------------------------------------------------------------------------------------------- vllm


class VLLMValidationError(Exception):
    """vllm.exceptions.VLLMValidationError: VLLMClientError -> VLLMError -> Exception (not ValueError)."""

    def __init__(self, message: str, *, parameter: Optional[str] = None, value: Any = None):
        super().__init__(message)
        self.parameter = parameter
        self.value = value


class SamplingParams:
    """vLLM's SamplingParams (the pinned release): the snapshot's keyword fields and defaults, and the range
    checks of SamplingParams._verify_args for the fields we pass."""

    def __init__(self, **kwargs: Any):
        unknown = sorted(set(kwargs) - set(SAMPLING_FIELDS))
        if unknown:  # msgspec.Struct: "Unexpected keyword argument 'min_pp'"
            raise TypeError(f"Unexpected keyword argument {unknown[0]!r}")
        for name, entry in SAMPLING_FIELDS.items():
            default = entry.get("default", {})
            setattr(self, name, kwargs.get(name, default.get("value")))
        self.given = dict(kwargs)  # what the caller set, for assertions
        self._post_init()
        self._verify_args()

    def _post_init(self) -> None:  # SamplingParams.__post_init__'s normalising, for the fields a caller reads back
        for name in ("stop", "stop_token_ids", "bad_words"):
            value = getattr(self, name)
            setattr(self, name, [] if value is None else [value] if isinstance(value, (str, int)) else list(value))
        if self.output_kind is None:
            self.output_kind = "CUMULATIVE"  # RequestOutputKind.CUMULATIVE (tests compare enum members by name)
        if self.skip_reading_prefix_cache is None:  # prompt log-probs need every prompt token computed
            self.skip_reading_prefix_cache = self.prompt_logprobs is not None

    def _verify_args(self) -> None:  # SamplingParams._verify_args, the checks for fields we pass
        if not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise VLLMValidationError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not isinstance(self.top_k, int):
            raise VLLMValidationError(f"top_k must be an integer, got {type(self.top_k).__name__}")
        if not 0.0 <= self.min_p <= 1.0:
            raise VLLMValidationError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise VLLMValidationError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.prompt_logprobs is not None and self.prompt_logprobs != -1 and self.prompt_logprobs < 0:
            raise VLLMValidationError(f"prompt_logprobs must be non-negative or -1, got {self.prompt_logprobs}.")
        if self.repetition_penalty <= 0.0:
            raise VLLMValidationError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")


# msgspec gives the real class a signature of its fields: Unsloth's grpo_update_SamplingParams filters by it.
SamplingParams.__signature__ = inspect.Signature(
    [_parameter(entry, "KEYWORD_ONLY") for entry in SAMPLING_FIELDS.values()])


def _sampling_params(**kwargs: Any) -> SamplingParams:
    _record("vllm.SamplingParams", **kwargs)
    return SamplingParams(**kwargs)


class LoRARequest:
    """vllm/lora/request.py: an array_like msgspec struct, so positional order matters."""

    def __init__(self, *args: Any, **kwargs: Any):
        sig = inspect.Signature([_parameter({**f, "kind": "POSITIONAL_OR_KEYWORD"})
                                 for f in SNAPSHOT["structs"]["LoRARequest"]["fields"]])
        values = _bind(sig, "LoRARequest", args, kwargs)
        self.__dict__.update(values)
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        assert self.lora_path, "lora_path cannot be empty"


@dataclass
class CompletionOutput:
    text: str
    token_ids: list[int]  # vllm.outputs.CompletionOutput: the generated ids, the stop (EOS) token included


@dataclass
class RequestOutput:
    prompt: str
    outputs: list[CompletionOutput]
    # vllm.outputs.RequestOutput.prompt_logprobs: None unless SamplingParams.prompt_logprobs was set; then None for
    # the first prompt token and one {token id: Logprob} per later one (vllm/v1/engine/logprobs.py).
    prompt_logprobs: Optional[list] = None


@dataclass
class Logprob:
    """vllm.logprobs.Logprob."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


def fake_prompt_logprob(position: int, token: int, lora_request: Any) -> float:
    """The fake engine's log-probability of prompt token `token` at `position`, under the adapter it was sent:
    each load_lora(load_tensors=True) is a new id, so a later request scores differently, as new weights would."""
    lora_id = getattr(lora_request, "lora_int_id", 0) or 0
    return -(0.01 * position + 0.001 * token + 0.1 * lora_id)


def _prompt_ids(prompt: Any) -> Optional[list[int]]:
    """A TokensPrompt ({"prompt_token_ids": [...]}, vllm/inputs/llm.py) gives its ids; a text prompt none here."""
    return list(prompt["prompt_token_ids"]) if isinstance(prompt, dict) else None


def _scored_prompt(prompt: Any, params: Any, lora_request: Any) -> Optional[list]:
    ids = _prompt_ids(prompt)
    if getattr(params, "prompt_logprobs", None) is None or ids is None:
        return None
    return [None] + [{token: Logprob(fake_prompt_logprob(pos, token, lora_request), rank=1)}
                     for pos, token in enumerate(ids) if pos > 0]


def fake_completion(prompt: str) -> str:
    """What the fake engine 'generates' for a prompt: derived from it, so order mix-ups show."""
    return f"<answer>{len(prompt)}</answer>"


class FakeLLM:
    """vLLM's LLM as Unsloth builds it in-process (FastLlamaModel.from_pretrained -> load_vllm)."""

    def __init__(self, max_lora_rank: int, gpu_memory_utilization: float, standby: bool):
        self.max_lora_rank = max_lora_rank
        self.gpu_memory_utilization = gpu_memory_utilization
        self.standby = standby
        self.sleeping = False
        self.shared_weights = True
        self.llm_engine = self  # is_sleeping() lives on llm.llm_engine

    def is_sleeping(self) -> bool:
        return self.sleeping

    def sleep(self, *args: Any, **kwargs: Any) -> None:
        a = _bind(SIG_LLM_SLEEP, "LLM.sleep", args, kwargs)
        _record("vllm.LLM.sleep", a["level"])
        if a["level"] >= 1:  # LLMEngine.sleep: a str level raises TypeError here, as for real
            pass
        self.sleeping = True

    def wake_up(self, *args: Any, **kwargs: Any) -> bool:
        a = _bind(SIG_LLM_WAKE_UP, "LLM.wake_up", args, kwargs)
        tags = a["tags"]
        if tags is not None and not set(tags) <= {"weights", "kv_cache", "scheduling"}:
            raise ValueError(f"wake_up tags must be in ('weights', 'kv_cache', 'scheduling'), got {tags}")
        _record("vllm.LLM.wake_up")
        self.sleeping = False
        return True

    def generate(self, *args: Any, **kwargs: Any):
        a = _bind(SIG_LLM_GENERATE, "LLM.generate", args, kwargs)
        _record("model.fast_generate", a["prompts"], sampling_params=a["sampling_params"],
                lora_request=a["lora_request"], sleeping=self.sleeping)
        if self.sleeping:
            raise RuntimeError("fake vLLM: generate() on a sleeping engine")
        if a["sampling_params"] is not None and not isinstance(a["sampling_params"], (SamplingParams, list)):
            raise TypeError(f"sampling_params must be SamplingParams, got {type(a['sampling_params']).__name__}")
        prompts = a["prompts"]
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        return [RequestOutput(p, [CompletionOutput(fake_completion(p), list(fake_completion(p).encode()) + [0])],
                              _scored_prompt(p, a["sampling_params"], a["lora_request"]))
                for p in prompts]


# ---------------------------------------------------------------------------------------------- unsloth_zoo


def load_lora(*args: Any, **kwargs: Any):
    """unsloth_zoo.vllm_utils.load_lora: the path branch, or load_tensors=True (live weights)."""
    a = _bind(SIG_LOAD_LORA, "load_lora", args, kwargs)
    model, save_directory = a["model"], a["save_directory"]
    _record("unsloth_zoo.load_lora", model, save_directory, load_tensors=a["load_tensors"])
    engine = getattr(model, "vllm_engine", None)
    if engine is None:
        raise AttributeError(f"'{type(model).__name__}' object has no attribute 'vllm_engine'")
    request_id = STATE.lora_request_id if a["lora_request_id"] is None else a["lora_request_id"]
    if a["load_tensors"]:
        # _live_lora_config: writes the live adapter_config.json into save_directory (PeftConfig.save_pretrained,
        # which creates the folder; a relative one lands in the working directory).
        Path(save_directory).mkdir(parents=True, exist_ok=True)
        Path(save_directory, "adapter_config.json").write_text(json.dumps(model.peft_config["default"]))
        request = _LiveLoRARequest(str(request_id), request_id, save_directory)
    else:
        if not os.path.exists(save_directory):
            raise OSError(f"Unsloth: LoRA filepath = {save_directory} does not exist!")
        r = json.loads(Path(save_directory, "adapter_config.json").read_text()).get("r")
        if isinstance(r, int) and r > engine.max_lora_rank:  # _check_lora_rank_fits
            raise ValueError(f"Unsloth: The LoRA adapter in {save_directory} has r = {r} ...")
        request = LoRARequest(str(request_id), request_id, save_directory)
    STATE.lora_request_id += 1
    return request


class _LiveLoRARequest(LoRARequest):
    """LoRARequest(..., lora_tensors=..., lora_config=...) in the real code."""

    live = True
