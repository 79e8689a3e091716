"""Open a trained adapter (or, with `--base` only, the base model) for `grpo generate` and `grpo eval`, the way it
was trained: verified before anything loads; the base model, system prompt, chat template and max lengths from the
run's manifest.json or the adapter's grpo_adapter.json (neither: refused unless --system_prompt is given).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.adapters import verify_adapter_dir
from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.env.paths import shell_command
from grpo_pipeline.env.text import excerpt
from grpo_pipeline.pipeline.backends import choose_backend, load_backend
from grpo_pipeline.pipeline.config import (
    DEFAULT_SYSTEM_PROMPT,
    ConfigError,
    GenerationArguments,
    PipelineConfig,
    check_adapter_rank,
    field_choices,
    from_mapping,
    given,
    parse_config,
    validate,
)
from grpo_pipeline.pipeline.config.fields import field_names
from grpo_pipeline.pipeline.config.parse import read_recipe
from grpo_pipeline.pipeline.config.trl_fields import trl_option_names
from grpo_pipeline.pipeline.config.pipeline_config import check_generation_temperature
from grpo_pipeline.pipeline.data import model_check
from grpo_pipeline.pipeline.data.tokenizer import resolve_model_path, run_tokenizer
from grpo_pipeline.pipeline.infer.tool_loop import LoopSettings, loop_settings
from grpo_pipeline.pipeline.run.resume import adapter_mismatch
from grpo_pipeline.pipeline.run.manifest import ADAPTER_METADATA_NAME, agent_options, MANIFEST_NAME, find_manifest, other_base
from grpo_pipeline.pipeline.trainer.agents import AGENT_OPTIONS, Agents, agent_names, resolve_agents, rollout_func_note

DEFAULT_MAX_TOKENS_WITHOUT_MANIFEST = 512  # TRL's default max_completion_length


@dataclass
class InferenceSetup:
    generator: Any
    tokenizer: Any
    base_model: str
    adapter: Optional[Any]  # env/adapters.py AdapterInfo
    system_prompt: str
    max_tokens: int
    temperature: float
    top_p: float
    config: PipelineConfig
    manifest: Optional[dict]
    trained_dir: Optional[Path] = None  # the --lora folder
    agents: Agents = dataclasses.field(default_factory=Agents)
    loop: Optional[LoopSettings] = None  # as trained
    backend: str = "plain"  # the backend chosen (choose_backend), which loads the weights


def add_inference_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--lora", help="adapter folder (e.g. outputs/run/lora); relative paths work from any cwd")
    which.add_argument("--base", action="store_true", help="generate WITHOUT an adapter, for comparison")
    parser.add_argument("--run", help="with --base: a run folder (or its lora/) whose manifest gives the base "
                                      "model, system prompt and limits")
    parser.add_argument("--model", help="base model; must match the adapter's (default: from the manifest)")
    parser.add_argument("--backend", default="auto", choices=field_choices("backend"))
    add_config_argument(parser)
    parser.add_argument("--max_tokens", type=int, default=None,
                        help="default: gen_max_tokens, else the trained max_completion_length from the manifest")
    parser.add_argument("--temperature", type=float, default=None,
                        help="default: gen_temperature (0 = greedy, the built-in default)")
    parser.add_argument("--top_p", type=float, default=None, help="default: gen_top_p (1.0)")
    parser.add_argument("--max_lora_rank", type=int, default=None, help="vLLM LoRA rank limit (default: manifest)")
    parser.add_argument("--gpu_memory_utilization", default=None, metavar="SHARE",
                        help="vLLM's share of GPU memory (`auto` or a number in (0, 1]; default: --config's, else "
                             "the adapter's record)")
    add_remote_code_argument(parser)
    parser.add_argument("--tools", nargs="*", default=None, metavar="MODULE:FUNCTION",
                        help="the tools the model may call (an adapter trained with tools needs them named: its "
                             "record is not run on its word; `--tools` alone: none)")
    parser.add_argument("--environment_factory", default=None, metavar="MODULE:CLASS",
                        help="TRL's environment_factory (module:Class, or a JSON object of name: module:Class; "
                             "named as for --tools; '' for none)")
    parser.add_argument("--system_prompt", "--system", default=None,
                        help="override the system prompt the adapter records (the one its training rows carried); "
                             "required for an adapter that carries no grpo_adapter.json and has no manifest.json "
                             "beside it")


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="a recipe (YAML, as for grpo train): every field it sets overrides the "
                                         "adapter's record (gpu_memory_utilization, max_seq_length, vllm_mode, ...; "
                                         "its gen_max_tokens, gen_temperature, gen_top_p and allow_longer_generation "
                                         "are the defaults here); this command's own options override both")


# The record's fields --config does not set here: the base model is the adapter's, trust_remote_code and the
# agents' code only your own options (docs/security.md).
NOT_FROM_CONFIG = ("model_name_or_path", "trust_remote_code", *AGENT_OPTIONS)
# This command's options that set the recorded field of the same name.
FIELD_OPTIONS = ("backend", "max_lora_rank", "system_prompt", "gpu_memory_utilization")


@dataclass
class CommandValues:
    """Every recorded value a command that opens an adapter uses: the adapter's record < the fields --config sets <
    this command's own options; `sources` says where each came from."""

    values: dict[str, Any]
    sources: dict[str, str]

    def get(self, name: str, default: Any = None) -> Any:
        value = self.values.get(name)
        return default if value is None else value

    def source(self, name: str) -> str:
        """
        >>> CommandValues({"lr": 1}, {"lr": "--lr"}).source("lr"), CommandValues({}, {}).source("x")
        ('--lr', 'the default')
        """
        return self.sources.get(name, "the default")

    def fields(self) -> dict[str, Any]:
        """The values that are config fields (ours or TRL's), for from_mapping."""
        return {name: value for name, value in self.values.items()
                if name in field_names() or name in trl_option_names()}


