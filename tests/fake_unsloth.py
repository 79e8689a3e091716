"""A recording fake of the GPU boundary: `unsloth`, `unsloth_zoo.vllm_utils` and `vllm`, bound to the real API.

It lets tests check OUR side of the boundary (the calls pipeline/backends/unsloth.py makes, and what it does
with the results) on a machine with no GPU. It is not Unsloth: nothing here says the real calls work.

No looser than the real packages:
- Every call binds its arguments to the signature read from the pinned wheels' source
  (tests/upstream_signatures.json, written by tests/upstream_signatures.py), so an unknown, misspelt or missing
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
  `install(vllm_usable=False)`: fast_inference=True returns such a model too, as Unsloth does when it turns vLLM
  off by itself (compute capability < 7, DGX Spark, vLLM not importable). `import unsloth` creates the compile
  cache at UNSLOTH_COMPILE_LOCATION (default: ./unsloth_compiled_cache, as unsloth_zoo/compiler.py).
  `for_inference`/`for_training` switch the model's mode; the model's `generate` (transformers') appends
  tokens that differ with a LoRA applied (fake_generated_token), so a silent fall back to the base model shows.
- ModelScope (`_modelscope_snapshot`): with UNSLOTH_USE_MODELSCOPE=1 at `import unsloth`, from_pretrained fetches a
  name that is not a local path with modelscope.snapshot_download (its error propagates; for an adapter's base a
  warning and the Hugging Face Hub instead) and names the model by the repo id, as the wheel's loader.py does.
- `grpo_update_SamplingParams` is a copy of Unsloth's: how its trainer applies GRPOConfig.vllm_sampling_params.

Use:
    handle = install()          # a meta-path finder; `import unsloth` now builds the fake
    ...                         # code under test
    record_calls()              # the ordered call log (for ordering checks across modules)
    import_state()              # os.environ / sys.modules at the moment `import unsloth` ran
    handle.uninstall()
"""

import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

# The fake is split by boundary side; every name stays reachable as `fake_unsloth.<name>`.
from tests.fake_models import *  # noqa: F401,F403
from tests.fake_models import FakeLLM, FakeModel, FakePeftModel, FakeTokenizer
from tests.fake_signatures import *  # noqa: F401,F403
from tests.fake_signatures import (SIG_FOR_INFERENCE, SIG_FOR_TRAINING, SIG_FROM_PRETRAINED, SIG_GET_PEFT_MODEL,
                                   SNAPSHOT, STATE, _bind, _record)
from tests.fake_vllm import *  # noqa: F401,F403
from tests.fake_vllm import LoRARequest, SamplingParams, VLLMValidationError, _sampling_params, load_lora

FAKE_MODULES = ("unsloth", "unsloth_zoo", "unsloth_zoo.vllm_utils", "vllm", "vllm.lora", "vllm.lora.request",
                "vllm.exceptions")
PACKAGES = {"unsloth", "unsloth_zoo", "vllm", "vllm.lora"}
CRITICAL_MODULES = ("trl", "transformers", "peft")  # unsloth/_gpu_init.py: warns when these came first


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
        if a["fast_inference"] and not STATE.vllm_usable:  # Unsloth's own fallback: no engine, a log line
            print("Unsloth: vLLM cannot run here; fast_inference is switched off (fake)")
            a["fast_inference"] = False
        if a["fast_inference"] and not STATE.vllm_installed:  # loader.py _vllm_unavailable_error
            raise ImportError("Unsloth: Please install vLLM before enabling `fast_inference`!\n"
                              "You can do this in a terminal via `pip install vllm`")
        if a["unsloth_vllm_standby"] and a["fast_inference"] and os.environ.get("UNSLOTH_VLLM_STANDBY", "0") == "0":
            raise RuntimeError("Unsloth: `unsloth_vllm_standby` is True, but  environment variable "
                               "`UNSLOTH_VLLM_STANDBY` is not set to 1!")
        name = str(a["model_name"])
        _modelscope_snapshot(name, adapter_base=False)
        adapter_config = Path(name) / "adapter_config.json"
        lora = None
        if adapter_config.is_file():  # an adapter folder loads its base + the adapter
            lora = json.loads(adapter_config.read_text())
            name = lora["base_model_name_or_path"]
            _modelscope_snapshot(name, adapter_base=True)
            _refuse_unloadable_base(name)
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


