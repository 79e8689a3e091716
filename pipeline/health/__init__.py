"""Run health: per-batch metrics of the completions (metrics) and the rules that warn or stop (rules)."""
