"""Data: load a source, clean it, render and length-check the prompts, cache the prepared set, and report it
(`grpo data`); the tokenizer loader lives here too, since the data path is the first to need it."""