def command_values(args: argparse.Namespace, manifest: Optional[dict[str, Any]],
                   adapter_rank: Optional[int] = None) -> CommandValues:
    """The one merge for generate, eval and export; `manifest`: the record found, or None. `adapter_rank`: the rank r
    of the adapter the command serves, its engine's max_lora_rank below --config and the flags (the record's is the
    training engine's limit, 64 by default: vLLM sizes its LoRA slots by it, memory and, on its CPU build, the work
    of every token, and one adapter of rank r needs no more than r)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def put(layer: dict[str, Any], said: Any) -> None:
        for name, value in layer.items():
            if value is not None:
                values[name] = value
                sources[name] = said(name) if callable(said) else said

    record = {**{k: (manifest or {}).get(k) for k in ("max_lora_rank", "max_completion_length")},
              **((manifest or {}).get("config") or {}), "system_prompt": (manifest or {}).get("system_prompt")}
    put(record, "the adapter's record")
    if adapter_rank is not None:
        put({"max_lora_rank": int(adapter_rank)}, "the adapter's rank (adapter_config.json r)")
    config = getattr(args, "config", None)
    if config:  # the fields the recipe sets, as validated
        parsed = validate_recipe(str(config)).to_dict()
        put({k: parsed.get(k, v) for k, v in read_recipe(str(config)).items() if k not in NOT_FROM_CONFIG},
            f"--config {config}")
    put({name: getattr(args, name, None) for name in FIELD_OPTIONS}, lambda name: f"--{name}")
    return CommandValues(values, sources)


def add_remote_code_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust_remote_code", action="store_true",
                        help="run the base model's own code (its modeling_*.py), if you trust it; never taken from "
                             "an adapter's, export's or run's files (docs/security.md)")


def remote_code(given: bool, manifest: Optional[dict[str, Any]], base_model: str) -> bool:
    """The user's own --trust_remote_code, never the adapter's; ConfigError for a local base with `auto_map`."""
    if given:
        return True
    recorded = bool(((manifest or {}).get("recorded") or {}).get("trust_remote_code"))
    config = Path(resolve_model_path(base_model)) / "config.json"
    try:
        needs = "auto_map" in json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        needs = False  # not a local folder: transformers says so itself if it needs code
    if needs:
        also = ", and the adapter records trust_remote_code: true" if recorded else ""
        raise ConfigError("trust_remote_code", f"the base model {excerpt(base_model)} runs its own code "
                          f"(config.json's auto_map){also}. A file's setting is never applied: pass "
                          "--trust_remote_code to run that code, if you trust where the model came from.")
    if recorded:
        print("note: the adapter records trust_remote_code: true; it is not applied from a file (pass "
              "--trust_remote_code to run a base model's own code).", file=sys.stderr)
    return False


def inference_args(**options: Any) -> argparse.Namespace:
    """`grpo generate`/`grpo eval`'s options as a Namespace, for calling them from Python.

    >>> inference_args(lora="outputs/run/lora").max_tokens is None
    True
    """
    parser = argparse.ArgumentParser()
    add_inference_arguments(parser)
    args = parser.parse_args(["--base"])  # defaults; --base is replaced below
    args.base = False
    for key, value in options.items():
        if not hasattr(args, key):
            raise TypeError(f"unknown inference option {excerpt(key)}")
        setattr(args, key, value)
    if not args.lora and not args.base:
        raise TypeError("pass lora=ADAPTER_DIR or base=True")
    return args


def generation_settings(args: argparse.Namespace) -> Any:
    """--config's GenerationArguments (or the defaults), with --max_tokens/--temperature/--top_p on top, checked.

    >>> gen = generation_settings(inference_args(base=True, temperature=0.7))
    >>> gen.gen_temperature, gen.gen_top_p, gen.gen_max_tokens
    (0.7, 1.0, None)
    """
    gen = validate_recipe(str(args.config)).generation if getattr(args, "config", None) else GenerationArguments()
    overrides = {"gen_max_tokens": args.max_tokens, "gen_temperature": args.temperature, "gen_top_p": args.top_p}
    gen = dataclasses.replace(gen, **{k: v for k, v in overrides.items() if v is not None})
    # refused before loading, not by vLLM's SamplingParams or transformers later
    if not 0.0 <= gen.gen_temperature <= 2.0:
        raise ConfigError("temperature", f"--temperature {gen.gen_temperature}: use a value in [0, 2] (0 = greedy).")
    check_generation_temperature(gen.gen_temperature, "temperature")
    if not 0.0 < gen.gen_top_p <= 1.0:
        raise ConfigError("top_p", f"--top_p {gen.gen_top_p}: use a value in (0, 1] (1 = no nucleus cut).")
    for flag, value in (("max_tokens", gen.gen_max_tokens), ("max_lora_rank", args.max_lora_rank)):
        if value is not None and value < 1:  # 0 would read as "not given" downstream
            raise ConfigError(flag, f"--{flag} {value}: use a positive number.")
    return gen


def validate_recipe(path: str) -> PipelineConfig:
    cfg = parse_config(["--config", path])
    validate(cfg)
    return cfg


def verify_trained_dir(path) -> Any:
    """The AdapterInfo of a saved LoRA adapter; AdapterError naming what is missing."""
    return verify_adapter_dir(absolute_path(path))


def open_inference(args: argparse.Namespace) -> InferenceSetup:
    """Verify paths and settings, then load the generator; bad input raises before anything loads."""
    return load_weights(resolve_inference(args))


def resolve_inference(args: argparse.Namespace) -> InferenceSetup:
    """Everything but the weights: the verified adapter, its record merged with --config and the flags, the backend
    chosen; `generator` and `tokenizer` are None until `load_weights`. A command that reads data of its own checks it
    between the two (`grpo eval`, with `data_tokenizer`), so bad data is refused before the model loads."""
    gen = generation_settings(args)
    adapter, manifest = _trained_with(args)
    given_values = command_values(args, manifest, adapter.r if adapter is not None else None)
    base_model = _base_model(args, adapter, manifest, given_values)
    max_tokens = _max_tokens(args, gen, manifest)
    # "" included: it trains (and so generates) without a system message
    system_prompt = given(given_values.values.get("system_prompt"), DEFAULT_SYSTEM_PROMPT)
    if given_values.source("system_prompt") == "the adapter's record" and (manifest or {}).get("system_prompt_note"):
        print(f"note: {manifest['system_prompt_note']}", file=sys.stderr)

    flat = given_values.fields()
    # the code the adapter's record names is not imported on its word (docs/security.md)
    recorded = from_mapping({name: flat.pop(name) for name in AGENT_OPTIONS if flat.get(name)})
    flat.update(model_name_or_path=base_model, max_lora_rank=given_values.get("max_lora_rank", 64),
                system_prompt=system_prompt,
                trust_remote_code=remote_code(getattr(args, "trust_remote_code", False), manifest, base_model))
    flat.update({key: getattr(args, key) for key in ("tools", "environment_factory")
                 if getattr(args, key, None) is not None})  # --tools / --environment_factory override the record
    cfg = from_mapping(flat)
    refuse_recorded_tools(recorded.grpo.tools, recorded.grpo.environment_factory, args)
    agents = resolve_agents(cfg.grpo) if agent_names(cfg.grpo) else Agents()  # a name that does not import: before loads
    note = rollout_func_note(recorded.grpo.rollout_func, "grpo generate / grpo eval")
    if note:
        print(f"[grpo] {note}", file=sys.stderr)
    vllm_mode = _servable(cfg.model.vllm_mode, adapter)
    cfg = cfg.replace(vllm_mode=vllm_mode) if vllm_mode != cfg.model.vllm_mode else cfg
    choice = choose_backend(args.backend, cfg.model.fast_inference)
    if not choice.fast_inference:
        cfg = cfg.replace(fast_inference=False)  # no vLLM here: Unsloth's transformers inference path
    return InferenceSetup(None, None, base_model, adapter, system_prompt, int(max_tokens),
                          gen.gen_temperature, gen.gen_top_p, cfg, manifest,
                          absolute_path(args.lora) if args.lora else None, agents,
                          loop_settings(cfg.trl, cfg.model.max_seq_length), choice.name)


def load_weights(setup: InferenceSetup) -> InferenceSetup:
    """`setup` with its generator: the base model (and the adapter) loaded by the chosen backend."""
    backend = load_backend(setup.backend)
    backend.prepare_environment(setup.config)  # idempotent
    generator = backend.load_generator(setup.base_model, setup.adapter, setup.config)
    return dataclasses.replace(setup, generator=generator, tokenizer=_as_trained(generator.tokenizer, setup.manifest))


def data_tokenizer(setup: InferenceSetup) -> Any:
    """The tokenizer the generator will use (the adapter folder's, else the base model's; the run's chat template),
    read alone: for checking a command's data before the weights load, as `grpo train` prepares its data."""
    return _as_trained(run_tokenizer(setup.adapter, setup.base_model, setup.config), setup.manifest)


def _as_trained(tokenizer: Any, manifest: Optional[dict[str, Any]]) -> Any:
    if manifest and manifest.get("chat_template"):
        tokenizer.chat_template = manifest["chat_template"]  # generate exactly as trained
    return tokenizer


def refuse_recorded_tools(tools: Any, environment_factory: Any, args: argparse.Namespace) -> None:
    """An adapter whose record names tools or environments answers through them only when you name them.

    >>> from argparse import Namespace
    >>> refuse_recorded_tools(["calc:add"], None, Namespace(tools=["calc:add"], environment_factory=None))
    """
    words = agent_options(tools, environment_factory)
    if not words or getattr(args, "tools", None) is not None or getattr(args, "environment_factory", None) is not None:
        return
    raise ConfigError("tools", f"the adapter was trained with tools or environments ({shell_command(*words)}, in "
                      "its grpo_adapter.json). A file you did not write does not decide what code runs here: name "
                      f"them yourself, `{shell_command(*words)}`, to answer through the tool loop as trained, or "
                      "`--tools` alone to answer in one turn without them.")


def _servable(vllm_mode: str, adapter: Any) -> str:
    """The run's vllm_mode, or "none" (said) for an adapter with modules trained in full (vLLM applies only LoRA).

    >>> from types import SimpleNamespace
    >>> _servable("colocate", SimpleNamespace(modules_to_save=None)), _servable("colocate", None)
    ('colocate', 'colocate')
    """
    modules = getattr(adapter, "modules_to_save", None) if adapter is not None else None
    if not modules or vllm_mode == "none":
        return vllm_mode
    print(f"note: the adapter trains modules in full ({', '.join(modules)}); vLLM applies only LoRA matrices and "
          f"would drop them, so this generates with transformers + peft, not vLLM (the run's vllm_mode: "
          f"{vllm_mode}).", file=sys.stderr)
    return "none"


def _trained_with(args: argparse.Namespace) -> tuple[Any, Optional[dict[str, Any]]]:
    """The verified adapter (--lora) and the manifest it was trained with (beside it, or --run's)."""
    adapter = manifest = None
    if args.lora:
        adapter = verify_trained_dir(args.lora)
        manifest = find_manifest(adapter.path)
        if manifest is None:
            folder = absolute_path(args.lora)
            if args.system_prompt is None:  # an empty --system_prompt "" is a choice, kept as given
                raise ConfigError("lora", f"{folder} has no {ADAPTER_METADATA_NAME} inside and no {MANIFEST_NAME} "
                                  "beside it, so the system prompt, chat template and max lengths it was trained "
                                  "with are unknown; the defaults would silently give wrong answers. Copy the run's "
                                  f"{MANIFEST_NAME} into {folder}, or pass --system_prompt TEXT (and --max_tokens "
                                  "N) to use it anyway.")
            print(f"warning: {folder} carries no training metadata; using --system_prompt as given and the "
                  "tokenizer's own chat template.", file=sys.stderr)
    elif args.run:
        run_dir = absolute_path(args.run)
        manifest = find_manifest(run_dir) or find_manifest(run_dir / "lora")
        if manifest is None:
            raise ConfigError("run", f"{run_dir}: no manifest.json there (expected output_dir/manifest.json of a "
                              "grpo run)")
    return adapter, manifest


def _base_model(args: argparse.Namespace, adapter: Any, manifest: Optional[dict[str, Any]],
                given_values: CommandValues) -> str:
    """The base model to load (--model, else the trained one), checked against the adapter and found."""
    trained_base = (manifest or {}).get("base_model") or (adapter.base_model_name_or_path if adapter else None)
    base_model = args.model or trained_base
    if base_model is None:
        raise ConfigError("base", "--base needs --model NAME or --run RUN_DIR to know which base model to load")
    if args.lora and args.model and trained_base and other_base(trained_base, args.model):  # names, not spellings
        raise ConfigError("model", f"{args.lora} was trained on {excerpt(trained_base)}, not {excerpt(args.model)}. "
                          "Drop --model (the manifest names the right base) or pass the adapter trained on that "
                          "model.")
    max_lora_rank = given_values.get("max_lora_rank", 64)
    uses_vllm = given_values.get("fast_inference", True)  # false: Unsloth without vLLM
    if adapter is not None and uses_vllm:
        check_adapter_rank(adapter.r, max_lora_rank, what=f"adapter {adapter.path}",
                           fix=f"(max_lora_rank from {given_values.source('max_lora_rank')}.) Pass --max_lora_rank "
                               f"{adapter.r}.")
    mismatch = adapter_mismatch(adapter, base_model) if adapter is not None else None
    if mismatch:
        raise ConfigError("lora", mismatch)
    # offline and not cached: say so now, not after a minute of hub retries
    model_check.check_model(base_model, given_values.get("model_source", "hf"))
    return base_model


def _max_tokens(args: argparse.Namespace, gen: Any, manifest: Optional[dict[str, Any]]) -> int:
    """--max_tokens, else the trained max_completion_length; more refused (gen_max_tokens) or warned (--max_tokens)."""
    trained_limit = (manifest or {}).get("max_completion_length")
    max_tokens = given(gen.gen_max_tokens, trained_limit, DEFAULT_MAX_TOKENS_WITHOUT_MANIFEST)
    if gen.gen_max_tokens and trained_limit and gen.gen_max_tokens > trained_limit and not gen.allow_longer_generation:
        if args.max_tokens is None:  # as validate() refuses it at train time
            raise ConfigError("gen_max_tokens", f"{gen.gen_max_tokens} exceeds the trained max_completion_length "
                              f"({trained_limit}); answers past the trained length are often cut before </answer>. "
                              "Lower it, or set allow_longer_generation: true.")
        warnings.warn(f"--max_tokens {args.max_tokens} is above the trained max_completion_length {trained_limit}: "
                      "the model never learned to finish its answer in that budget.", stacklevel=3)
    return max_tokens
