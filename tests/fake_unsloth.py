"""A recording fake of the GPU boundary: `unsloth`, `unsloth_zoo.vllm_utils` and `vllm`.

It lets tests check OUR side of the boundary (the exact calls and arguments
pipeline/backends/unsloth.py makes, and what it does with the results) on a machine with no
GPU. It is not Unsloth: nothing here says the real calls work, only that we make them as the
pinned releases define them. Signatures were copied, by reading, from:

  unsloth 2026.10.9
    FastLanguageModel.from_pretrained   unsloth/models/loader.py:1241-1271 (+ unsloth_vllm_standby,
                                        which flows via **kwargs to FastLlamaModel, llama.py:3487-3513)
    FastLanguageModel.get_peft_model    unsloth/models/llama.py:4569-4590 (the fake has no **kwargs, so a
                                        misspelt keyword fails here instead of deep inside PEFT)
    standby check                       unsloth/models/llama.py:3538-3541
    vLLMSamplingParams                  unsloth/models/rl.py:147-152
    import-order warning                unsloth/_gpu_init.py:20-21, 135-143
    patch_peft_fast_inference           unsloth/models/_utils.py:8079-8102 (load_lora only with an engine)
    save_pretrained_merged              unsloth/save.py:6765-6788 ("merged_4bit" refused: save.py:6389-6395)
    save_pretrained_gguf                unsloth/save.py:4559-4581 (GGUF goes to f"{dir}_gguf": save.py:3965-3967)
  unsloth_zoo 2026.10.9
    vllm_utils.load_lora                unsloth_zoo/vllm_utils.py:7183-7272 (path branch)
    vllm_utils._check_lora_rank_fits    unsloth_zoo/vllm_utils.py:5572-5590
    vllm_utils.save_lora                unsloth_zoo/vllm_utils.py:5485-5506
  vLLM 0.33 (sdist, summarised in /work/shared/docs/upstream-apis.md §5)
    SamplingParams                      vllm/sampling_params.py (keyword fields; max_tokens defaults to 16)
    LoRARequest                         vllm/lora/request.py (lora_int_id >= 1, lora_path non-empty)
    LLM.generate                        vllm/entrypoints/llm.py:417

Use:
    handle = install()          # a meta-path finder; `import unsloth` now builds the fake
    ...                         # code under test
    record_calls()              # the ordered call log (for ordering checks across modules)
    import_state()              # os.environ / sys.modules at the moment `import unsloth` ran
    handle.uninstall()
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

FAKE_MODULES = ("unsloth", "unsloth_zoo", "unsloth_zoo.vllm_utils", "vllm", "vllm.lora", "vllm.lora.request")
PACKAGES = {"unsloth", "unsloth_zoo", "vllm", "vllm.lora"}
CRITICAL_MODULES = ("trl", "transformers", "peft")  # unsloth/_gpu_init.py:20


@dataclass
class Call:
    name: str
    args: tuple
    kwargs: dict


@dataclass
class FakeState:
    calls: list[Call] = field(default_factory=list)
    import_state: Optional[dict] = None
    bf16_supported: bool = True  # False simulates a T4/V100 (dtype=None -> float16, llama.py:3601-3602)
    lora_request_id: int = 1  # unsloth_zoo's global LORA_REQUEST_ID


STATE = FakeState()


def record_calls() -> list[Call]:
    """The ordered log of every boundary call since install()."""
    return list(STATE.calls)


def calls_named(name: str) -> list[Call]:
    return [c for c in STATE.calls if c.name == name]


def import_state() -> Optional[dict]:
    """{'UNSLOTH_VLLM_STANDBY': value or None, 'already_imported': [...]} at `import unsloth` time."""
    return STATE.import_state


def _record(name: str, *args: Any, **kwargs: Any) -> None:
    STATE.calls.append(Call(name, args, dict(kwargs)))


# ---------------------------------------------------------------------------------------------- vllm


@dataclass(kw_only=True)
class SamplingParams:
    """vLLM 0.33 SamplingParams fields (keyword use). Unknown keywords raise TypeError, as msgspec does."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Any = None
    stop_token_ids: Any = None
    bad_words: Any = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: Optional[int] = None
    structured_outputs: Any = None
    logit_bias: Any = None
    allowed_token_ids: Any = None
    extra_args: Any = None

    def __post_init__(self) -> None:
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), -1 (disable), or at least 1, got {self.top_k}.")


