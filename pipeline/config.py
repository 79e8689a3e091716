"""One config for the whole pipeline: dataclasses parsed by TRL's `TrlParser` (YAML + CLI overrides).

The layout follows open-r1: a YAML recipe sets defaults, `--key value` on the command line
overrides them. The sections are separate dataclasses (model, LoRA, data, GRPO, generation,
health, eval) but share one flat namespace, so a recipe is a flat YAML mapping.

`validate()` runs before any model or tokenizer is loaded. It turns the mistakes that
otherwise surface deep inside TRL or Unsloth (or worse, are silently rewritten by them)
into one error that names the field and the fix.

This module imports no torch, transformers or trl at import time.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from rewards import DEFAULT_REWARDS as DEFAULT_REWARD_FUNCS  # the notebook's order (light import: no torch)
from rewards.format import FORMAT_SYSTEM_PROMPT

# The notebook's system prompt; rewards/format.py owns the format. The data module checks that it
# survives the chat template verbatim.
DEFAULT_SYSTEM_PROMPT = FORMAT_SYSTEM_PROMPT

DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# What Unsloth trains in full rather than as LoRA (unsloth/models/_utils.py EMBEDDING_MODULES).
EMBEDDING_MODULES = ("embed_tokens", "lm_head")

# Fields that Unsloth takes from GRPOConfig and ignores in `vllm_sampling_params`
# (unsloth/models/rl_replacements.py grpo_update_SamplingParams). Setting them there is a silent no-op.
UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS = {
    "seed": "seed",
    "n": "num_generations",
    "temperature": "temperature",
    "max_tokens": "max_completion_length",
    "logprobs": "(set by the trainer)",
}


class ConfigError(ValueError):
    """A config value that cannot work. `field` names it; the message says the fix."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"config error in `{field_name}`: {message}")


def check_adapter_rank(rank: int, max_lora_rank: int, *, what: str, fix: str,
                       field_name: str = "max_lora_rank") -> None:
    """Refuse an adapter rank above max_lora_rank: vLLM sizes its LoRA slots by max_lora_rank when the
    engine starts and cannot load a larger adapter. The one rank check for training, generate/eval and
    the Unsloth backend.

    >>> check_adapter_rank(64, 32, what="the adapter at /runs/lora", fix="Pass --max_lora_rank 64.")
    Traceback (most recent call last):
    ...
    pipeline.config.ConfigError: config error in `max_lora_rank`: the adapter at /runs/lora has rank r=64, above max_lora_rank=32; vLLM cannot load it. Pass --max_lora_rank 64.
    """
    if rank > max_lora_rank:
        raise ConfigError(field_name, f"{what} has rank r={rank}, above max_lora_rank={max_lora_rank}; vLLM cannot "
                                      f"load it. {fix}")


def _help(text: str, *, gt: Optional[float] = None, ge: Optional[float] = None, lt: Optional[float] = None,
          le: Optional[float] = None, **kw) -> Any:
    """A field with its help text and, for numbers, the bounds `check_field_values` enforces."""
    made = field(metadata={"help": text}, **kw)
    bounds = {name: value for name, value in (("gt", gt), ("ge", ge), ("lt", lt), ("le", le)) if value is not None}
    if bounds:
        # Beside the metadata, not in it: HfArgumentParser passes every metadata key to argparse.
        _FIELD_BOUNDS[id(made)] = bounds
    return made


_FIELD_BOUNDS: dict[int, dict[str, float]] = {}


