"""`grpo plan`: will this recipe fit my GPU, and what should I change? Answered before anything loads.

shape.py reads the model's config.json (local, hub cache, or bundled Qwen2.5) and counts the real architecture's
parameters on the meta device; cards.py knows GPUs by name; estimate.py turns recipe + shape + card into the
peak memory, part by part; fit.py finds the smallest change of each knob that fits; command.py is the command
(and the recipe x card table of docs/gpu.md).
"""