def _sampling_params(**kwargs: Any) -> SamplingParams:
    _record("vllm.SamplingParams", **kwargs)
    params = SamplingParams(**kwargs)
    params.given = dict(kwargs)  # what the caller set, for exact-field assertions
    return params


@dataclass
class LoRARequest:
    """vllm/lora/request.py: positional order matters (array_like msgspec struct)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: Optional[str] = None
    load_inplace: bool = False
    is_3d_lora_weight: bool = False

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        assert self.lora_path, "lora_path cannot be empty"


@dataclass
class CompletionOutput:
    text: str


@dataclass
class RequestOutput:
    prompt: str
    outputs: list[CompletionOutput]


def fake_completion(prompt: str) -> str:
    """What the fake engine 'generates' for a prompt: derived from it, so order mix-ups show."""
    return f"<answer>{len(prompt)}</answer>"


class FakeLLM:
    """vLLM's LLM as Unsloth builds it in-process (llama.py:4263-4298)."""

    def __init__(self, max_lora_rank: int, gpu_memory_utilization: float, standby: bool):
        self.max_lora_rank = max_lora_rank
        self.gpu_memory_utilization = gpu_memory_utilization
        self.standby = standby
        self.sleeping = False
        self.shared_weights = True
        self.llm_engine = self  # is_sleeping() lives on llm.llm_engine

    def is_sleeping(self) -> bool:
        return self.sleeping

    def sleep(self, level: Any = 1) -> None:
        _record("vllm.LLM.sleep", level)
        self.sleeping = True

    def wake_up(self, tags: Any = None) -> None:
        _record("vllm.LLM.wake_up")
        self.sleeping = False

    def generate(self, prompts: Any, sampling_params: Any = None, *, use_tqdm: bool = True, lora_request: Any = None,
                 priority: Any = None, tokenization_kwargs: Any = None, mm_processor_kwargs: Any = None):
        _record("model.fast_generate", prompts, sampling_params=sampling_params, lora_request=lora_request,
                sleeping=self.sleeping)
        if self.sleeping:
            raise RuntimeError("fake vLLM: generate() on a sleeping engine")
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        return [RequestOutput(p, [CompletionOutput(fake_completion(p))]) for p in prompts]


# ---------------------------------------------------------------------------------------------- models


@dataclass
class FakeConfig:
    _name_or_path: str
    dtype: Any


class FakeTokenizer:
    def __init__(self, name: str):
        self.name = name
        self.chat_template = "{{ fake }}"

    def save_pretrained(self, save_directory: str) -> None:
        _record("tokenizer.save_pretrained", save_directory)
        Path(save_directory).mkdir(parents=True, exist_ok=True)
        (Path(save_directory) / "fake_tokenizer.json").write_text(json.dumps({"name": self.name}))


