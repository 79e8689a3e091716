"""`grpo export`: a LoRA merged into its base model (16-bit or 4-bit), or GGUF (Unsloth only).

    grpo export --lora outputs/run/lora --to merged16 --out exported/merged16
    grpo export --lora outputs/run/lora --to gguf --out exported/gguf      # unsloth backend

The export is written into a temporary sibling folder and renamed into place, so a crash never
leaves a half-written model under the final name.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from pipeline.backends import EXPORT_METHODS


def main(argv: Optional[list[str]] = None) -> int:
    from pipeline.config import field_choices

    parser = argparse.ArgumentParser(prog="grpo export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lora", required=True, help="adapter folder (e.g. outputs/run/lora)")
    parser.add_argument("--to", required=True, choices=EXPORT_METHODS)
    parser.add_argument("--out", required=True, help="output folder (must not exist, or use --overwrite)")
    parser.add_argument("--backend", default="auto", choices=field_choices("backend"))
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    args = parser.parse_args(argv)

    from env.adapters import AdapterError
    from env.disk import StorageError, storage_errors_named
    from env.paths import absolute_path, atomic_directory
    from pipeline.backends import choose_backend, load_backend
    from pipeline.config import ConfigError, from_mapping
    from pipeline.infer.session import adapter_mismatch, verify_trained_dir
    from pipeline.run.manifest import ManifestError, find_manifest

    try:
        adapter = verify_trained_dir(args.lora)
    except AdapterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = absolute_path(args.out)
    if out.exists() and not args.overwrite:
        print(f"error: --out {out} already exists; choose a new folder or pass --overwrite", file=sys.stderr)
        return 2
    try:
        manifest = find_manifest(adapter.path) or {}
    except ManifestError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    base_model = manifest.get("base_model") or adapter.base_model_name_or_path
    mismatch = adapter_mismatch(adapter, base_model)
    if mismatch:
        print(f"error: {mismatch}", file=sys.stderr)
        return 2
    from pipeline.preflight import check_model

    try:
        check_model(base_model, (manifest.get("config") or {}).get("model_source", "hf"))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    cfg = from_mapping({**(manifest.get("config") or {}), "model_name_or_path": base_model,
                        "backend": args.backend})
    try:
        choice = choose_backend(args.backend, fast_inference=False)  # merging needs Unsloth, never vLLM
        if args.to == "gguf" and choice.name != "unsloth":
            raise ConfigError("to", "GGUF export is Unsloth-only (save_pretrained_gguf builds llama.cpp). On this "
                              "machine export --to merged16 and convert it with llama.cpp's convert_hf_to_gguf.py.")
        backend = load_backend(choice.name)
        backend.prepare_environment(cfg)  # done at start-up by `grpo` (pipeline/bootstrap.py); idempotent
        out.parent.mkdir(parents=True, exist_ok=True)
        with storage_errors_named(out.parent, "run the same export again."), atomic_directory(out) as staging:
            backend.export(adapter, base_model, args.to, staging, cfg)
    except (ConfigError, StorageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported {adapter.path} ({args.to}, base {base_model}) to {out}")
    return 0
