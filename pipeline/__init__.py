"""GRPO fine-tuning pipeline for Qwen2.5: config -> env check -> data -> model -> trainer -> save -> generate/eval.
Heavy imports (torch, transformers, trl, unsloth, vllm) stay inside functions, so `grpo --help` starts fast.
"""

__version__ = "0.1.0"