def _modelscope_snapshot(name: str, *, adapter_base: bool) -> None:
    """FastLanguageModel.from_pretrained's ModelScope branch (unsloth/models/loader.py), under USE_MODELSCOPE as
    `import unsloth` read it (unsloth/models/_utils.py, module level; loader.py imports the value, so setting the
    variable later changes nothing). Only for a name that is not a local path (`not os.path.exists(model_name)`):
    modelscope.snapshot_download(name), whose error propagates; for an adapter's base
    (_modelscope_snapshot_or_none) a failed download warns and the base loads from the Hugging Face Hub instead.
    Either way the model keeps the repo id as its name (_record_modelscope_repo_id rewrites name_or_path and
    config._name_or_path from the snapshot folder back to it), which is what the fake model is named by."""
    if STATE.modelscope_at_import != "1" or os.path.exists(name):
        return
    from modelscope import snapshot_download  # the network boundary: tests replace it with a local hub

    if not adapter_base:
        snapshot_download(name)
        return
    try:
        snapshot_download(name)
    except Exception as err:
        warnings.warn(f"Unsloth: Could not download `{name}` from ModelScope ({err}), loading it from Hugging Face.",
                      stacklevel=3)


def _refuse_unloadable_base(name: str) -> None:
    """The adapter's base is loaded by the name adapter_config.json gives (loader.py: `model_name =
    peft_config.base_model_name_or_path`, then AutoConfig.from_pretrained): a name that is neither a local folder
    nor a hub id (`org/name`; the tests never use an org-less one) raises there as transformers raises."""
    if not os.path.isdir(name) and name.count("/") != 1:
        raise OSError(f"{name} is not a local folder and is not a valid model identifier listed on "
                      "'https://huggingface.co/models'")


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
    TRL_CONFIG = ""  # the pinned TRL's config class the generated one subclasses ("module:name")

    def __init__(self, **kwargs: Any):
        entry = SNAPSHOT[self.SNAPSHOT_KEY]
        unknown = sorted(set(kwargs) - set(entry["fields"]))
        if unknown:
            raise TypeError(f"{self.SNAPSHOT_KEY}: {unknown} are not fields of the config Unsloth builds from the "
                            "pinned TRL (the real one drops them with a printed notice)")
        _record(self.SNAPSHOT_KEY, **kwargs)
        self.kwargs = dict(kwargs)
        defaults = {key: d.get("value") for key, d in entry["unsloth_default_overrides"].items()}
        values = {**_inherited_defaults(self.TRL_CONFIG, entry["fields"]), **defaults, **kwargs}
        if self.SNAPSHOT_KEY == "UnslothGRPOConfig":
            values = _grpo_config_init_lines(values)
        self.__dict__.update(values)

    def to_dict(self) -> dict:
        fields = set(SNAPSHOT[self.SNAPSHOT_KEY]["fields"])
        return {k: v for k, v in self.__dict__.items() if k in fields}

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# UnslothGRPOConfig's own fields and their defaults (unsloth/models/rl.py, the generated class's __init__).
_UNSLOTH_OWN_DEFAULTS = {"vllm_sampling_params": None, "unsloth_num_chunks": -1,
                         "unsloth_logit_chunk_multiplier": None, "unsloth_grpo_mini_batch": None}


def _inherited_defaults(trl_config: str, fields: list) -> dict:
    """The defaults of every field the generated class inherits from TRL's config (it calls TRL's __init__ with
    all of them), read from the pinned TRL's dataclass; Unsloth's own fields with theirs."""
    import dataclasses
    import importlib

    module, name = trl_config.split(":")
    found = {}
    for f in dataclasses.fields(getattr(importlib.import_module(module), name)):
        if f.name in fields and f.default is not dataclasses.MISSING:
            found[f.name] = f.default
        elif f.name in fields and f.default_factory is not dataclasses.MISSING:
            found[f.name] = f.default_factory()
    return {**found, **{k: v for k, v in _UNSLOTH_OWN_DEFAULTS.items() if k in fields}}