@dataclass
class ModelArguments:
    model_name_or_path: str = _help(
        "Base model: a hub id, a local folder, or `tiny-demo` (the built-in CPU demo model).",
        default="unsloth/Qwen2.5-1.5B-Instruct",
    )
    backend: str = _help(
        "auto | unsloth | plain. auto: unsloth when CUDA and unsloth are usable (without vLLM, fast_inference "
        "false, when vllm is missing), else plain; a GPU recipe is refused rather than trained on CPU.",
        default="auto",
    )
    max_seq_length: int = _help("Prompt + completion token budget; sizes vLLM's KV cache.", default=1024, gt=0)
    load_in_4bit: bool = _help("QLoRA: 4-bit base weights (bitsandbytes). Ignored on CPU.", default=True)
    dtype: str = _help("auto | bfloat16 | float16 | float32. auto: bf16 where the GPU supports it, else fp16.",
                       default="auto")
    gpu_memory_utilization: str = _help(
        "Share of GPU memory vLLM may take, or `auto` (picked from GPU memory and standby; see README).",
        default="auto",
    )
    fast_inference: bool = _help(
        "Unsloth backend: generate with vLLM (true, fast). false runs Unsloth without vLLM (Windows/WSL, older "
        "GPUs, images where vLLM will not install): rollouts then use transformers' generate, several times slower.",
        default=True,
    )
    max_lora_rank: int = _help("vLLM's LoRA rank limit; lora_r must not exceed it.", default=64, gt=0)
    float8_kv_cache: bool = _help("fp8 KV cache in vLLM: more context on Ada/Hopper; off by default.",
                                  default=False)
    vllm_standby: str = _help(
        "auto | true | false. Unsloth standby lets vLLM's memory sleep while training computes "
        "(UNSLOTH_VLLM_STANDBY=1); auto turns it on for any CUDA GPU, as the official notebook does.",
        default="auto",
    )
    vllm_mode: str = _help(
        "Plain backend only: none | colocate | server (TRL's vLLM). Unsloth always uses its own shared engine.",
        default="none",
    )
    vllm_server_base_url: Optional[str] = _help("Plain backend, vllm_mode=server: URL of `trl vllm-serve`.",
                                                default=None)
    trust_remote_code: bool = _help("Passed to from_pretrained. Qwen2.5 needs no remote code.", default=False)

    def __post_init__(self) -> None:
        # A YAML `vllm_standby: true` arrives as a bool and `--vllm_standby True` as "True": both mean "true".
        # Anything else is left as given for validate() to name.
        if isinstance(self.vllm_standby, bool) or str(self.vllm_standby).strip().lower() in ("auto", "true", "false"):
            self.vllm_standby = str(self.vllm_standby).strip().lower()


@dataclass
class LoraArguments:
    lora_r: int = _help("LoRA rank. 32-64 is what the Unsloth GRPO notebooks use.", default=32)
    lora_alpha: int = _help("LoRA alpha; alpha = r keeps the update scale at 1.", default=32, gt=0)
    lora_dropout: float = _help("0 lets Unsloth use its fast LoRA kernels.", default=0.0, ge=0, lt=1)
    lora_target_modules: list[str] = _help("Modules that get LoRA adapters (all attention + MLP).",
                                           default_factory=lambda: list(DEFAULT_TARGET_MODULES))
    lora_modules_to_save: list[str] = _help(
        "Modules trained in full beside the adapter (the tiny demo: its random `norm`s and `embed_tokens`).",
        default_factory=list,
    )
    full_finetune: bool = _help("Plain backend only: train all weights, no LoRA (small models; saves output_dir/model).", default=False)
    gradient_checkpointing: bool = _help("Trade compute for memory; Unsloth uses its own offloaded variant.",
                                         default=True)


@dataclass
class DataArguments:
    dataset_name: str = _help(
        "openai/gsm8k, a local .jsonl/.csv/.parquet file, `sample` (bundled 50 problems) or `demo-arithmetic`.",
        default="openai/gsm8k",
    )
    dataset_config: Optional[str] = _help("Hub dataset config (gsm8k: main).", default="main")
    dataset_revision: Optional[str] = _help("Hub dataset revision (commit/tag) for reproducible data.",
                                            default=None)
    dataset_split: str = _help("Split to train on.", default="train")
    question_field: str = _help("Column holding the question.", default="question")
    answer_field: str = _help("Column holding the answer (GSM8K `#### n` solutions or plain answers).",
                              default="answer")
    system_prompt: str = _help("System message; the default is the notebook's <reasoning>/<answer> format.",
                               default=DEFAULT_SYSTEM_PROMPT)
    max_prompt_length: str = _help(
        "Token limit for prompts, or `auto` (longest kept prompt rounded up to 16). TRL no longer filters.",
        default="auto",
    )
    max_completion_length: str = _help("Token limit for completions, or `auto` (= max_seq_length - prompt).",
                                       default="auto")
    overlong_policy: str = _help("drop | error: what to do with prompts over max_prompt_length.", default="drop")
    strict: bool = _help("Turn every rejected row into an error instead of a reported drop.", default=False)
    max_samples: Optional[int] = _help("Use only the first N rows (after cleaning); None = all.", default=None)
    data_cache_dir: Optional[str] = _help("Where processed datasets are cached; default <cache root>/data "
                                          "($GRPO_CACHE_DIR, else ~/.cache/grpo-pipeline).", default=None)


