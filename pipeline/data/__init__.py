"""Data: load a source, clean it, render and length-check the prompts, cache the prepared set."""
