"""Do the LoRA settings name modules this model has? Read from the architecture on the meta device, before the
model loads, so a typo is exit 2 listing the names it has.
"""

from __future__ import annotations

from typing import Any, Sequence

from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path

# The module classes peft's LoRA can adapt (peft.tuners.lora.model LoraModel._create_new_module dispatchers).
LORA_MODULE_TYPES = ("Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "Conv1D")


def model_module_types(name: str, trust_remote_code: bool = False) -> dict[str, str]:
    """Every module path of the model -> its class name, built on the meta device (no weights read)."""
    # lazy: accelerate and transformers import torch (after the backend's prepare_environment)
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    try:
        config = model_config(name, trust_remote_code)
        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:  # no config.json, an architecture transformers lacks
        raise ConfigError("model_name_or_path", f"cannot read the architecture of {name} ({type(err).__name__}: "
                          f"{err}). Point at a causal-LM model folder or hub id, e.g. unsloth/Qwen2.5-1.5B-Instruct."
                          ) from None
    return {path: type(module).__name__ for path, module in model.named_modules() if path}


def model_config(name: str, trust_remote_code: bool = False) -> Any:
    """The model's transformers config: local or cached first, else downloaded (config.json only)."""
    # lazy: transformers imports torch (after the backend's prepare_environment)
    from transformers import AutoConfig

    path = resolve_model_path(name)
    try:  # a local folder or the HF cache first: no network round-trip for a model already here
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    except OSError:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)


def check_lora_targets(model_name_or_path: str, trust_remote_code: bool, lora_target_modules: Sequence[Any],
                       lora_modules_to_save: Sequence[Any]) -> str:
    """Refuse, listing the names the model has, a `lora_target_modules` entry naming no LoRA-capable module or a
    `lora_modules_to_save` entry naming no module."""
    types = model_module_types(model_name_or_path, trust_remote_code)
    adaptable = sorted({path.rsplit(".", 1)[-1] for path, kind in types.items() if kind in LORA_MODULE_TYPES})
    for target in lora_target_modules:
        # peft's suffix rule (peft.tuners.tuners_utils.check_target_module_exists): the name or a `.name` tail
        kinds = sorted({kind for path, kind in types.items() if path == str(target) or path.endswith(f".{target}")})
        if not kinds:
            raise ConfigError("lora_target_modules", f"{model_name_or_path} has no module named "
                              f"{excerpt(target)}. Its layers LoRA can adapt: {', '.join(adaptable)}.")
        if not set(kinds) & set(LORA_MODULE_TYPES):
            raise ConfigError("lora_target_modules", f"{excerpt(target)} names {', '.join(kinds)} modules, which LoRA "
                              f"cannot adapt; name their layers instead: {', '.join(adaptable)}.")
    names = sorted({path.rsplit(".", 1)[-1] for path in types})
    for target in lora_modules_to_save:
        # peft's rule here (peft.utils.other._set_trainable) is a plain suffix: `layernorm` takes input_layernorm
        if not any(path.endswith(str(target)) for path in types):
            raise ConfigError("lora_modules_to_save", f"{model_name_or_path} has no module named "
                              f"{excerpt(target)}. Its module names: {', '.join(names)}.")
    saved = f"; trained in full: {', '.join(map(str, lora_modules_to_save))}" if lora_modules_to_save else ""
    return f"LoRA on {', '.join(map(str, lora_target_modules))}{saved} (all found in the model)"