@dataclass
class GRPOArguments:
    output_dir: str = _help("Run folder: checkpoints, lora/, manifest.json, metrics.jsonl, plots/.",
                            default="outputs/qwen2.5-gsm8k")
    learning_rate: float = _help(
        "5e-6 as in the Unsloth notebooks: LoRA needs more than TRL's 1e-6 full-fine-tune default.", default=5e-6,
        gt=0,
    )
    num_generations: int = _help("Completions per prompt (the GRPO group). Must be >= 2.", default=8)
    per_device_train_batch_size: int = _help(
        "Completions (not prompts!) per device per step, as TRL counts them.", default=8, ge=1
    )
    gradient_accumulation_steps: int = _help("Steps accumulated before an optimizer step.", default=1, ge=1)
    max_steps: int = _help("Optimizer steps; -1 = run num_train_epochs.", default=250, ge=-1)
    num_train_epochs: float = _help("Used only when max_steps = -1.", default=1.0, gt=0)
    beta: float = _help(
        "KL coefficient. 0 (TRL default) loads no reference model; > 0 adds a 'ref' adapter copy and logs `kl`.",
        default=0.0,
    )
    loss_type: str = _help(
        "dapo (TRL default: token-level, no length bias) | grpo | dr_grpo | bnpo | cispo | ...", default="dapo"
    )
    mask_truncated_completions: bool = _help(
        "False (TRL default): with True, a batch whose completions are all cut at max_completion_length (common "
        "early on) gives no gradient at all. Passed explicitly because Unsloth sets True for dapo when unset.",
        default=False,
    )
    epsilon_high: float = _help(
        "DAPO clip-higher bound 0.28. Passed explicitly: Unsloth sets 0.28 for dapo when unset, TRL uses 0.2.",
        default=0.28, ge=0)
    temperature: float = _help("Rollout sampling temperature; GRPO needs diverse groups, so keep ~1.", default=1.0)
    top_p: float = _help("Rollout nucleus sampling.", default=1.0, gt=0, le=1)
    top_k: int = _help("Rollout top-k; 0 = off.", default=0, ge=0)
    min_p: Optional[float] = _help("Rollout min-p; None = off.", default=None, ge=0, le=1)
    warmup_ratio: float = _help("Share of steps spent warming up the learning rate.", default=0.1, ge=0, lt=1)
    lr_scheduler_type: str = _help("As in the notebook.", default="cosine")
    optim: str = _help("adamw_8bit on GPU saves memory (bitsandbytes); adamw_torch works everywhere.",
                       default="adamw_torch")
    weight_decay: float = _help("As in the notebook.", default=0.001, ge=0)
    adam_beta1: float = _help("As in the notebook.", default=0.9, ge=0, lt=1)
    adam_beta2: float = _help("0.99 as in the notebook: reacts faster than 0.999 to RL's moving target.",
                              default=0.99, ge=0, lt=1)
    max_grad_norm: float = _help("0.1 as in the notebook: RL gradients spike.", default=0.1, ge=0)
    logging_steps: int = _help("Log (and check health) every N steps.", default=1, ge=1)
    save_steps: int = _help("Checkpoint every N steps (resume needs them).", default=50, ge=1)
    save_total_limit: Optional[int] = _help("Keep the newest N checkpoints.", default=3, ge=1)
    seed: int = _help("Seed for data order, LoRA init and sampling.", default=3407)
    report_to: str = _help("none | tensorboard | wandb (comma-separated).", default="none")
    reward_funcs: list[str] = _help("Reward names from the registry, or module:function.",
                                    default_factory=lambda: list(DEFAULT_REWARD_FUNCS))
    reward_weights: Optional[list[float]] = _help("One weight per reward function; None = all 1.0.",
                                                  default=None)
    resume: str = _help("auto | never | PATH: auto resumes from the newest complete checkpoint in output_dir.",
                        default="auto")
    vllm_sampling_params: Optional[str] = _help(
        "Unsloth backend: extra vLLM SamplingParams as a mapping (YAML) or JSON string, e.g. min_p, stop.",
        default=None,
    )
    vllm_importance_sampling_correction: bool = _help(
        "When generating with vLLM: reweight by trainer/vLLM log-prob ratios (truncated importance sampling), "
        "since vLLM's kernels sample from a slightly different distribution than the trainer scores. true is "
        "TRL's default; Unsloth's would be false, so both backends pass this value explicitly.",
        default=True,
    )
    log_completions: bool = _help("TRL's completion table + parquet in output_dir/completions/.", default=False)


@dataclass
class GenerationArguments:
    gen_max_tokens: Optional[int] = _help(
        "Tokens to generate after training; default = the trained max_completion_length.", default=None
    )
    allow_longer_generation: bool = _help("Permit gen_max_tokens above max_completion_length.", default=False)
    gen_temperature: float = _help("Sampling temperature for generate/eval; 0 = greedy.", default=0.0)
    gen_top_p: float = _help("Nucleus sampling for generate/eval.", default=1.0, gt=0, le=1)


