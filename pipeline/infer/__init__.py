"""Inference with a trained adapter: one verified loading session, and generate, evaluate and export on it."""
