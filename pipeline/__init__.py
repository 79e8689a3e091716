"""GRPO fine-tuning pipeline for Qwen2.5: config -> env check -> data -> model -> trainer -> save -> generate/eval.

Heavy imports (torch, transformers, trl, unsloth, vllm) stay inside the functions that
need them, so `grpo --help` and `grpo env` start fast.
"""

__version__ = "0.1.0"