@dataclass
class HealthArguments:
    garbled_threshold: float = _help("Stop/warn when this share of completions is garbled ...", default=0.3, ge=0, le=1)
    garbled_window: int = _help("... averaged over this many logged steps.", default=3, ge=1)
    garbled_action: str = _help("warn | stop.", default="stop")
    repetition_threshold: float = _help("Warn/stop when the mean n-gram repetition rate exceeds this.",
                                        default=0.6, ge=0, le=1)
    repetition_action: str = _help("warn | stop.", default="warn")
    kl_ceiling: float = _help("When beta > 0: act when `kl` exceeds this.", default=1.0, gt=0)
    kl_action: str = _help("warn | stop.", default="stop")
    adaptive_beta: bool = _help("Move beta toward kl_target (needs beta > 0 at start).", default=False)
    kl_target: float = _help("Adaptive beta's KL target.", default=0.05, gt=0)
    beta_min: float = _help("Adaptive beta's lower bound.", default=0.001)
    beta_max: float = _help("Adaptive beta's upper bound.", default=0.5)
    sft_warmup_steps: int = _help("Steps of SFT format warm-up before GRPO; 0 = off.", default=0, ge=0)
    sft_learning_rate: float = _help("Warm-up learning rate.", default=2e-4, gt=0)


@dataclass
class EvalArguments:
    eval_before: bool = _help("Evaluate on held-out problems before training.", default=False)
    eval_after: bool = _help("Evaluate on held-out problems after training.", default=False)
    eval_split: str = _help("Held-out split (gsm8k: test).", default="test")
    eval_limit: int = _help("Number of held-out problems.", default=100, ge=1)


SECTIONS = (
    ModelArguments,
    LoraArguments,
    DataArguments,
    GRPOArguments,
    GenerationArguments,
    HealthArguments,
    EvalArguments,
)


@dataclass
class PipelineConfig:
    """All sections together. Access `cfg.model.max_seq_length`, `cfg.grpo.beta`, ..."""

    model: ModelArguments = field(default_factory=ModelArguments)
    lora: LoraArguments = field(default_factory=LoraArguments)
    data: DataArguments = field(default_factory=DataArguments)
    grpo: GRPOArguments = field(default_factory=GRPOArguments)
    generation: GenerationArguments = field(default_factory=GenerationArguments)
    health: HealthArguments = field(default_factory=HealthArguments)
    eval: EvalArguments = field(default_factory=EvalArguments)

    def to_dict(self) -> dict[str, Any]:
        """Flat mapping, the same shape as a YAML recipe."""
        flat: dict[str, Any] = {}
        for section in dataclasses.fields(self):
            flat.update(dataclasses.asdict(getattr(self, section.name)))
        return flat

    def replace(self, **flat_overrides: Any) -> "PipelineConfig":
        """Return a copy with flat field overrides applied (unknown keys raise ConfigError)."""
        return from_mapping({**self.to_dict(), **flat_overrides})


_SECTION_ATTR = {
    ModelArguments: "model",
    LoraArguments: "lora",
    DataArguments: "data",
    GRPOArguments: "grpo",
    GenerationArguments: "generation",
    HealthArguments: "health",
    EvalArguments: "eval",
}


def field_names() -> dict[str, type]:
    """Flat field name -> the section dataclass that owns it."""
    return {f.name: cls for cls in SECTIONS for f in dataclasses.fields(cls)}


def from_mapping(values: dict[str, Any]) -> PipelineConfig:
    """Build a config from a flat mapping (e.g. a parsed YAML recipe); unknown keys are errors."""
    owners = field_names()
    unknown = sorted(set(values) - set(owners))
    if unknown:
        raise unknown_option_error(unknown[0])
    parts: dict[type, dict[str, Any]] = {cls: {} for cls in SECTIONS}
    for key, value in values.items():
        parts[owners[key]][key] = value
    return PipelineConfig(**{_SECTION_ATTR[cls]: cls(**kw) for cls, kw in parts.items()})


def parse_config(argv: list[str] | None = None, base: dict[str, Any] | None = None) -> PipelineConfig:
    """Parse `[--config FILE] [--key value ...]` with TRL's TrlParser, like open-r1's scripts.

    `base` supplies defaults below the YAML file (used for the built-in CPU demo).
    """
    from trl import TrlParser  # light: does not import torch

    parser = TrlParser(SECTIONS)
    if base:
        unknown = parser.set_defaults_with_config(**base)
        if unknown:
            raise ConfigError(str(unknown[0]), f"unknown option(s) in built-in defaults: {unknown}")
    argv = normalize_argv(argv or [])
    check_option_names(argv)
    path = config_path(argv)
    if path is not None:
        read_recipe(path)  # syntax errors and unknown keys, named with the file and line
    parsed = parser.parse_args_and_config(argv)
    by_cls = {type(p): p for p in parsed}
    return PipelineConfig(**{_SECTION_ATTR[cls]: by_cls[cls] for cls in SECTIONS})


def normalize_argv(argv: list[str]) -> list[str]:
    """`--config=FILE` -> `--config FILE`: TrlParser (and our own look-ups) only see the spaced form, so with
    `=` the recipe was silently ignored and the run started with the defaults.

    >>> normalize_argv(["--config=r.yaml", "--max_steps=3"])
    ['--config', 'r.yaml', '--max_steps=3']
    """
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--config="):
            out.extend(["--config", arg.split("=", 1)[1]])
        else:
            out.append(arg)
    return out


