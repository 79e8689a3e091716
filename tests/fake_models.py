"""The model and tokenizer objects the fake FastLanguageModel returns: HF generate, Unsloth's saving methods,
the PEFT model with (or without) a vLLM engine.

Split from tests/fake_unsloth.py (which re-exports these names).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tests.fake_signatures import (SIG_SAVE_GGUF, SIG_SAVE_LORA_ENGINE, SIG_SAVE_LORA_NO_ENGINE, SIG_SAVE_MERGED,
                                   _bind, _record)
from tests.fake_vllm import FakeLLM, load_lora

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
    from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path

    config_file = Path(resolve_model_path(name)) / "config.json"
    if not config_file.is_file():
        return {}
    c = json.loads(config_file.read_text())
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    kv = c.get("num_key_value_heads", c["num_attention_heads"]) * (hidden // c["num_attention_heads"])
    return {"q_proj": (hidden, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, hidden),
            "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