def _write_tiny_safetensors(path: Path, tensors: dict[str, tuple[int, int]]) -> None:
    """A valid safetensors file with zero-filled float16 tensors of the given shapes."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({name: np.zeros(shape, dtype=np.float16) for name, shape in tensors.items()}, str(path))


class FakeModel:
    """What from_pretrained returns. With fast_inference: `vllm_engine` and `fast_generate`, but no
    load_lora/save_lora (those come with get_peft_model). Saving functions: llama.py:4499."""

    is_peft = False

    def __init__(self, name: str, dtype: Any, engine: Optional[FakeLLM]):
        self.config = FakeConfig(name, dtype)
        if engine is not None:
            self.vllm_engine = engine
            self.fast_generate = engine.generate

    def save_pretrained_merged(self, save_directory: str, tokenizer: Any = None, save_method: str = "merged_16bit",
                               push_to_hub: bool = False, token: Any = None, **_ignored: Any) -> None:
        _record("model.save_pretrained_merged", save_directory, tokenizer, save_method=save_method,
                push_to_hub=push_to_hub)
        if save_method == "merged_4bit":  # save.py:6389-6395
            raise RuntimeError("Unsloth: Merging into 4bit will cause your model to lose accuracy ... "
                               "If you are certain, change `save_method` to `merged_4bit_forced`.")
        _write_merged(Path(save_directory), tokenizer)

    def save_pretrained_gguf(self, save_directory: str, tokenizer: Any = None,
                             quantization_method: Any = "fast_quantized", **_ignored: Any) -> None:
        _record("model.save_pretrained_gguf", save_directory, tokenizer, quantization_method=quantization_method)
        if tokenizer is None:
            raise ValueError("Unsloth: Saving to GGUF must have a tokenizer.")
        _write_merged(Path(save_directory), tokenizer)
        gguf_dir = Path(f"{os.path.normpath(save_directory)}_gguf")  # save.py:3965-3967: a SIBLING folder
        gguf_dir.mkdir(parents=True, exist_ok=True)
        (gguf_dir / f"model.{str(quantization_method).upper()}.gguf").write_bytes(b"GGUF")


def _write_merged(directory: Path, tokenizer: Any) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (directory / "model.safetensors").write_bytes(b"fake")
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))


class FakePeftModel(FakeModel):
    """get_peft_model's result: save_lora always, load_lora/fast_generate only with an engine."""

    is_peft = True

    def __init__(self, base: FakeModel, lora: dict):
        super().__init__(base.config._name_or_path, base.config.dtype, getattr(base, "vllm_engine", None))
        self.base_model = base
        self.peft_config = {"default": lora}
        if hasattr(self, "vllm_engine"):
            self.load_lora = lambda *a, **k: load_lora(self, *a, **k)  # functools.partial(load_lora, model)

    def save_lora(self, save_directory: str) -> None:
        _record("model.save_lora", save_directory)
        lora = self.peft_config["default"]
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora["r"], "lora_alpha": lora["lora_alpha"],
                  "target_modules": lora["target_modules"], "base_model_name_or_path": self.config._name_or_path}
        (directory / "adapter_config.json").write_text(json.dumps(config))
        r, hidden = lora["r"], 16
        tensors = {}
        for module in lora["target_modules"]:
            prefix = f"base_model.model.model.layers.0.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (r, hidden)
            tensors[f"{prefix}.lora_B.weight"] = (hidden, r)
        _write_tiny_safetensors(directory / "adapter_model.safetensors", tensors)


# ---------------------------------------------------------------------------------------------- unsloth


def _from_pretrained_signature(
    model_name="unsloth/Llama-3.2-1B-Instruct", max_seq_length=2048, dtype=None, load_in_4bit=True,
    load_in_8bit=False, load_in_16bit=False, full_finetuning=False, token=None, device_map="sequential",
    device_map_planner_kwargs=None, rope_scaling=None, fix_tokenizer=True, trust_remote_code=False,
    use_gradient_checkpointing="unsloth", resize_model_vocab=None, revision=None, use_exact_model_name=False,
    offload_embedding="auto", float32_mixed_precision=None, fast_inference=False, gpu_memory_utilization=0.5,
    float8_kv_cache=False, random_state=3407, max_lora_rank=64, disable_log_stats=True, qat_scheme=None,
    load_in_fp8=False, unsloth_tiled_mlp=False, text_only=False, *, on_model_resolved=None,
    unsloth_vllm_standby=False,
):
    """loader.py:1241-1271 plus llama.py:3509's unsloth_vllm_standby."""


_DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _get_peft_model_signature(
    model, r=16, target_modules=_DEFAULT_TARGET_MODULES, lora_alpha=16, lora_dropout=0.0, bias="none",
    layers_to_transform=None, layers_pattern=None, finetune_last_n_layers=None, use_gradient_checkpointing="unsloth",
    random_state=3407, max_seq_length=2048, use_rslora=False, modules_to_save=None, init_lora_weights=True,
    loftq_config={}, temporary_location="_unsloth_temporary_saved_buffers", qat_scheme=None,  # noqa: B006
    target_parameters=None, ensure_weight_tying=None, offload_layers=None, checkpoint_skip_layers=0,
):
    """llama.py:4569-4590."""


def _dtype_for(dtype: Any) -> Any:
    import torch

    if dtype is None:  # llama.py:3601-3602
        return torch.bfloat16 if STATE.bf16_supported else torch.float16
    assert dtype in (torch.float16, torch.bfloat16, torch.float32), dtype  # loader.py:1369-1376
    return dtype