def config_path(argv: list[str]) -> Optional[str]:
    """The `--config` file of a normalised argv, or None; a missing value or file is a ConfigError."""
    if "--config" not in argv:
        return None
    index = argv.index("--config")
    if index + 1 >= len(argv) or argv[index + 1].startswith("--"):
        raise ConfigError("config", "--config needs a file, e.g. --config configs/qwen2.5-1.5b-gsm8k.yaml")
    path = argv[index + 1]
    if not os.path.isfile(path):
        raise ConfigError("config", f"file {os.path.abspath(path)!r} does not exist. Pass a YAML recipe, "
                          "e.g. --config configs/qwen2.5-1.5b-gsm8k.yaml")
    return path


def unknown_option_error(name: str) -> ConfigError:
    """An unknown option, with the closest field names (difflib) as the likely fix."""
    close = difflib.get_close_matches(name, list(field_names()), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(f'`{c}`' for c in close)}?" if close else "no option has a similar name."
    return ConfigError(name, f"unknown option `{name}`; {hint} All options: `grpo train --help`.")


def check_option_names(argv: list[str]) -> None:
    """Refuse an unknown `--name`, a recipe given without --config, or a number option whose value is not a
    number, before argparse does (its messages list no alternatives and bury the fix under the usage text)."""
    owners = field_names()
    # HfArgumentParser adds --no_X for bool fields that default to True.
    known = set(owners) | {f"no_{name}" for name in owners}
    for i, arg in enumerate(argv):
        if arg.endswith((".yaml", ".yml")) and (i == 0 or not argv[i - 1].startswith("--")):
            raise ConfigError("config", f"{arg!r} is not an option; to read a recipe write --config {arg}")
        if not (arg.startswith("--") and len(arg) > 2):
            continue
        name, _, inline = arg[2:].partition("=")
        name = name.replace("-", "_")  # argparse also accepts --max-steps
        if name == "config":
            continue
        if name not in known:
            raise unknown_option_error(name)
        value = inline if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else None)
        kind = typing.get_type_hints(owners[name]).get(name) if name in owners else None
        if kind in (int, float, Optional[int], Optional[float]) and value is not None:
            optional = kind in (Optional[int], Optional[float])
            if not (optional and value.lower() in ("none", "null")):
                _coerce(value, int if kind in (int, Optional[int]) else float, name)


