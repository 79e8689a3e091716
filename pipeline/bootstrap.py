"""Process start-up, run by `grpo` (pipeline/cli.py) before any sub-command module is imported: the one home of
"import Unsloth before trl, transformers and peft" (it patches them, reading UNSLOTH_VLLM_STANDBY, on import). It
decides the backend without torch and calls its `prepare_environment` with the settings read cheaply from the
command line, the --config recipe or the run's manifest. `--help`, `grpo env` and `grpo train --check` load none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.locations import absolute_path
from grpo_pipeline.pipeline.backends import BackendChoice, choose_backend, cuda_available, load_backend
from grpo_pipeline.pipeline.config import ConfigError, from_mapping, peek_option
from grpo_pipeline.pipeline.demo.registry import builtin_model, cpu_demo_config
from grpo_pipeline.pipeline.run.manifest import ManifestError, find_manifest

# `grpo train` on a GPU without --config trains this recipe (defaults_for).
DEFAULT_GPU_RECIPE = Path(__file__).resolve().parent.parent / "configs" / "qwen2.5-1.5b-gsm8k.yaml"

# Sub-commands that load a model through a backend; `env` and `data` (tokenizer only) need none.
MODEL_COMMANDS = ("train", "rewards", "generate", "eval", "export")
# Sub-commands that load the model a training recipe names (not a trained run's).
RECIPE_COMMANDS = ("train", "rewards")


def bootstrap(command: str, argv: list[str]) -> Optional[BackendChoice]:
    """Prepare the backend `command` will use (Unsloth: set the environment, `import unsloth`); the choice, or None
    when it loads none or its options resolve none (the command names the bad option then)."""
    if command not in MODEL_COMMANDS or {"-h", "--help"} & set(argv) or (command == "train" and "--check" in argv):
        return None
    try:
        choice, settings = _early_settings(command, argv)
        early = from_mapping(settings)
    except ConfigError:
        return None
    backend = load_backend(choice.name)
    if command in RECIPE_COMMANDS:
        backend.refuse_before_training(early)  # e.g. Unsloth: vLLM's sleep mode, which its rollouts would trip
    backend.prepare_environment(early)
    return choice


def _early_settings(command: str, argv: list[str]) -> tuple[BackendChoice, dict[str, Any]]:
    """The backend and the settings `import unsloth` depends on, as the command will resolve them later."""
    if command in RECIPE_COMMANDS:
        choice = backend_choice(argv)
        if load_backend(choice.name).GPU_ONLY:
            argv = defaults_for(argv, choice)[0]  # the recipe the run will read
        return choice, {"vllm_standby": peek_option(argv, "vllm_standby", "auto"),
                        "fast_inference": choice.fast_inference,
                        "model_source": peek_option(argv, "model_source", "hf")}
    trained = _trained_config(argv)  # generate / eval / export load a trained run with its own settings
    fast_inference = _truthy(trained.get("fast_inference", True))
    # Merging (export) needs Unsloth, never vLLM; standby follows the run's config as infer/export.py's does.
    choice = choose_backend(str(peek_option(argv, "backend", "auto")), fast_inference and command != "export")
    return choice, {"vllm_standby": trained.get("vllm_standby", "auto"),
                    "fast_inference": fast_inference if command == "export" else choice.fast_inference,
                    "model_source": trained.get("model_source", "hf")}


def _trained_config(argv: list[str]) -> dict[str, Any]:
    """The `config` of the manifest `--lora` / `--run` point at; {} when none is readable (the command says so)."""
    lora, run = peek_option(argv, "lora"), peek_option(argv, "run")
    try:
        if lora:
            manifest = find_manifest(absolute_path(lora))
        elif run:
            manifest = find_manifest(absolute_path(run)) or find_manifest(absolute_path(run) / "lora")
        else:
            manifest = None
    except (ManifestError, OSError, ValueError):  # a bad path: the command's own path check names it
        manifest = None
    return dict((manifest or {}).get("config") or {})


def defaults_for(argv: list[str], choice: BackendChoice) -> tuple[list[str], Optional[dict[str, Any]], str]:
    """The defaults of a run without --config, the GPU recipe on a GPU, the tiny CPU demo elsewhere, as (argv,
    base defaults for parse_config, a line saying which)."""
    base: dict[str, Any] = {}
    note = ""
    if "--config" not in argv:
        if load_backend(choice.name).GPU_ONLY or cuda_available():
            argv, note = ["--config", str(DEFAULT_GPU_RECIPE), *argv], f"no --config: using {DEFAULT_GPU_RECIPE}"
        else:
            base = cpu_demo_config()
            note = "no GPU and no --config: running the built-in tiny CPU demo (a few minutes)"
    # A built-in model's own defaults (e.g. tiny-qwen2.5's short completions), below the recipe and the options.
    model = builtin_model(str(peek_option(argv, "model_name_or_path", base.get("model_name_or_path", ""))))
    base.update(model.defaults if model else {})
    return argv, base or None, note


def backend_choice(argv: list[str]) -> BackendChoice:
    """The backend a training config's options (command line, --config recipe) ask for, without TrlParser or torch."""
    fast_inference = _truthy(peek_option(argv, "fast_inference", True)) and not (
        {"--no_fast_inference", "--no-fast-inference"} & set(argv))
    return choose_backend(str(peek_option(argv, "backend", "auto")), fast_inference)


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() not in ("false", "0", "no")