def _grpo_config_init_lines(values: dict) -> dict:
    """The lines unsloth 2026.10.9 writes into UnslothGRPOConfig.__init__ before TRL's __init__ runs, transcribed
    in their order (unsloth/models/rl.py _patch_trl_rl_trainers_impl: the loss_type / beta sentinels, the
    dr_grpo / dapo / cispo check, the num_generations batch check, the temperature check; then
    rl_replacements.py RL_CONFIG_CHANGES["grpo_trainer"]: grpo_config_fix_vllm_top_k. Its
    grpo_trainer_fix_batch_size adds nothing for TRL 1.15, whose trainer has no "divisible by the number of
    generations" text). WORLD_SIZE is unset (one process)."""
    v = dict(values)
    _unsloth_default_loss_type = v["loss_type"] is None
    if _unsloth_default_loss_type:
        v["loss_type"] = "dapo"
        if v["beta"] is None:
            print("Unsloth: GRPO now defaults to TRL's loss_type = 'dapo' with beta = 0.0. Set loss_type = 'bnpo', "
                  "beta = 0.001 for Unsloth's previous default.")
    if v["beta"] is None:
        v["beta"] = 0.0 if str(v["loss_type"]).lower() in ("dapo", "dr_grpo") else 0.001
    if v["loss_type"].lower() == "dr_grpo":
        if v["scale_rewards"] is None:
            v["scale_rewards"] = True
        elif v["scale_rewards"] is True or v["scale_rewards"] == "group":
            v["scale_rewards"] = False
    elif v["loss_type"].lower() == "dapo" and not _unsloth_default_loss_type:
        if v["mask_truncated_completions"] is None:
            v["mask_truncated_completions"] = True
        if v["epsilon_high"] is None:
            v["epsilon_high"] = 0.28
    elif v["loss_type"].lower() == "cispo":
        if v["epsilon_high"] is None:
            v["epsilon_high"] = 5.0
    if v["mask_truncated_completions"] is None:
        v["mask_truncated_completions"] = False
    if v["steps_per_generation"] is None and v["generation_batch_size"] is None:
        ga, world_size = v["gradient_accumulation_steps"], int(os.environ.get("WORLD_SIZE", "1"))
        if (ga * world_size * v["per_device_train_batch_size"]) % v["num_generations"] != 0:
            v["per_device_train_batch_size"] = v["num_generations"]
    if v["temperature"] <= 0:
        raise ValueError("Unsloth: Please set a positive non-zero temperature since your results will be wrong.")
    elif v["temperature"] >= 10:
        raise ValueError("Unsloth: Please set a positive non-zero temperature less than 10, since sampling will be "
                         "quite erratic.")
    if v["use_vllm"] and (v["top_k"] is None or v["top_k"] == 0):
        v["top_k"] = -1
    return v


class UnslothGRPOConfig(_UnslothRLConfig):
    SNAPSHOT_KEY = "UnslothGRPOConfig"
    TRL_CONFIG = "trl.trainer.grpo_config:GRPOConfig"


class UnslothSFTConfig(_UnslothRLConfig):
    SNAPSHOT_KEY = "UnslothSFTConfig"
    TRL_CONFIG = "trl.trainer.sft_config:SFTConfig"


# The regexes with which unsloth 2026.10.9 takes TRL's ref-adapter block out of the GRPOTrainer source it rebuilds,
# copied from the wheel: unsloth/models/rl.py _patch_trl_rl_trainers_impl (the `trl_version >= Version("1.4.0")`
# branch) and patch_functions (add_adapter_block_pattern, "use base model as reference, not SFT/LoRA model").
UNSLOTH_REF_BLOCK_PATTERNS = (
    r"\s*elif is_peft_model\(model\) and args\.beta != 0\.0:" r".*?" r"ref_param\.data\.copy_\(param\.data\)",
    r"([ \t]*)" r"if\s+is_peft_available\(\)\s+and\s+is_peft_model\(model\)\s+and\s+args\.beta\s*!=\s*0\.0\s*:"
    r"(.*?)" r"ref_param\.data\.copy_\(param\.data\)",
)


