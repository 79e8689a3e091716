"""The backend boundary: everything that differs between Unsloth+vLLM and plain transformers+peft.

`load_backend(name)` makes the backend object (base.py BackendBase) from the registry BACKENDS; code outside
pipeline/backends/ asks it and never compares a backend's name. `choose_backend` decides without importing torch,
unsloth, vllm, trl, transformers or peft: Unsloth patches the last three at import, so it must come first, and
unsloth_zoo sets the CUDA allocator's PYTORCH_ALLOC_CONF at import.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

from grpo_pipeline.env import probes  # through the module, looked up at each call: tests stand in for the GPU probe there
from grpo_pipeline.pipeline.config import ConfigError, PipelineConfig
from grpo_pipeline.pipeline.config.pipeline_config import field_choices, set_field_choices
from grpo_pipeline.pipeline.config.validate import BACKEND_RULES
from grpo_pipeline.pipeline.demo.registry import builtin_model


class Completion(str):
    """A generated text with its generated token count (end-of-sequence included, as vLLM's
    `CompletionOutput.token_ids` and TRL count it; re-tokenising would not) and ids (TRL's parse_response reads them).

    >>> c = Completion("<answer>4</answer>", tokens=7)
    >>> c == "<answer>4</answer>", c.tokens
    (True, 7)
    """

    tokens: int
    ids: tuple[int, ...]

    def __new__(cls, text: str, tokens: int, ids: Sequence[int] = ()) -> "Completion":
        made = super().__new__(cls, text)
        made.tokens = int(tokens)
        made.ids = tuple(int(i) for i in ids)
        return made

    def __reduce__(self):  # deepcopy and pickle keep `tokens`
        return (Completion, (str(self), self.tokens, self.ids))


class Generator(Protocol):
    """What `load_generator` and `training_generator` return: eval and `grpo generate` use only this."""

    tokenizer: Any

    def generate(self, prompts: list[str] | list[list[int]], max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, min_p: Optional[float] = None) -> list[Completion]:
        """One completion per chat-templated prompt (text or ids); temperature 0: greedy; top_k 0, min_p None: off."""


class Backend(Protocol):
    """The operations a backend's module provides, reached through its object; a step it does not need is a no-op."""

    NAME: str

    def prepare_environment(self, cfg: PipelineConfig) -> Any:
        """Process set-up before trl/transformers/peft are imported (pipeline/bootstrap.py calls it first)."""

    def load_for_training(self, cfg: PipelineConfig, tokenizer: Any = None) -> tuple[Any, Any]:
        """(model, tokenizer) ready for the trainer; `tokenizer`: the run's, which a backend may leave unused."""

    def peft_config(self, cfg: PipelineConfig) -> Any:
        """The peft LoraConfig for TRL to apply, or None when the model already carries its LoRA."""

    def grpo_config_kwargs(self, cfg: PipelineConfig, model: Any) -> dict[str, Any]:
        """Backend-specific trl.GRPOConfig keyword arguments (precision, vLLM)."""

    def config_rewrites(self, kwargs: dict[str, Any], trl_defaults: dict[str, Any]) -> dict[str, tuple[Any, str]]:
        """{field: (value, why)}: what this backend's GRPOConfig class does to `kwargs` before TRL's own __init__."""

    def predicted_config_kwargs(self, cfg: PipelineConfig) -> dict[str, Any]:
        """grpo_config_kwargs as far as it is known before the model loads (`grpo train --check`)."""

    def training_generator(self, model: Any, tokenizer: Any, cfg: PipelineConfig) -> Generator:
        """Generate with the model being trained (eval before/after)."""

    def prepare_trainer(self, trainer: Any, cfg: PipelineConfig) -> None:
        """What the backend does to the built trainer before it trains."""

    def rollout_engine(self, trainer: Any, tokenizer: Any, cfg: PipelineConfig) -> Any:
        """The separate engine the rollouts come from (pipeline/health/rollout.py RolloutEngine), or None."""

    def save_adapter(self, model: Any, tokenizer: Any, directory: Path) -> None:
        """Write the trained adapter and the tokenizer into `directory`."""

    def load_generator(self, base_model: str, adapter: Optional[Any], cfg: PipelineConfig) -> Generator:
        """The base model plus a verified adapter (grpo_pipeline.env.adapters.AdapterInfo; None: the base alone)."""

    def export(self, adapter: Any, base_model: str, method: str, out_dir: Path, cfg: PipelineConfig,
               system_prompt: Optional[str] = None) -> None:
        """Merge the adapter into its base in `out_dir`, the chat template defaulting to `system_prompt`."""

# What `grpo export --to` accepts; each backend's `export` refuses the ones it cannot do (plain: gguf).
EXPORT_METHODS = ("merged16", "merged4", "gguf")


@dataclass(frozen=True)
class BackendChoice:
    name: str  # "unsloth" | "plain"
    reason: str
    # unsloth only: False when Unsloth must run without vLLM (its patched trainer generates with transformers).
    fast_inference: bool = True


def cuda_available() -> bool:
    """Whether torch could use a CUDA GPU, without importing it (unsloth_zoo/__init__.py expects it unimported)."""
    return probes.cuda_usability().usable


def on_cpu() -> bool:
    """True when this process has no CUDA device for torch; it imports torch, so only past the backend choice."""
    import torch

    return not torch.cuda.is_available()


def mixed_precision(model) -> dict[str, bool]:
    """`bf16`/`fp16` as Unsloth's trainers read the dtype (config.dtype, else the embeddings'; mismatch: TypeError)."""
    config = getattr(model, "config", None)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if dtype is None:
        dtype = model.get_input_embeddings().weight.dtype
    name = str(dtype).rsplit(".", 1)[-1]  # torch.bfloat16 or "bfloat16"; avoids importing torch
    return {"bf16": name == "bfloat16", "fp16": name == "float16"}


def choose_backend(requested: str, fast_inference: bool = True) -> BackendChoice:
    """`backend: auto|unsloth|plain` as a concrete backend and the reason; ConfigError when unsloth cannot run."""
    has = {name: importlib.util.find_spec(name) is not None for name in ("unsloth", "vllm")}
    if requested in BACKENDS and requested != "unsloth":  # plain, or a registered backend: as requested
        return BackendChoice(requested, f"backend: {requested} was requested")
    if requested not in ("auto", "unsloth"):
        raise ConfigError("backend", f"got {requested!r}; choose auto, unsloth or plain.")
    has_cuda = cuda_available()
    if requested == "unsloth":
        problems = []
        if not has_cuda:
            problems.append(f"CUDA is not usable ({probes.cuda_usability().reason})")
        if not has["unsloth"]:
            problems.append("unsloth is not installed (pip install -e '.[gpu]')")
        elif fast_inference and not has["vllm"]:
            problems.append("vllm is not installed (pip install -e '.[gpu]'), or set fast_inference: false to run "
                            "Unsloth without vLLM")
        if problems:
            raise ConfigError(
                "backend",
                "backend: unsloth needs a CUDA GPU with unsloth (and vllm unless fast_inference: false) installed, "
                "but " + "; ".join(problems) + ". Use backend: plain (or auto) to run without them."
            )
        return BackendChoice("unsloth", "backend: unsloth was requested", fast_inference=fast_inference)
    if not has_cuda:
        return BackendChoice("plain", "auto: no usable CUDA GPU, so the plain transformers + peft + TRL backend")
    if not has["unsloth"]:
        return BackendChoice("plain", "auto: CUDA GPU found but unsloth not installed; pip install -e '.[gpu]' "
                             "for Unsloth + vLLM")
    if not has["vllm"] and fast_inference:
        return BackendChoice("unsloth", "auto: CUDA GPU and unsloth found but vllm is not installed, so Unsloth "
                             "WITHOUT vLLM (fast_inference: false; rollouts use transformers' generate, slower)",
                             fast_inference=False)
    if not fast_inference:
        return BackendChoice("unsloth", "auto: CUDA GPU and unsloth available; fast_inference: false (no vLLM)",
                             fast_inference=False)
    return BackendChoice("unsloth", "auto: CUDA GPU, unsloth and vllm are all available")


def refuse_gpu_recipe_without_cuda(cfg: PipelineConfig, choice: BackendChoice) -> None:
    """ConfigError when a GPU-sized recipe (backend auto/unsloth, no tiny built-in model) would train on CPU."""
    builtin = builtin_model(cfg.model.model_name_or_path)
    if choice.name != "plain" or cfg.model.backend == "plain" or (builtin is not None and builtin.cpu_sized):
        return
    status = probes.cuda_usability()
    if status.usable:
        # torch too (harmless: plain never imports unsloth) catches what files cannot show (a broken install).
        import torch

        if torch.cuda.is_available():
            return
        status = type(status)(False, f"torch {torch.__version__} sees no CUDA device although {status.reason}",
                              status.driver, status.torch_cuda, None)
    if status.driver and not status.driver_needed:
        fix = "check `nvidia-smi` and `grpo env` (they show what torch cannot reach)"
    elif status.driver_needed:
        fix = (f"update the NVIDIA driver to >= {status.driver_needed}, or install the torch build for your "
               "driver's CUDA (`grpo env` shows the matching profile and pip command)")
    elif status.torch_cuda:
        fix = "run on a machine with an NVIDIA GPU (Colab: Runtime > Change runtime type > GPU)"
        if status.reason.startswith("CUDA_VISIBLE_DEVICES"):
            fix = "unset CUDA_VISIBLE_DEVICES (or list a GPU in it)"
    else:  # a CPU-only torch, or none
        fix = ("install the GPU set (`grpo env` prints the pip command for this machine) on a machine with an "
               "NVIDIA GPU")
    raise ConfigError(
        "model_name_or_path",
        f"{cfg.model.model_name_or_path!r} with backend: {cfg.model.backend} is a GPU recipe, but CUDA is not usable "
        f"here: {status.reason}. Fix: {fix}. To train it on CPU anyway (very slow), set backend: plain; for the "
        "built-in CPU demo run `grpo train` without --config.",
    )


# A backend's name -> its class ("module:Class", imported on first use).
BACKENDS: dict[str, Any] = {"plain": "grpo_pipeline.pipeline.backends.plain:PlainBackend",
                            "unsloth": "grpo_pipeline.pipeline.backends.unsloth:UnslothBackend"}
GPU_DEFAULT = "unsloth"  # what `backend: auto` runs on a CUDA machine with the [gpu] extras (`grpo plan`)


def load_backend(name: str) -> Any:  # a BackendBase, whose module satisfies Backend
    if name not in BACKENDS:
        raise ConfigError("backend", f"got {name!r}; choose auto or one of {', '.join(BACKENDS)}.")
    if isinstance(BACKENDS[name], str):
        module, _, cls = BACKENDS[name].partition(":")
        BACKENDS[name] = getattr(importlib.import_module(module), cls)
    return BACKENDS[name]()


def planned_backend(requested: str) -> Any:
    """The backend a recipe's `backend` runs on a CUDA machine with the [gpu] extras (auto: GPU_DEFAULT)."""
    return load_backend(GPU_DEFAULT if requested == "auto" else requested)


def register_backend(cls: type) -> None:
    """Add a backend: the registry, the `backend` field's choices and the recipe rules `validate` runs for it."""
    BACKENDS[cls.NAME] = cls
    BACKEND_RULES[cls.NAME] = tuple(cls.RECIPE_RULES)
    if cls.NAME not in field_choices("backend"):
        set_field_choices("backend", (*field_choices("backend"), cls.NAME))


def unregister_backend(name: str) -> None:  # a test's backend, once the test is done
    BACKENDS.pop(name, None)
    BACKEND_RULES.pop(name, None)
    set_field_choices("backend", tuple(choice for choice in field_choices("backend") if choice != name))