class FastLanguageModel:
    @staticmethod
    def from_pretrained(*args: Any, **kwargs: Any):
        bound = inspect.signature(_from_pretrained_signature).bind(*args, **kwargs)
        _record("FastLanguageModel.from_pretrained", *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if a["unsloth_vllm_standby"] and a["fast_inference"] and os.environ.get("UNSLOTH_VLLM_STANDBY", "0") == "0":
            raise RuntimeError("Unsloth: `unsloth_vllm_standby` is True, but  environment variable "
                               "`UNSLOTH_VLLM_STANDBY` is not set to 1!")
        name = str(a["model_name"])
        adapter_config = Path(name) / "adapter_config.json"
        lora = None
        if adapter_config.is_file():  # loader.py:1693-1694: an adapter folder loads its base + the adapter
            lora = json.loads(adapter_config.read_text())
            name = lora["base_model_name_or_path"]
        engine = None
        if a["fast_inference"]:
            engine = FakeLLM(a["max_lora_rank"], a["gpu_memory_utilization"], a["unsloth_vllm_standby"])
        model = FakeModel(name, _dtype_for(a["dtype"]), engine)
        if lora is not None:
            model = FakePeftModel(model, lora)
        return model, FakeTokenizer(name)

    @staticmethod
    def get_peft_model(*args: Any, **kwargs: Any):
        bound = inspect.signature(_get_peft_model_signature).bind(*args, **kwargs)
        _record("FastLanguageModel.get_peft_model", *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        lora = {"r": a["r"], "lora_alpha": a["lora_alpha"], "target_modules": list(a["target_modules"])}
        return FakePeftModel(a["model"], lora)


def vLLMSamplingParams(**kwargs: Any) -> SamplingParams:  # noqa: N802 (Unsloth's name)
    _record("unsloth.vLLMSamplingParams", **kwargs)
    params = _sampling_params(**kwargs)
    params._set_kwargs = kwargs  # rl.py:151
    return params


# ---------------------------------------------------------------------------------------------- unsloth_zoo


def load_lora(model: Any, save_directory: str, load_tensors: bool = False, lora_request_id: Optional[int] = None):
    """The path branch of unsloth_zoo.vllm_utils.load_lora; load_tensors=True sends live weights."""
    _record("unsloth_zoo.load_lora", model, save_directory, load_tensors=load_tensors)
    request_id = STATE.lora_request_id if lora_request_id is None else lora_request_id
    if load_tensors:
        # vllm_utils.py _live_lora_config: writes the live adapter_config.json into save_directory.
        Path(save_directory, "adapter_config.json").write_text(json.dumps(model.peft_config["default"]))
        request = _LiveLoRARequest(str(request_id), request_id, save_directory)
    else:
        if not os.path.exists(save_directory):
            raise OSError(f"Unsloth: LoRA filepath = {save_directory} does not exist!")
        r = json.loads(Path(save_directory, "adapter_config.json").read_text()).get("r")
        if isinstance(r, int) and r > model.vllm_engine.max_lora_rank:  # _check_lora_rank_fits
            raise ValueError(f"Unsloth: The LoRA adapter in {save_directory} has r = {r} ...")
        request = LoRARequest(str(request_id), request_id, save_directory)
    STATE.lora_request_id += 1
    return request


@dataclass
class _LiveLoRARequest(LoRARequest):
    """LoRARequest(..., lora_tensors=..., lora_config=...) in the real code."""

    live: bool = True


# ---------------------------------------------------------------------------------------------- import machinery


def _exec_unsloth(module) -> None:
    # The moment the real `import unsloth` checks the environment (_gpu_init.py:20-21).
    already = [m for m in CRITICAL_MODULES if m in sys.modules]
    STATE.import_state = {"UNSLOTH_VLLM_STANDBY": os.environ.get("UNSLOTH_VLLM_STANDBY"), "already_imported": already}
    _record("import unsloth", already_imported=already)
    if already:  # _gpu_init.py:135-143
        warnings.warn(f"WARNING: Unsloth should be imported before [{', '.join(already)}] to ensure all "
                      "optimizations are applied.", stacklevel=2)
    module.FastLanguageModel = FastLanguageModel
    module.vLLMSamplingParams = vLLMSamplingParams
    module.__version__ = "2026.10.9+fake"


def _exec(module) -> None:
    name = module.__name__
    if name == "unsloth":
        _exec_unsloth(module)
    elif name == "unsloth_zoo.vllm_utils":
        module.load_lora = load_lora
    elif name == "vllm":
        module.SamplingParams = _sampling_params
        module.__version__ = "0.33.0+fake"
    elif name == "vllm.lora.request":
        module.LoRARequest = LoRARequest


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in FAKE_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in PACKAGES)

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module) -> None:
        if module.__spec__.submodule_search_locations is not None:
            module.__path__ = []
        _exec(module)


class Handle:
    def __init__(self, finder: _Finder):
        self.finder = finder

    def uninstall(self) -> None:
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        for name in FAKE_MODULES:
            sys.modules.pop(name, None)


