"""The fakes' shared ground: the pinned wheels' signatures (tests/upstream_signatures.json), binding calls to
them, and the ordered call log every fake boundary call is recorded in.

Split from tests/fake_unsloth.py (which re-exports these names): see its docstring for the rules.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT_PATH = ROOT / "tests" / "upstream_signatures.json"
SNAPSHOT: dict = json.loads(SNAPSHOT_PATH.read_text())


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
    # False: Unsloth turns fast_inference off by itself and returns a model without `vllm_engine`, as
    # FastLanguageModel.from_pretrained does below compute capability 7 and on DGX Spark (unsloth/models/loader.py)
    # and fast_inference_setup does when vLLM does not import (unsloth/models/_utils.py).
    vllm_usable: bool = True
    compile_location: Optional[str] = None  # where `import unsloth` wrote its compile cache (absolute)
    lora_request_id: int = 1  # unsloth_zoo's global LORA_REQUEST_ID
    modelscope_at_import: Optional[str] = None  # UNSLOTH_USE_MODELSCOPE when `import unsloth` ran (read only then)


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

