"""The names of the measures a run logs, as they appear in TRL's logs, metrics.jsonl, tensorboard and wandb.

Their own module, below everything that reads or writes them: pipeline/health/ computes the measures, run/plots.py
draws them from metrics.jsonl and infer/periodic_eval.py logs the held-out ones. Plain strings, no imports.
"""

# Name of the observer reward function; TRL logs it as rewards/health/mean (always 0.0).
# Here so plots.py can skip that flat line without importing transformers.
OBSERVER_NAME = "health"

# Metric names, as they appear in TRL's logs, metrics.jsonl, tensorboard and wandb.
GARBLED_RATE = "health/garbled_rate"
INCOMPLETE_UTF8_SHARE = "health/incomplete_utf8_share"
REPETITION_RATE = "health/repetition_rate"
COMPLETION_LENGTH = "health/completion_length"
NO_ANSWER_RATE = "health/no_answer_rate"
BETA = "health/beta"
# The rollout probe (pipeline/health/rollout.py): the engine-versus-trainer log-prob gap on a fixed text, and the
# step whose weights the engine holds.
ROLLOUT_LOGP_GAP = "health/rollout_logp_gap"
ROLLOUT_WEIGHTS_STEP = "health/rollout_weights_step"
# Held-out evaluation during training (eval_steps; pipeline/infer/periodic_eval.py), read by the plots and
# the reward-hacking rule.
EVAL_ACCURACY = "eval/accuracy"
EVAL_FORMAT_RATE = "eval/format_rate"
EVAL_N = "eval/n"  # problems the accuracy is over: its sampling noise, for the reward-hacking rule