def unsloth_grpo_trainer_source() -> str:
    """The pinned TRL's GRPOTrainer source as Unsloth's patch leaves it (the ref-adapter block removed)."""
    import re

    from trl.trainer.grpo_trainer import GRPOTrainer

    source = inspect.getsource(GRPOTrainer)
    for pattern in UNSLOTH_REF_BLOCK_PATTERNS:
        source = re.sub(pattern, "\n        # Unsloth: removed\n", source, flags=re.DOTALL)
    return source


def unsloth_trainer_init_reference(model: Any, beta: float) -> None:
    """The KL-reference part of UnslothGRPOTrainer.__init__: TRL's code less what the patch removed. TRL would
    add a "ref" adapter to a PEFT model when beta != 0; the patched source keeps that line only if the wheel's
    regexes miss it (then the FakePeftModel, which has no add_adapter, raises). ref_model stays None on a PEFT model
    (TRL: `elif is_peft_model(model): self.ref_model = None`), so kl is measured with the adapters disabled."""
    if beta and getattr(model, "is_peft", False) and 'model.add_adapter("ref"' in unsloth_grpo_trainer_source():
        model.add_adapter("ref", model.peft_config["default"])


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


# ---------------------------------------------------------------------------------------------- import machinery


def _exec_unsloth(module) -> None:
    # The moment the real `import unsloth` checks the environment (unsloth/_gpu_init.py).
    already = [m for m in CRITICAL_MODULES if m in sys.modules]
    STATE.import_state = {"UNSLOTH_VLLM_STANDBY": os.environ.get("UNSLOTH_VLLM_STANDBY"), "already_imported": already}
    # unsloth/models/_utils.py, at module level: USE_MODELSCOPE is read once, and modelscope must be importable.
    STATE.modelscope_at_import = os.environ.get("UNSLOTH_USE_MODELSCOPE")
    if STATE.modelscope_at_import == "1" and importlib.util.find_spec("modelscope") is None:
        raise ImportError("You are using the modelscope hub, please install modelscope by `pip install modelscope -U`")
    _record("import unsloth", already_imported=already)
    if already:
        warnings.warn(f"WARNING: Unsloth should be imported before [{', '.join(already)}] to ensure all "
                      "optimizations are applied.", stacklevel=2)
    # unsloth_zoo/compiler.py: the compiled-module cache, UNSLOTH_COMPILE_LOCATION (read once, at import),
    # default "unsloth_compiled_cache" relative to the working directory, created by get_compile_folder.
    location = os.environ.get("UNSLOTH_COMPILE_LOCATION", "unsloth_compiled_cache")
    STATE.compile_location = os.path.abspath(location)
    os.makedirs(location, exist_ok=True)
    Path(location, "unsloth_compiled_module_qwen2.py").write_text("# fake compiled module\n")
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
    def __init__(self, finder: _Finder, displaced: dict[str, Any]):
        self.finder = finder
        self.displaced = displaced  # the real modules install() took out of sys.modules, put back by uninstall()

    def uninstall(self) -> None:
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        for name in FAKE_MODULES:
            sys.modules.pop(name, None)
        sys.modules.update(self.displaced)


def install(bf16_supported: bool = True, vllm_installed: bool = True, vllm_usable: bool = True) -> Handle:
    """Reset the log and put the fake modules first on sys.meta_path (nothing is imported yet). A real vllm
    already imported is put back whole on uninstall: a fresh `vllm` package beside its old submodules (still in
    sys.modules) would lack their attributes (vllm.logging_utils, as the real engine's logging config reads it)."""
    if "trl.trainer.grpo_trainer" in sys.modules:  # imported already, without vLLM (a test process): its vLLM
        # names bound now, as the real Unsloth leaves them (it imports vLLM before anything imports TRL)
        from grpo_pipeline.pipeline.config.trl_fields import grpo_trainer_module

        grpo_trainer_module(uses_vllm=True)
    displaced = {name: sys.modules.pop(name) for name in FAKE_MODULES if name in sys.modules}
    STATE.calls.clear()
    STATE.import_state = None
    STATE.bf16_supported = bf16_supported
    STATE.vllm_installed = vllm_installed
    STATE.vllm_usable = vllm_usable
    STATE.compile_location = None
    STATE.modelscope_at_import = None
    STATE.lora_request_id = 1
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    return Handle(finder, displaced)