def read_recipe(path: str) -> dict[str, Any]:
    """The recipe as a flat mapping; a YAML syntax error names the file and line, an unknown key the closest
    field name."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            loaded = yaml.safe_load(f)
    except UnicodeDecodeError as err:
        raise ConfigError("config", f"{os.path.abspath(path)} is not UTF-8 text ({err.reason} at byte "
                          f"{err.start}); save it as UTF-8.") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError("config", f"{os.path.abspath(path)}{where}: YAML syntax error ({problem}). Each line "
                          "is `key: value`; quote values that contain `: ` or `#`.") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError("config", f"{os.path.abspath(path)} must be a mapping of `key: value` lines, got a "
                          f"{type(loaded).__name__}.")
    unknown = sorted(str(k) for k in set(loaded) - set(field_names()))
    if unknown:
        err = unknown_option_error(unknown[0])
        raise ConfigError(err.field, f"{os.path.abspath(path)}: {str(err).split(': ', 1)[1]}")
    return loaded


# ---------------------------------------------------------------------------------------------
# Field values: one check driven by the dataclass field types and their `bounds` metadata.
# ---------------------------------------------------------------------------------------------


def _coerce(value: Any, kind: type, name: str) -> Any:
    """`value` as `kind` (int/float/bool), or a ConfigError. A float for an int field is refused unless whole:
    1.5 steps would otherwise be truncated (or fail deep inside the trainer)."""
    article = "an integer" if kind is int else "a number" if kind is float else "true or false"
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(name, f"got {value!r}; use true or false.")
    if isinstance(value, bool):
        raise ConfigError(name, f"got {value!r}; use {article}.")
    if isinstance(value, str):
        try:
            value = float(value) if kind is float else int(value)
        except ValueError:
            raise ConfigError(name, f"got {value!r}; use {article}.") from None
    if not isinstance(value, (int, float)):
        raise ConfigError(name, f"got {value!r} ({type(value).__name__}); use {article}.")
    if not math.isfinite(value):
        raise ConfigError(name, f"got {value!r}; use a finite number.")
    if kind is int:
        if value != int(value):
            raise ConfigError(name, f"got {value!r}; use a whole number such as {max(int(value), 1)}.")
        return int(value)
    return float(value)


def _check_bounds(value: float, name: str, bounds: dict[str, float], default: Any) -> None:
    tests = {"gt": (value > bounds.get("gt", -math.inf), "> {}"), "ge": (value >= bounds.get("ge", -math.inf), ">= {}"),
             "lt": (value < bounds.get("lt", math.inf), "< {}"), "le": (value <= bounds.get("le", math.inf), "<= {}")}
    wanted = " and ".join(text.format(bounds[key]) for key, (_, text) in tests.items() if key in bounds)
    if not all(ok for ok, _ in tests.values()):
        suggestion = f" (the default is {default})" if default is not None else ""
        raise ConfigError(name, f"got {value:g}; it must be {wanted}{suggestion}.")


def check_field_values(cfg: PipelineConfig) -> None:
    """Check (and normalise) every int/float/bool field against its declared type and bounds.

    YAML and the parser's defaults pass values through untyped, so `max_steps: 1.5` or `learning_rate: -1`
    would otherwise reach the trainer after the model has loaded.

    >>> check_field_values(PipelineConfig().replace(max_steps=1.5))
    Traceback (most recent call last):
    ...
    pipeline.config.ConfigError: config error in `max_steps`: got 1.5; use a whole number such as 1.
    >>> check_field_values(PipelineConfig().replace(learning_rate=0))
    Traceback (most recent call last):
    ...
    pipeline.config.ConfigError: config error in `learning_rate`: got 0; it must be > 0 (the default is 5e-06).
    """
    for section_cls in SECTIONS:
        section = getattr(cfg, _SECTION_ATTR[section_cls])
        hints = typing.get_type_hints(section_cls)
        for f in dataclasses.fields(section_cls):
            kind = hints[f.name]
            optional = type(None) in typing.get_args(kind)
            if optional:
                kind = next(a for a in typing.get_args(kind) if a is not type(None))
            value = getattr(section, f.name)
            if value is None:
                if optional:
                    continue
                raise ConfigError(f.name, "is empty; give a value or remove the line to use the default.")
            if typing.get_origin(kind) is list:
                (item_kind,) = typing.get_args(kind)
                if item_kind in (int, float) and isinstance(value, (list, tuple)):
                    setattr(section, f.name, [_coerce(v, item_kind, f.name) for v in value])
                continue
            if kind not in (int, float, bool):
                continue
            value = _coerce(value, kind, f.name)
            setattr(section, f.name, value)
            if kind is not bool and id(f) in _FIELD_BOUNDS:
                _check_bounds(value, f.name, _FIELD_BOUNDS[id(f)],
                              f.default if f.default is not dataclasses.MISSING else None)


# ---------------------------------------------------------------------------------------------
# Validation: pure Python, before any model or tokenizer loads.
# ---------------------------------------------------------------------------------------------


def world_size() -> int:
    """Number of training processes (set by accelerate/torchrun); 1 for a plain run."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def parse_limit(value: Any, field_name: str) -> Optional[int]:
    """`auto` -> None, else a positive int; anything else is a ConfigError."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(field_name, f"got {value!r}; use a positive integer or `auto`.") from None
    if number <= 0:
        raise ConfigError(field_name, f"got {number}; use a positive integer or `auto`.")
    return number


def sampling_params_mapping(value: Any) -> dict[str, Any]:
    """Normalise `vllm_sampling_params` (mapping or JSON string) to a dict."""
    if value in (None, "", {}):
        return {}
    if isinstance(value, dict):
        return dict(value)
    try:
        parsed = json.loads(value)
    except (TypeError, json.JSONDecodeError):
        raise ConfigError("vllm_sampling_params", f"got {value!r}; give a YAML mapping or a JSON object "
                          "string such as '{\"min_p\": 0.1}'.") from None
    if not isinstance(parsed, dict):
        raise ConfigError("vllm_sampling_params", "must be a mapping such as {min_p: 0.1}.")
    return parsed


def _choice(value: str, field_name: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(field_name, f"got {value!r}; choose one of {', '.join(choices)}.")


def validate(cfg: PipelineConfig, n_processes: int | None = None, backend: str | None = None) -> list[str]:
    """Check the config; raise ConfigError on the first fatal problem, return warnings.

    `backend` is the resolved backend ("unsloth" | "plain") when known; by default `cfg.model.backend`.

    >>> validate(PipelineConfig())
    []
    >>> validate(PipelineConfig().replace(num_generations=1))
    Traceback (most recent call last):
    ...
    pipeline.config.ConfigError: config error in `num_generations`: got 1; GRPO compares completions within a group, so it needs at least 2 (8 is typical).
    """
    m, lo, d, g, gen, h = cfg.model, cfg.lora, cfg.data, cfg.grpo, cfg.generation, cfg.health
    notes: list[str] = []
    n_processes = n_processes or world_size()
    check_field_values(cfg)

    _choice(m.backend, "backend", ("auto", "unsloth", "plain"))
    _choice(m.vllm_mode, "vllm_mode", ("none", "colocate", "server"))
    _choice(m.vllm_standby, "vllm_standby", ("auto", "true", "false"))
    _choice(m.dtype, "dtype", ("auto", "bfloat16", "float16", "float32"))
    _choice(d.overlong_policy, "overlong_policy", ("drop", "error"))
    for name in ("garbled_action", "repetition_action", "kl_action"):
        _choice(getattr(h, name), name, ("warn", "stop"))

    if g.num_generations < 2:
        raise ConfigError("num_generations", f"got {g.num_generations}; GRPO compares completions within a "
                          "group, so it needs at least 2 (8 is typical).")
    global_batch = g.per_device_train_batch_size * g.gradient_accumulation_steps * n_processes
    if g.per_device_train_batch_size < 1 or global_batch % g.num_generations != 0:
        raise ConfigError(
            "per_device_train_batch_size",
            f"per_device_train_batch_size ({g.per_device_train_batch_size}) x gradient_accumulation_steps "
            f"({g.gradient_accumulation_steps}) x processes ({n_processes}) = {global_batch} is not divisible by "
            f"num_generations ({g.num_generations}). TRL counts completions, not prompts, in this batch: set "
            f"per_device_train_batch_size to a multiple of {g.num_generations} (e.g. {g.num_generations}). "
            "(Unsloth would silently rewrite the batch size; we refuse instead so the run does what you wrote.)",
        )

    prompt_limit = parse_limit(d.max_prompt_length, "max_prompt_length")
    completion_limit = parse_limit(d.max_completion_length, "max_completion_length")
    if m.max_seq_length <= 0:
        raise ConfigError("max_seq_length", f"got {m.max_seq_length}; use a positive integer such as 1024.")
    if prompt_limit is not None and completion_limit is not None and prompt_limit + completion_limit > m.max_seq_length:
        raise ConfigError(
            "max_completion_length",
            f"max_prompt_length ({prompt_limit}) + max_completion_length ({completion_limit}) = "
            f"{prompt_limit + completion_limit} exceeds max_seq_length ({m.max_seq_length}). Lower one of them, "
            "raise max_seq_length, or set max_completion_length: auto.",
        )
    for name, limit in (("max_prompt_length", prompt_limit), ("max_completion_length", completion_limit)):
        if limit is not None and limit >= m.max_seq_length:
            raise ConfigError(name, f"{limit} leaves no room in max_seq_length ({m.max_seq_length}).")

    if not lo.full_finetune:
        if lo.lora_r <= 0:
            raise ConfigError("lora_r", f"got {lo.lora_r}; use a positive rank such as 16, 32 or 64.")
        check_adapter_rank(lo.lora_r, m.max_lora_rank, what="the adapter this run trains (lora_r)",
                           fix=f"Raise max_lora_rank to {lo.lora_r} or lower lora_r.", field_name="lora_r")

    if not (g.temperature > 0 and math.isfinite(g.temperature)):
        raise ConfigError("temperature", f"got {g.temperature}; rollouts need sampling, so use a value > 0 "
                          "(1.0 is typical for GRPO).")
    if gen.gen_temperature < 0:
        raise ConfigError("gen_temperature", f"got {gen.gen_temperature}; use 0 (greedy) or a positive value.")

    if gen.gen_max_tokens is not None:
        if gen.gen_max_tokens <= 0:
            raise ConfigError("gen_max_tokens", f"got {gen.gen_max_tokens}; use a positive integer.")
        if completion_limit is not None and gen.gen_max_tokens > completion_limit and not gen.allow_longer_generation:
            raise ConfigError(
                "gen_max_tokens",
                f"gen_max_tokens ({gen.gen_max_tokens}) exceeds the trained max_completion_length "
                f"({completion_limit}); answers past the trained length are often cut before </answer>. "
                "Lower it, or set allow_longer_generation: true.",
            )

    if not (1e-7 <= g.learning_rate <= 1e-3):  # <= 0 was refused by check_field_values
        notes.append(f"learning_rate {g.learning_rate:g} is outside 1e-7..1e-3; GRPO with LoRA usually uses "
                     "1e-6..5e-5 (the notebooks: 5e-6).")

    if g.beta < 0:
        raise ConfigError("beta", f"got {g.beta}; use 0 (no KL, no reference model) or a positive value.")
    if h.adaptive_beta and g.beta <= 0:
        raise ConfigError("adaptive_beta", "needs beta > 0 at the start: with beta = 0 TRL loads no reference "
                          "model, so there is no KL to steer. Set beta: 0.04, or adaptive_beta: false.")
    if h.adaptive_beta and not (0 <= h.beta_min <= h.beta_max):
        raise ConfigError("beta_min", f"need 0 <= beta_min ({h.beta_min}) <= beta_max ({h.beta_max}).")

    params = sampling_params_mapping(g.vllm_sampling_params)
    for key, where in UNSLOTH_OVERRIDDEN_SAMPLING_FIELDS.items():
        if key in params:
            raise ConfigError("vllm_sampling_params", f"`{key}` is ignored there (Unsloth takes it from the "
                              f"trainer config); set `{where}` instead.")

    if (backend or m.backend) == "unsloth":
        validate_unsloth(cfg)

    if m.vllm_mode == "server" and not m.vllm_server_base_url:
        notes.append("vllm_mode=server without vllm_server_base_url: TRL will use host 0.0.0.0:8000.")
    from rewards import get_reward_funcs  # light: no torch

    try:
        get_reward_funcs(list(g.reward_funcs))
    except ValueError as err:
        raise ConfigError("reward_funcs", str(err)) from None
    from rewards import check_reward_weights

    try:
        check_reward_weights(list(g.reward_funcs), g.reward_weights)
    except ValueError as err:
        raise ConfigError("reward_weights", str(err)) from None
    if d.max_samples is not None and d.max_samples <= 0:
        raise ConfigError("max_samples", f"got {d.max_samples}; use a positive integer or leave it unset.")
    if g.save_steps <= 0:
        raise ConfigError("save_steps", f"got {g.save_steps}; checkpoints need a positive interval.")
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return notes


def validate_unsloth(cfg: PipelineConfig) -> None:
    """What the Unsloth backend refuses only after the model (and vLLM) have loaded, refused up front."""
    m, lo, g = cfg.model, cfg.lora, cfg.grpo
    # FastLlamaModel.get_peft_model accepts in modules_to_save only lm_head, embed_tokens and normalization
    # layers (TypeError "Module = ... is not allowed"), checked after the model has loaded.
    others = [name for name in lo.lora_modules_to_save
              if str(name).rsplit(".", 1)[-1] not in EMBEDDING_MODULES and "norm" not in str(name).rsplit(".", 1)[-1]]
    if others:
        raise ConfigError("lora_modules_to_save", f"got {others}; Unsloth trains in full only lm_head, embed_tokens "
                          "and normalization layers (e.g. norm, input_layernorm). Put other modules in "
                          "lora_target_modules, or use backend: plain.")
    if m.fast_inference and lo.lora_modules_to_save:
        # FastLlamaModel.get_peft_model raises NotImplementedError ("fast inference does not work with
        # training embeddings or lm_head") when the model has a vLLM engine. The backend passes None, not [],
        # for an empty list: Unsloth refuses any modules_to_save that is not None there.
        raise ConfigError("lora_modules_to_save", f"got {list(lo.lora_modules_to_save)}, but Unsloth cannot train "
                          "modules in full while vLLM serves the model (fast_inference: true). Remove "
                          "lora_modules_to_save, set fast_inference: false (slower generation), or use "
                          "backend: plain.")
    embeddings = [name for name in lo.lora_target_modules if str(name).rsplit(".", 1)[-1] in EMBEDDING_MODULES]
    if m.fast_inference and embeddings:
        # With a vLLM engine, get_peft_model moves embed_tokens from target_modules to modules_to_save and then
        # raises as above; it leaves lm_head as a LoRA target that never trains (_vllm_unmovable_embedding_modules,
        # _redirect_embedding_targets in unsloth/models/_utils.py), a silent no-op.
        raise ConfigError("lora_target_modules", f"contains {embeddings}: with vLLM (fast_inference: true) Unsloth "
                          "cannot train embeddings or lm_head (embed_tokens is refused, lm_head would stay untrained). "
                          "Remove them, or set fast_inference: false (they are then trained in full).")
    if not m.fast_inference:
        if sampling_params_mapping(g.vllm_sampling_params):
            raise ConfigError("vllm_sampling_params", "is for vLLM, and fast_inference: false runs without it, so "
                              "it would be ignored. Remove it, or set fast_inference: true.")
        if m.vllm_standby == "true":
            raise ConfigError("vllm_standby", "standby puts vLLM to sleep between rollouts, and fast_inference: "
                              "false runs without vLLM. Set vllm_standby: auto or false, or fast_inference: true.")


def peek_option(argv: list[str], name: str, default: Any = None) -> Any:
    """Read one option from `--name value` / `--name=value` or the `--config` YAML, without TrlParser.

    Used before the real parse, to set up Unsloth before trl/transformers/peft are imported
    (TrlParser itself imports trl).
    """
    flag = f"--{name}"
    argv = normalize_argv(argv)
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    path = config_path(argv)
    if path is not None:
        loaded = read_recipe(path)  # a broken recipe is a ConfigError here already
        if name in loaded:
            return loaded[name]
    return default