def install(bf16_supported: bool = True) -> Handle:
    """Reset the log and put the fake modules first on sys.meta_path (nothing is imported yet)."""
    for name in FAKE_MODULES:
        sys.modules.pop(name, None)
    STATE.calls.clear()
    STATE.import_state = None
    STATE.bf16_supported = bf16_supported
    STATE.lora_request_id = 1
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    return Handle(finder)


# ---------------------------------------------------------------------------------------------- additions: Unsloth
# without vLLM (fast_inference=False) and Unsloth's sampling-params merge. Kept in one block for merging.

def _for_inference_signature(model):
    """llama.py FastLlamaModel.for_inference (loader.py FastLanguageModel.for_inference wraps it)."""


def _for_training_signature(model, use_gradient_checkpointing=None):
    """llama.py FastLlamaModel.for_training."""


def _for_inference(*args: Any, **kwargs: Any):
    a = inspect.signature(_for_inference_signature).bind(*args, **kwargs).arguments
    _record("FastLanguageModel.for_inference", *args, **kwargs)
    if not hasattr(a["model"], "config"):  # llama.py: a tokenizer passed by mistake
        raise TypeError("Unsloth: I think you're passing a tokenizer, not the model to for_inference!")
    a["model"]._flag_for_generation = True
    a["model"].training = False
    return a["model"]


def _for_training(*args: Any, **kwargs: Any):
    a = inspect.signature(_for_training_signature).bind(*args, **kwargs).arguments
    _record("FastLanguageModel.for_training", *args, **kwargs)
    a["model"]._flag_for_generation = False
    a["model"].training = True
    return a["model"]


FastLanguageModel.for_inference = staticmethod(_for_inference)
FastLanguageModel.for_training = staticmethod(_for_training)

ADAPTER_TOKEN_SHIFT = 7  # the fake "generates" different tokens with an adapter applied, so a base fallback shows


def fake_generated_token(prompt_tokens: int, with_adapter: bool) -> int:
    """The token id FakeModel.generate appends for a prompt of `prompt_tokens` real tokens."""
    return 100 + prompt_tokens % 50 + (ADAPTER_TOKEN_SHIFT if with_adapter else 0)


def _fake_generate(self, input_ids=None, attention_mask=None, max_new_tokens=None, **kwargs: Any):
    """transformers' generate on the (Unsloth-patched) model: prompt ids + min(max_new_tokens, 2) new ids."""
    import torch

    _record("model.generate", input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
            for_inference=getattr(self, "_flag_for_generation", False), **kwargs)
    if input_ids is None or max_new_tokens is None:
        raise ValueError("fake generate: pass input_ids and max_new_tokens")
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    new = [[fake_generated_token(int(row.sum()), self.is_peft)] * min(int(max_new_tokens), 2) for row in mask]
    return torch.cat([input_ids, torch.tensor(new, dtype=input_ids.dtype)], dim=1)


def _fake_eval(self):
    self.training = False
    return self


def _fake_train(self, mode: bool = True):
    self.training = mode
    return self


FakeModel.generate = _fake_generate
FakeModel.eval = _fake_eval
FakeModel.train = _fake_train
FakeModel.training = True
FakeModel.device = "cpu"


def grpo_update_SamplingParams(SamplingParams, generation_kwargs, vllm_sampling_params=None):  # noqa: N802,N803
    """Copied from unsloth/models/rl_replacements.py grpo_update_SamplingParams (unsloth 2026.10.9): how the
    patched trainer merges GRPOConfig.vllm_sampling_params into the rollouts' SamplingParams kwargs."""
    good_sampling_params_keys = inspect.signature(SamplingParams).parameters.keys()
    generation_kwargs = {k: v for k, v in generation_kwargs.items() if k in good_sampling_params_keys}
    if vllm_sampling_params is not None:
        overwrites = getattr(vllm_sampling_params, "_set_kwargs", None)
        if overwrites is None:
            default_sampling_params = SamplingParams()
            overwrites = {}
            for key in good_sampling_params_keys:
                if key.startswith("_") or not hasattr(vllm_sampling_params, key):
                    continue
                value = getattr(vllm_sampling_params, key)
                if value != getattr(default_sampling_params, key, None):
                    overwrites[key] = value
        for key, value in overwrites.items():
            if key in good_sampling_params_keys and key not in ("seed", "n", "temperature", "max_tokens", "logprobs"):
                generation_kwargs[key] = value
    return generation_kwargs
