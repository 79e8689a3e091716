"""A run's folder: checkpoints, the metrics log, the summary and manifest, and the plots."""
