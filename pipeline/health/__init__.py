"""Run health: per-batch metrics of the completions (metrics), the reward-function observer that measures
each batch (observer), and the rules that warn, stop or adjust beta (rules)."""
