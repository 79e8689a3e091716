"""A run's folder: its lock, checkpoints (and their integrity), the metrics log, the summary and manifest, and
the plots."""
