"""Environment support: the known-good version matrix, the `grpo env` doctor, import-order checks and path helpers.

Modules (each has one job, and none imports torch, transformers, trl, peft, unsloth or vllm at import time):

- `grpo_pipeline.env.matrix`  loads `env/known_good.toml` (pins, known-bad combinations, platform profiles) and the versions in
                each install set's lock file (`env/pylock.plain.toml`, `env/pylock.gpu.toml`: PEP 751, made by uv).
- `grpo_pipeline.env.probes`  reads facts about this machine: Python, OS, installed versions, GPU.
- `grpo_pipeline.env.report`  assembles the `grpo env` report (packages vs the matrix, GPU, known-bad, training modes).
- `grpo_pipeline.env.doctor`  prints that report and sets the exit status (`grpo env`).
- `grpo_pipeline.env.imports` checks that unsloth was imported before trl/transformers/peft.
- `grpo_pipeline.env.paths`   absolute paths, atomic directory and file writes, first-complete-copy-wins caches.
- `grpo_pipeline.env.adapters` checks that a folder holds a usable LoRA adapter (config and weights, from the files).
- `grpo_pipeline.env.disk`    recognises a full disk while saving and says how much room a save needs.
"""
