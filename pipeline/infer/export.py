"""`grpo export`: a LoRA merged into its base model (16-bit or 4-bit), or GGUF (Unsloth only).

    grpo export --lora outputs/run/lora --to merged16 --out exported/merged16
    grpo export --lora outputs/run/lora --to gguf --out exported/gguf      # unsloth backend

Written into a temporary sibling folder and renamed into place; its chat template defaults to the trained system
prompt, and it carries the adapter's `grpo_adapter.json`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Optional

from grpo_pipeline.env.disk import storage_errors_named
from grpo_pipeline.env.locations import snapshot
from grpo_pipeline.env.path_check import EXPORT_MARKER, check_command_paths, local_model
from grpo_pipeline.env.paths import atomic_directory, atomic_write_json, shell_command
from grpo_pipeline.pipeline.backends import EXPORT_METHODS, choose_backend, load_backend
from grpo_pipeline.pipeline.config import ConfigError, field_choices, from_mapping
from grpo_pipeline.pipeline.data import model_check
from grpo_pipeline.pipeline.data.tokenizer import load_tokenizer, resolve_model_path
from grpo_pipeline.pipeline.errors import guarded, note_command_options

# Through the module, looked up at the call: tests stand in for adapter_mismatch there (it may ask the hub).
from grpo_pipeline.pipeline.infer import session
from grpo_pipeline.pipeline.infer.session import verify_trained_dir
from grpo_pipeline.pipeline.run.manifest import find_manifest, recorded_base, write_adapter_metadata
from grpo_pipeline.pipeline.trainer.agents import agent_names


@guarded("export")
def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="grpo export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lora", required=True, help="adapter folder (e.g. outputs/run/lora)")
    parser.add_argument("--to", required=True, choices=EXPORT_METHODS)
    parser.add_argument("--out", required=True, help="output folder (must not exist, or use --overwrite)")
    parser.add_argument("--backend", default="auto", choices=field_choices("backend"))
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out folder (kept until the new export is complete)")
    session.add_config_argument(parser)
    session.add_remote_code_argument(parser)
    parser.add_argument("--system_prompt", "--system", default=None,
                        help="the chat template's default system message (default: the one the adapter records, "
                             "the system message its training rows carried)")
    args = parser.parse_args(argv)
    note_command_options(parser)

    check_command_paths("export", vars(args), only=["lora"])
    adapter = verify_trained_dir(args.lora)
    manifest = find_manifest(adapter.path) or {}
    base_model = manifest.get("base_model") or adapter.base_model_name_or_path
    base_folder = resolve_model_path(base_model)
    reads = {"the base model": base_folder} if local_model(base_folder) else {}
    out = check_command_paths("export", vars(args), overwrite=args.overwrite, extra_reads=reads)["out"]
    seen = snapshot(out, option="--out", fix="Pass --overwrite to replace it, or choose another --out.")
    mismatch = session.adapter_mismatch(adapter, base_model)
    if mismatch:
        raise ConfigError("lora", mismatch)
    given_values = session.command_values(args, manifest)
    model_check.check_model(base_model, given_values.get("model_source", "hf"))
    cfg = from_mapping({**given_values.fields(), "model_name_or_path": base_model,
                        "trust_remote_code": session.remote_code(args.trust_remote_code, manifest, base_model)})
    choice = choose_backend(args.backend, fast_inference=False)  # merging needs Unsloth, never vLLM
    backend = load_backend(choice.name)
    if args.to not in backend.EXPORT_METHODS:
        raise ConfigError("to", "GGUF export is Unsloth-only (save_pretrained_gguf builds llama.cpp). On this "
                          "machine export --to merged16 and convert it with llama.cpp's convert_hf_to_gguf.py.")
    backend.prepare_environment(cfg)  # idempotent
    with storage_errors_named(out, "run the same export again.", option="--out"), \
            atomic_directory(out, seen=seen) as staging:
        system_prompt = given_values.values.get("system_prompt")  # --system_prompt, --config's, else the record's
        backend.export(adapter, base_model, args.to, staging, cfg, system_prompt=system_prompt)
        check_tool_support(staging, agent_names(cfg.grpo), args.to,
                           trust_remote_code=cfg.model.trust_remote_code)
        carry_training_defaults(staging, manifest)
        atomic_write_json(staging / EXPORT_MARKER, {"adapter": str(adapter.path), "to": args.to,
                                                    "base_model": recorded_base(base_model)})
    print(f"exported {shell_command(adapter.path)} ({args.to}, base {base_model}) to {shell_command(out)}")
    return 0


def check_tool_support(folder: Path, names: dict[str, Any], method: str, trust_remote_code: bool = False) -> None:
    """RuntimeError (unpublished) when an export of a tools-trained adapter lost a template that renders tools."""
    if method == "gguf" or not (names.get("tools") or names.get("environment_factory")):
        return  # a .gguf carries its template in its metadata, read by llama.cpp, not by transformers
    from trl.chat_template_utils import supports_tool_calling

    tokenizer = load_tokenizer(str(folder), trust_remote_code, "hf")
    probe = {"type": "function", "function": {"name": "probe_tool", "description": "A probe.",
                                              "parameters": {"type": "object", "properties": {}}}}
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "?"}], tools=[probe], tokenize=False)
    if not supports_tool_calling(tokenizer) or "probe_tool" not in rendered:
        raise RuntimeError(f"the exported chat template in {folder} no longer renders tools ({names}); the export "
                           "is not published. Report this with the adapter's grpo_adapter.json.")


def carry_training_defaults(folder: Path, manifest: dict[str, Any]) -> None:
    if manifest:  # an adapter without metadata has nothing to carry
        write_adapter_metadata(folder, manifest)
