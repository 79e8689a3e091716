"""A recording fake of the GPU boundary: `unsloth`, `unsloth_zoo.vllm_utils` and `vllm`, bound to the real API.

It lets tests check OUR side of the boundary (the calls pipeline/backends/unsloth.py makes, and what it does
with the results) on a machine with no GPU. It is not Unsloth: nothing here says the real calls work.

No looser than the real packages:
- Every call binds its arguments to the signature read from the pinned wheels' source
  (env/upstream_signatures.json, written by env/upstream_signatures.py), so an unknown, misspelt or missing
  argument raises TypeError here as it would there. Where the real function takes `**kwargs` and hands
  them on (FastLanguageModel.from_pretrained -> FastLlamaModel.from_pretrained -> transformers), the fake
  accepts only the named parameters along that path: a typo would otherwise be swallowed silently.
- `SamplingParams` accepts only the pinned vLLM's public field names and raises vLLM's own validation error
  (VLLMValidationError, which is NOT a ValueError) for out-of-range values.
- `UnslothGRPOConfig` / `UnslothSFTConfig` accept only the fields of the classes Unsloth generates (TRL's
  config + TrainingArguments + Unsloth's additions), with Unsloth's replaced defaults;
  `check_trainer_precision` is the bf16/fp16-vs-model-dtype check of Unsloth's generated trainers. Real
  Unsloth drops an unknown config keyword with a printed notice (rl_config_compat.filter_config_init_kwargs);
  the fake refuses it, since a dropped setting is a silent loss.
- Whatever raises for real raises here: get_peft_model with modules_to_save (or bias) on a model with a
  vLLM engine, a str sleep level (vLLM's LLMEngine.sleep compares `level >= 1`), save_pretrained_merged
  with "merged_4bit", save_pretrained_gguf without a tokenizer, fast_inference=True with
  trust_remote_code or without vLLM installed, the standby flag without UNSLOTH_VLLM_STANDBY=1,
  generate() on a sleeping engine, an unknown wake_up tag.
- fast_inference=False is what Unsloth does then: no `vllm_engine`, no `load_lora`; `fast_generate` is
  the HF-generate wrapper (make_fast_generate_wrapper), which raises ValueError for `sampling_params`
  or vLLM-style string prompts; `save_lora` is unsloth's save_lora_adapter (save_pretrained over the adapter).
  `for_inference`/`for_training` switch the model's mode; the model's `generate` (transformers') appends
  tokens that differ with a LoRA applied (fake_generated_token), so a silent fall back to the base model shows.
- `grpo_update_SamplingParams` is a copy of Unsloth's: how its trainer applies GRPOConfig.vllm_sampling_params.

Use:
    handle = install()          # a meta-path finder; `import unsloth` now builds the fake
    ...                         # code under test
    record_calls()              # the ordered call log (for ordering checks across modules)
    import_state()              # os.environ / sys.modules at the moment `import unsloth` ran
    handle.uninstall()
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import json
import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT_PATH = ROOT / "env" / "upstream_signatures.json"
SNAPSHOT: dict = json.loads(SNAPSHOT_PATH.read_text())

FAKE_MODULES = ("unsloth", "unsloth_zoo", "unsloth_zoo.vllm_utils", "vllm", "vllm.lora", "vllm.lora.request",
                "vllm.exceptions")
PACKAGES = {"unsloth", "unsloth_zoo", "vllm", "vllm.lora"}
CRITICAL_MODULES = ("trl", "transformers", "peft")  # unsloth/_gpu_init.py: warns when these came first


@dataclass
class Call:
    name: str
    args: tuple
    kwargs: dict


@dataclass
class FakeState:
    calls: list[Call] = field(default_factory=list)
    import_state: Optional[dict] = None
    bf16_supported: bool = True  # False simulates a T4/V100 (dtype=None -> float16)
    vllm_installed: bool = True  # False: fast_inference=True raises as loader.py's _vllm_unavailable_error
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


# ---------------------------------------------------------------------------------------------- signatures


class _SourceDefault:
    """A default that is not a literal in the upstream source (e.g. DEFAULT_DEVICE_MAP): shown, never used."""

    def __init__(self, source: str):
        self.source = source

    def __repr__(self) -> str:
        return self.source


def _parameter(entry: dict, kind: Optional[str] = None) -> inspect.Parameter:
    default = inspect.Parameter.empty
    if "default" in entry:
        d = entry["default"]
        default = d["value"] if "value" in d else _SourceDefault(d["source"])
    return inspect.Parameter(entry["name"], getattr(inspect.Parameter, kind or entry["kind"]), default=default)


def snapshot_signature(name: str, *, bound: bool = False, var_args: bool = True,
                       forwarded_to: Optional[str] = None) -> inspect.Signature:
    """The upstream signature of `name` in the snapshot.

    bound: drop the first parameter (self, or the model a functools.partial binds).
    var_args=False: drop *args/**kwargs, so only named parameters bind.
    forwarded_to: add that callable's named parameters (keyword-only) which `name` passes on via **kwargs.
    """
    entries = SNAPSHOT["callables"][name]["parameters"]
    if bound:
        entries = entries[1:]
    params = [_parameter(e) for e in entries if var_args or e["kind"] not in ("VAR_POSITIONAL", "VAR_KEYWORD")]
    if forwarded_to:
        have = {p.name for p in params}
        params += [_parameter(e, "KEYWORD_ONLY") for e in SNAPSHOT["callables"][forwarded_to]["parameters"]
                   if e["kind"] not in ("VAR_POSITIONAL", "VAR_KEYWORD") and e["name"] not in have]
    return inspect.Signature(params)


def _bind(signature: inspect.Signature, name: str, args: tuple, kwargs: dict) -> dict:
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as err:
        raise TypeError(f"{name}(): {err} (real signature: {name}{signature})") from None
    bound.apply_defaults()
    return dict(bound.arguments)


SIG_FROM_PRETRAINED = snapshot_signature("FastLanguageModel.from_pretrained", var_args=False,
                                         forwarded_to="FastLlamaModel.from_pretrained")
SIG_GET_PEFT_MODEL = snapshot_signature("FastLanguageModel.get_peft_model", var_args=False)
SIG_FOR_INFERENCE = snapshot_signature("FastLanguageModel.for_inference")
SIG_FOR_TRAINING = snapshot_signature("FastLanguageModel.for_training")
SIG_LLM_GENERATE = snapshot_signature("model.fast_generate[fast_inference=True]", bound=True)
SIG_LLM_SLEEP = snapshot_signature("LLM.sleep", bound=True)
SIG_LLM_WAKE_UP = snapshot_signature("LLM.wake_up", bound=True)
SIG_LOAD_LORA = snapshot_signature("model.load_lora")
SIG_SAVE_LORA_ENGINE = snapshot_signature("model.save_lora[fast_inference=True]", bound=True)
SIG_SAVE_LORA_NO_ENGINE = snapshot_signature("model.save_lora[fast_inference=False]", bound=True)
SIG_SAVE_MERGED = snapshot_signature("model.save_pretrained_merged", bound=True)
SIG_SAVE_GGUF = snapshot_signature("model.save_pretrained_gguf", bound=True)

# vLLM's SamplingParams: its public fields (msgspec rejects unknown keywords with TypeError).
SAMPLING_FIELDS = {f["name"]: f for f in SNAPSHOT["structs"]["SamplingParams"]["fields"]
                   if not f["name"].startswith("_")}
LORA_REQUEST_FIELDS = [f["name"] for f in SNAPSHOT["structs"]["LoRARequest"]["fields"]]
GRPO_CONFIG_FIELDS = frozenset(SNAPSHOT["UnslothGRPOConfig"]["fields"])
SFT_CONFIG_FIELDS = frozenset(SNAPSHOT["UnslothSFTConfig"]["fields"])


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
        self._verify_args()

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


@dataclass
class RequestOutput:
    prompt: str
    outputs: list[CompletionOutput]


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


def _hf_fast_generate(model: "FakeModel"):
    """make_fast_generate_wrapper(model.generate) (unsloth/models/_utils.py): HF generate kwargs only."""

    def fast_generate(*args: Any, **kwargs: Any):
        def has_sampling_params(a: Any) -> bool:
            return type(a).__name__ == "SamplingParams" or (
                isinstance(a, (list, tuple)) and any(type(i).__name__ == "SamplingParams" for i in a))

        def is_vllm_prompt(a: Any) -> bool:
            head = a[0] if isinstance(a, (list, tuple)) and len(a) > 0 else a
            return isinstance(head, str) or (isinstance(head, dict) and any(
                k in head for k in ("prompt", "prompt_token_ids", "prompt_embeds", "multi_modal_data")))

        if "sampling_params" in kwargs or any(has_sampling_params(a) for a in args):
            raise ValueError("Unsloth: `sampling_params` is only supported when `fast_inference=True` (vLLM). "
                             "Since `fast_inference=False`, use HuggingFace generate arguments instead")
        if "lora_request" in kwargs:
            raise ValueError("Unsloth: `lora_request` is only supported when `fast_inference=True` (vLLM). "
                             "Since `fast_inference=False`, LoRA weights are already merged into the model.")
        vllm_prompt_kwarg = any(k in kwargs for k in ("prompts", "prompt_token_ids", "prompt_embeds"))
        if (args and is_vllm_prompt(args[0])) or vllm_prompt_kwarg:
            raise ValueError("Unsloth: Passing vLLM-style prompts to `fast_generate` is only supported when "
                             "`fast_inference=True` (vLLM). Since `fast_inference=False`, tokenize first")
        return model.generate(*args, **kwargs)

    return fast_generate


ADAPTER_TOKEN_SHIFT = 7  # the fake "generates" different tokens with an adapter applied, so a base fallback shows


def fake_generated_token(prompt_tokens: int, with_adapter: bool) -> int:
    """The token id FakeModel.generate appends for a prompt of `prompt_tokens` real tokens."""
    return 100 + prompt_tokens % 50 + (ADAPTER_TOKEN_SHIFT if with_adapter else 0)


class FakeModel:
    """What from_pretrained returns. With fast_inference: `vllm_engine` and `fast_generate` = LLM.generate;
    without: no engine, and fast_generate is the HF-generate wrapper. The saving methods are bound as
    patch_saving_functions does (unsloth/save.py)."""

    is_peft = False

    def __init__(self, name: str, dtype: Any, engine: Optional[FakeLLM]):
        self.config = FakeConfig(name, dtype)
        self.training = True
        if engine is not None:
            self.vllm_engine = engine
            self.fast_generate = engine.generate
        else:
            self.fast_generate = _hf_fast_generate(self)

    device = "cpu"

    def generate(self, input_ids: Any = None, attention_mask: Any = None, max_new_tokens: Optional[int] = None,
                 **kwargs: Any):
        """transformers' generate on the (Unsloth-patched) model: the prompt ids + min(max_new_tokens, 2) new ids,
        which differ with an adapter applied (fake_generated_token), so a fallback to the base model shows."""
        import torch

        _record("model.generate", input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                for_inference=getattr(self, "_flag_for_generation", False), **kwargs)
        if input_ids is None or max_new_tokens is None:
            raise ValueError("fake generate: pass input_ids and max_new_tokens")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        new = [[fake_generated_token(int(row.sum()), self.is_peft)] * min(int(max_new_tokens), 2) for row in mask]
        return torch.cat([input_ids, torch.tensor(new, dtype=input_ids.dtype)], dim=1)

    def eval(self):
        self.training = False
        return self

    def train(self, mode: bool = True):
        self.training = mode
        return self

    def save_pretrained_merged(self, *args: Any, **kwargs: Any) -> None:
        a = _bind(SIG_SAVE_MERGED, "save_pretrained_merged", args, kwargs)
        _record("model.save_pretrained_merged", a["save_directory"], a["tokenizer"], **{
            k: v for k, v in kwargs.items() if k not in ("save_directory", "tokenizer")})
        save_method = a["save_method"]
        if save_method == "merged_4bit":  # unsloth_generic_save
            raise RuntimeError("Unsloth: Merging into 4bit will cause your model to lose accuracy ... "
                               "If you are certain, change `save_method` to `merged_4bit_forced`.")
        if save_method not in ("lora", "merged_16bit", "merged_4bit_forced"):
            raise RuntimeError(f"Unsloth: save_method = {save_method!r} is not supported here.")
        _write_merged(Path(a["save_directory"]), a["tokenizer"])

    def save_pretrained_gguf(self, *args: Any, **kwargs: Any) -> None:
        a = _bind(SIG_SAVE_GGUF, "save_pretrained_gguf", args, kwargs)
        _record("model.save_pretrained_gguf", a["save_directory"], a["tokenizer"], **{
            k: v for k, v in kwargs.items() if k not in ("save_directory", "tokenizer")})
        if a["tokenizer"] is None:
            raise ValueError("Unsloth: Saving to GGUF must have a tokenizer.")
        _write_merged(Path(a["save_directory"]), a["tokenizer"])
        # save_to_gguf writes the .gguf files to a SIBLING folder f"{save_directory}_gguf"
        gguf_dir = Path(f"{os.path.normpath(a['save_directory'])}_gguf")
        gguf_dir.mkdir(parents=True, exist_ok=True)
        (gguf_dir / f"model.{str(a['quantization_method']).upper()}.gguf").write_bytes(b"GGUF")


def _write_merged(directory: Path, tokenizer: Any) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (directory / "model.safetensors").write_bytes(b"fake")
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))


class FakePeftModel(FakeModel):
    """get_peft_model's result after patch_peft_fast_inference (unsloth/models/_utils.py): with an engine,
    vllm_engine/fast_generate/load_lora and unsloth_zoo's save_lora; without, only save_lora
    (save_lora_adapter) and the base model's HF fast_generate reached through PEFT's __getattr__."""

    is_peft = True

    def __init__(self, base: FakeModel, lora: dict):
        super().__init__(base.config._name_or_path, base.config.dtype, getattr(base, "vllm_engine", None))
        self.base_model = base
        self.peft_config = {"default": lora}
        if hasattr(self, "vllm_engine"):
            self.load_lora = functools.partial(load_lora, self)
            self._save_lora_signature = SIG_SAVE_LORA_ENGINE
        else:
            # The base model's HF fast_generate (through PEFT's __getattr__), over weights the LoRA now wraps.
            self.fast_generate = _hf_fast_generate(self)
            self._save_lora_signature = SIG_SAVE_LORA_NO_ENGINE

    def save_lora(self, *args: Any, **kwargs: Any) -> None:
        a = _bind(self._save_lora_signature, "model.save_lora", args, kwargs)
        _record("model.save_lora", a["save_directory"])
        self._write_adapter(Path(a["save_directory"]))

    def save_pretrained(self, *args: Any, **kwargs: Any) -> None:
        """PEFT's PeftModel.save_pretrained (the warm-up saves with it), bound to the installed peft's signature."""
        from peft import PeftModel

        bound = inspect.signature(PeftModel.save_pretrained).bind(self, *args, **kwargs)
        _record("model.save_pretrained", bound.arguments["save_directory"])
        self._write_adapter(Path(bound.arguments["save_directory"]))

    def _write_adapter(self, directory: Path) -> None:
        """adapter_config.json + LoRA weights shaped for the real base model (so shape checks see real shapes)."""
        lora = self.peft_config["default"]
        directory.mkdir(parents=True, exist_ok=True)
        config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora["r"], "lora_alpha": lora["lora_alpha"],
                  "target_modules": lora["target_modules"], "base_model_name_or_path": self.config._name_or_path}
        if lora.get("modules_to_save"):
            config["modules_to_save"] = lora["modules_to_save"]
        (directory / "adapter_config.json").write_text(json.dumps(config))
        r, shapes = lora["r"], _base_linear_shapes(self.config._name_or_path)
        tensors = {}
        for module in lora["target_modules"]:
            block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            out_features, in_features = shapes.get(module, (16, 16))
            prefix = f"base_model.model.model.layers.0.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (r, in_features)
            tensors[f"{prefix}.lora_B.weight"] = (out_features, r)
        _write_tiny_safetensors(directory / "adapter_model.safetensors", tensors)


def _base_linear_shapes(name: str) -> dict[str, tuple[int, int]]:
    """(out, in) of each Qwen2 linear layer of the named base model, from its config.json when it is a local
    folder (what the real from_pretrained loads); {} for a hub id the tests never download."""
    from pipeline.data.tokenizer import resolve_model_path

    config_file = Path(resolve_model_path(name)) / "config.json"
    if not config_file.is_file():
        return {}
    c = json.loads(config_file.read_text())
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    kv = c.get("num_key_value_heads", c["num_attention_heads"]) * (hidden // c["num_attention_heads"])
    return {"q_proj": (hidden, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, hidden),
            "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}


# ---------------------------------------------------------------------------------------------- unsloth


def _dtype_for(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, str) and dtype in ("float16", "bfloat16"):  # loader.py converts these two strings
        dtype = getattr(torch, dtype)
    if dtype is None:  # FastLlamaModel.from_pretrained: bf16 where supported, else fp16
        return torch.bfloat16 if STATE.bf16_supported else torch.float16
    assert dtype in (torch.float16, torch.bfloat16, torch.float32), dtype  # FastLanguageModel.from_pretrained
    return dtype


_EMBEDDING_LEAVES = ("lm_head", "embed_tokens")


class FastLanguageModel:
    @staticmethod
    def from_pretrained(*args: Any, **kwargs: Any):
        a = _bind(SIG_FROM_PRETRAINED, "FastLanguageModel.from_pretrained", args, kwargs)
        _record("FastLanguageModel.from_pretrained", *args, **kwargs)
        if a["trust_remote_code"] and a["fast_inference"]:  # FastLlamaModel.from_pretrained
            raise NotImplementedError("Unsloth: Fast inference does not support `trust_remote_code` yet.")
        if a["fast_inference"] and not STATE.vllm_installed:  # loader.py _vllm_unavailable_error
            raise ImportError("Unsloth: Please install vLLM before enabling `fast_inference`!\n"
                              "You can do this in a terminal via `pip install vllm`")
        if a["unsloth_vllm_standby"] and a["fast_inference"] and os.environ.get("UNSLOTH_VLLM_STANDBY", "0") == "0":
            raise RuntimeError("Unsloth: `unsloth_vllm_standby` is True, but  environment variable "
                               "`UNSLOTH_VLLM_STANDBY` is not set to 1!")
        name = str(a["model_name"])
        adapter_config = Path(name) / "adapter_config.json"
        lora = None
        if adapter_config.is_file():  # an adapter folder loads its base + the adapter
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
        a = _bind(SIG_GET_PEFT_MODEL, "FastLanguageModel.get_peft_model", args, kwargs)
        _record("FastLanguageModel.get_peft_model", *args, **kwargs)
        model, modules_to_save = a["model"], a["modules_to_save"]
        target_modules = a["target_modules"]
        if isinstance(target_modules, str):
            target_modules = [target_modules]
        target_modules = list(target_modules)
        # FastLlamaModel.get_peft_model moves lm_head/embed_tokens from target_modules to modules_to_save
        # (_redirect_embedding_targets), except lm_head on a model with a vLLM engine, which stays an untrained
        # LoRA target (_vllm_unmovable_embedding_modules).
        skip = ("lm_head",) if hasattr(model, "vllm_engine") else ()
        moved = [m for m in target_modules if m.rsplit(".", 1)[-1] in _EMBEDDING_LEAVES
                 and m.rsplit(".", 1)[-1] not in skip]
        if moved:
            target_modules = [m for m in target_modules if m not in moved]
            modules_to_save = list(modules_to_save or []) + moved
        for module in modules_to_save or []:
            leaf = module.rsplit(".", 1)[-1]
            if leaf not in _EMBEDDING_LEAVES and "norm" not in leaf:
                raise TypeError(f"Unsloth: Module = {module} is not allowed. Only 'lm_head', 'embed_tokens' and "
                                "normalization layers (e.g. 'input_layernorm', 'norm') are allowed.")
        if hasattr(model, "vllm_engine"):
            if modules_to_save is not None:  # even an empty list
                raise NotImplementedError(
                    "Unsloth: Currently fast inference does not work with training embeddings or lm_head.")
            if a["bias"] != "none":
                raise NotImplementedError(
                    "Unsloth: Currently fast inference does not work with using biases for LoRA.")
        lora = {"r": a["r"], "lora_alpha": a["lora_alpha"], "target_modules": target_modules,
                "modules_to_save": list(modules_to_save) if modules_to_save else None}
        return FakePeftModel(model, lora)

    @staticmethod
    def for_inference(*args: Any, **kwargs: Any):
        return _switch_mode(SIG_FOR_INFERENCE, "FastLanguageModel.for_inference", args, kwargs, training=False)

    @staticmethod
    def for_training(*args: Any, **kwargs: Any):
        return _switch_mode(SIG_FOR_TRAINING, "FastLanguageModel.for_training", args, kwargs, training=True)


def _switch_mode(signature: inspect.Signature, name: str, args: tuple, kwargs: dict, *, training: bool):
    a = _bind(signature, name, args, kwargs)
    _record(name, a["model"])
    if not hasattr(a["model"], "config"):  # FastLlamaModel.for_inference: a tokenizer passed by mistake
        raise TypeError("Unsloth: I think you're passing a tokenizer, not the model to for_inference!")
    a["model"]._flag_for_generation = not training  # what Unsloth's fast decoding keys on
    a["model"].training = training
    return a["model"]


def vLLMSamplingParams(**kwargs: Any) -> SamplingParams:  # noqa: N802 (Unsloth's name)
    """unsloth/models/rl.py vLLMSamplingParams: vllm.SamplingParams(**kwargs) plus `_set_kwargs`."""
    _record("unsloth.vLLMSamplingParams", **kwargs)
    params = _sampling_params(**kwargs)
    params._set_kwargs = kwargs
    return params


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


class _UnslothRLConfig:
    """The config classes Unsloth generates from TRL's (unsloth/models/rl.py _patch_trl_rl_trainers_impl): only
    their fields, with Unsloth's replaced defaults (e.g. GRPO's vllm_importance_sampling_correction=False).

    to_dict()/to_json_string() serialise every field as transformers' TrainingArguments does
    (json.dumps over to_dict), which is what TensorBoardCallback.on_train_begin calls."""

    SNAPSHOT_KEY = ""

    def __init__(self, **kwargs: Any):
        entry = SNAPSHOT[self.SNAPSHOT_KEY]
        unknown = sorted(set(kwargs) - set(entry["fields"]))
        if unknown:
            raise TypeError(f"{self.SNAPSHOT_KEY}: {unknown} are not fields of the config Unsloth builds from the "
                            "pinned TRL (the real one drops them with a printed notice)")
        _record(self.SNAPSHOT_KEY, **kwargs)
        self.kwargs = dict(kwargs)
        defaults = {key: d.get("value") for key, d in entry["unsloth_default_overrides"].items()}
        self.__dict__.update({**defaults, **kwargs})

    def to_dict(self) -> dict:
        fields = set(SNAPSHOT[self.SNAPSHOT_KEY]["fields"])
        return {k: v for k, v in self.__dict__.items() if k in fields}

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


class UnslothGRPOConfig(_UnslothRLConfig):
    SNAPSHOT_KEY = "UnslothGRPOConfig"


class UnslothSFTConfig(_UnslothRLConfig):
    SNAPSHOT_KEY = "UnslothSFTConfig"


def check_trainer_precision(model: Any, args: Any) -> None:
    """The mixed-precision check Unsloth's generated trainers run in __init__ (rl.py, `mixed_precision`):
    the model's dtype decides, and asking for the other half precision raises TypeError."""
    dtype = str(getattr(model.config, "dtype", "")).rsplit(".", 1)[-1]
    use_bf16 = getattr(args, "bf16", False) is True
    use_fp16 = getattr(args, "fp16", False) is True
    if dtype == "float16" and use_bf16:
        raise TypeError("Unsloth: Model is in float16 precision but you want to use bfloat16 precision. "
                        "Set fp16 to `True` and bf16 to `False`")
    if dtype == "bfloat16" and use_fp16:
        raise TypeError("Unsloth: Model is in bfloat16 precision but you want to use float16 precision. "
                        "Set fp16 to `False` and bf16 to `True`")


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
        # _live_lora_config: writes the live adapter_config.json into save_directory.
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


# ---------------------------------------------------------------------------------------------- import machinery


def _exec_unsloth(module) -> None:
    # The moment the real `import unsloth` checks the environment (unsloth/_gpu_init.py).
    already = [m for m in CRITICAL_MODULES if m in sys.modules]
    STATE.import_state = {"UNSLOTH_VLLM_STANDBY": os.environ.get("UNSLOTH_VLLM_STANDBY"), "already_imported": already}
    _record("import unsloth", already_imported=already)
    if already:
        warnings.warn(f"WARNING: Unsloth should be imported before [{', '.join(already)}] to ensure all "
                      "optimizations are applied.", stacklevel=2)
    module.FastLanguageModel = FastLanguageModel
    module.vLLMSamplingParams = vLLMSamplingParams
    module.__version__ = SNAPSHOT["versions"]["unsloth"] + "+fake"


def _exec(module) -> None:
    name = module.__name__
    if name == "unsloth":
        _exec_unsloth(module)
    elif name == "unsloth_zoo.vllm_utils":
        module.load_lora = load_lora
    elif name == "vllm":
        if not STATE.vllm_installed:
            raise ModuleNotFoundError("No module named 'vllm'")
        module.SamplingParams = _sampling_params
        module.__version__ = SNAPSHOT["versions"]["vllm"] + "+fake"
    elif name == "vllm.lora.request":
        module.LoRARequest = LoRARequest
    elif name == "vllm.exceptions":
        module.VLLMValidationError = VLLMValidationError


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


def install(bf16_supported: bool = True, vllm_installed: bool = True) -> Handle:
    """Reset the log and put the fake modules first on sys.meta_path (nothing is imported yet)."""
    for name in FAKE_MODULES:
        sys.modules.pop(name, None)
    STATE.calls.clear()
    STATE.import_state = None
    STATE.bf16_supported = bf16_supported
    STATE.vllm_installed = vllm_installed
    STATE.lora_request_id = 1
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    return Handle(finder)
