"""Load the tokenizer a config names, without loading any model (used by `grpo data` and training)."""

from __future__ import annotations

# Names that resolve to tokenizers the project ships, so tests, demos and benches run offline.
DEMO_MODEL_NAME = "tiny-demo"
BUNDLED_QWEN_NAME = "bundled:qwen2.5"


def load_tokenizer(model_name_or_path: str, trust_remote_code: bool = False):
    """Return the tokenizer for `model_name_or_path`, padded on the left as GRPO generation needs."""
    if model_name_or_path == DEMO_MODEL_NAME:
        from pipeline.demo import build_demo_tokenizer

        return build_demo_tokenizer()
    if model_name_or_path == BUNDLED_QWEN_NAME:
        from pipeline.assets import load_qwen_tokenizer

        tokenizer = load_qwen_tokenizer()
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
