"""Environment support, below everything else: the known-good version matrix and `grpo env`, the machine's facts,
import order, paths and crash-safe writes, adapters on disk, storage failures and secrets (docs/layout.md lists the
modules). None imports torch, transformers, trl, peft, unsloth or vllm at import time.
"""
