"""The built-in CPU demo as data: a registry of built-in models and sources, the tiny models, the arithmetic task."""
