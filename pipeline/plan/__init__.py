"""`grpo plan`: will this recipe fit my GPU, and what should I change? Answered before anything loads: shape.py
(the model), cards.py (the GPU), estimate.py (the peak, part by part), fit.py (the changes), command.py.
"""
