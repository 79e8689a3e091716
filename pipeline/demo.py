"""Built-in CPU demo: a character-level tokenizer, a tiny deterministic Qwen2 and arithmetic problems."""
