"""The built-in CPU demo: a tiny offline Qwen2 model and its arithmetic task."""
