"""Live training health: an observer that measures every generation batch, and rules that stop or adjust the run.

`build_health(cfg, tokenizer)` builds both: the observer (metrics.py) and `HealthCallback`, which applies the rules
in `on_log`, where the logs hold TRL's loss, grad_norm and kl next to the health metrics: NaN/inf in loss, grad_norm
or kl always stops; the garbled rate (averaged over `garbled_window` logged steps), kl (beta > 0 only) and the
repetition rate above their thresholds, no learning signal (signal.py), reward hacking (training reward up while
held-out accuracy falls by more than chance, with eval_steps), stale rollouts (rollout.py) and no tool call
(tools.py) warn or stop (`<rule>_action`); `adaptive_beta` moves beta toward `kl_target` (GRPOTrainer reads
`self.beta` every step); with `on_collapse: rollback`, a NaN/inf or kl stop is a rollback.

A stop sets `control.should_save` and `should_training_stop`: transformers 5.17 runs on_log inside
`Trainer._maybe_log_save_evaluate` before that method checks `should_save`, so the failing step's checkpoint is
written, then the loop breaks. The reason is kept in `stop_reason` for summary.json. The driver (pipeline/trainer/
build.py) gives the observer weight 0.0, passes HEALTH_TRAINING_ARGS to GRPOConfig and calls `callback.attach(trainer)`.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from pathlib import Path
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from grpo_pipeline.pipeline.config import ConfigError, HealthArguments, PipelineConfig, check_choices
from grpo_pipeline.pipeline.health.metrics import finite_mean, incomplete_utf8_token_ids
from grpo_pipeline.pipeline.run.plots import as_number
from grpo_pipeline.pipeline.run.checkpoints import complete_checkpoints
from grpo_pipeline.pipeline.run.metric_names import BETA, EVAL_ACCURACY, EVAL_N, GARBLED_RATE, REPETITION_RATE
from grpo_pipeline.pipeline.health.metrics import HealthState, make_observer
from grpo_pipeline.pipeline.health.rollback import COLLAPSE_RULES
from grpo_pipeline.pipeline.health.rollout import RolloutProbe, StaleRollouts
from grpo_pipeline.pipeline.health.signal import FLAT_GROUP_SHARE, FlatRewards
from grpo_pipeline.pipeline.health.tools import NoToolCalls

logger = logging.getLogger(__name__)

# GRPOConfig kwargs the rules rely on: HF Trainer's default logging_nan_inf_filter=True replaces a NaN/inf step loss by
# the running mean before logging it, hiding the NaN the stop rule looks for.
HEALTH_TRAINING_ARGS: dict[str, Any] = {"logging_nan_inf_filter": False}

# Keys whose NaN/inf always stops the run: a NaN kl means NaN log-probabilities even when the clipped loss looks finite.
NON_FINITE_KEYS = ("loss", "grad_norm", "kl")

# Adaptive beta: a multiplicative controller with a dead band, like Ziegler et al.'s (2019) adaptive KL controller
# but step-wise; a factor of 1.5 moves beta 10x in about 6 logged steps.
BETA_STEP = 1.5


def next_beta(beta: float, kl: float, target: float, beta_min: float, beta_max: float,
              step: float = BETA_STEP) -> float:
    """One step of the adaptive-beta controller: beta x step when kl is above target x step, / step when below
    target / step (noise around the target does not make it oscillate), clipped to [beta_min, beta_max].

    >>> next_beta(0.04, kl=1.0, target=0.05, beta_min=0.001, beta_max=0.5)
    0.06
    >>> round(next_beta(0.04, kl=0.001, target=0.05, beta_min=0.001, beta_max=0.5), 4)
    0.0267
    >>> next_beta(0.04, kl=0.05, target=0.05, beta_min=0.001, beta_max=0.5)
    0.04
    >>> next_beta(0.45, kl=9.0, target=0.05, beta_min=0.001, beta_max=0.5)
    0.5
    """
    if kl > target * step:
        beta = beta * step
    elif kl < target / step:
        beta = beta / step
    return min(max(beta, beta_min), beta_max)


def accuracy_noise(first: float, last: float, n_first: float | None, n_last: float | None) -> float:
    """How far two held-out accuracies may differ by chance alone: two standard errors of the difference of two
    pooled proportions; unknown sizes allow nothing.

    >>> round(accuracy_noise(0.90, 0.89, 100, 100), 3), round(accuracy_noise(0.14, 0.02, 100, 100), 3)
    (0.087, 0.077)
    >>> accuracy_noise(0.9, 0.5, None, 100)
    0.0
    """
    if not n_first or not n_last:
        return 0.0
    pooled = (first * n_first + last * n_last) / (n_first + n_last)
    return 2.0 * math.sqrt(pooled * (1.0 - pooled) * (1.0 / n_first + 1.0 / n_last))


class RewardHacking:
    """The rule's memory: the training rewards logged since the last eval, and the last `window` evals."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._rewards_since_eval: list[float] = []
        self._evals: deque[tuple[int, float, float | None, float | None]] = deque(maxlen=window)

    def check(self, logs: dict[str, Any], step: int) -> str | None:
        """Why the policy may be gaming the rewards (the rule's warning or stop), or None."""
        reward = as_number(logs.get("reward"))
        if reward is not None and math.isfinite(reward):
            self._rewards_since_eval.append(reward)
        accuracy = as_number(logs.get(EVAL_ACCURACY))
        if accuracy is None:
            return None
        self._evals.append((step, accuracy, finite_mean(self._rewards_since_eval), as_number(logs.get(EVAL_N))))
        self._rewards_since_eval = []
        window = self.window
        if len(self._evals) < window or any(r is None for _, _, r, _ in self._evals):
            return None
        steps, accuracies, rewards, sizes = zip(*self._evals)
        falling = (accuracies[0] - accuracies[-1] > accuracy_noise(accuracies[0], accuracies[-1], sizes[0], sizes[-1])
                   and all(b <= a for a, b in zip(accuracies, accuracies[1:])))
        if rewards[-1] > rewards[0] and falling:
            return (f"the training reward rose ({' -> '.join(f'{r:.3g}' for r in rewards)}) while held-out "
                    f"accuracy fell ({' -> '.join(f'{a:.0%}' for a in accuracies)}) over the last {window} evals "
                    f"(steps {', '.join(map(str, steps))}): the policy may be gaming the rewards (reward "
                    "hacking). Look at its completions (log_completions: true) and tighten the rewards; "
                    "best_lora/ keeps the adapter of the best held-out accuracy")
        return None


class HealthCallback(TrainerCallback):
    """Stops or adjusts a GRPO run from its logged metrics (the module docstring lists the rules). After training:
    `stop_reason` (a sentence, or None), `stop_rule`, `stop_step`, `warnings`, and `summary()` for summary.json.

    >>> from transformers import TrainerControl, TrainerState
    >>> callback = HealthCallback(HealthArguments(), beta=0.0)
    >>> control = callback.on_log(None, TrainerState(global_step=7), TrainerControl(), logs={"loss": float("nan")})
    >>> control.should_training_stop, control.should_save
    (True, True)
    >>> print(callback.stop_reason.replace("; ", ";\\n"))
    Stopped at step 7: loss is nan (NaN/inf in loss, grad_norm or kl always stops the run;
    the checkpoint of this step is kept for inspection).
    """

    def __init__(self, settings: HealthArguments, beta: float, state: HealthState | None = None,
                 warn_every_steps: int = 20, temperature: float = 1.0, num_generations: int = 8,
                 rollbacks_left: int = 0):
        _check_settings(settings)
        self.settings = settings
        self.beta = float(beta)
        self.state = state if state is not None else HealthState()
        self.state.beta = self.beta
        self.warn_every_steps = max(1, int(warn_every_steps))
        self.trainer: Any = None
        self.stop_reason: str | None = None
        self.stop_rule: str | None = None
        self.stop_step: int | None = None
        self.warnings: list[str] = []
        self.beta_history: list[tuple[int, float]] = []
        self._garbled_window: deque[float] = deque(maxlen=settings.garbled_window)
        self.temperature, self.num_generations = float(temperature), int(num_generations)
        self.rollbacks_left = int(rollbacks_left)
        self.rollback_to: Path | None = None
        self._args: Any = None
        self._last_warned: dict[str, int] = {}
        s = settings
        flat = FlatRewards(s.flat_reward_window, s.flat_reward_threshold, self.temperature, self.num_generations)
        # each rule's check(logs, step) -> why it fires, or None; in order, until one stops the run
        self._detectors = [("garbled", s.garbled_action, self._garbled), ("kl", s.kl_action, self._kl),
                           ("repetition", s.repetition_action, self._repetition),
                           ("flat_reward", s.flat_reward_action, lambda logs, step: flat.check(logs)),
                           ("hacking", s.hacking_action, RewardHacking(s.hacking_window).check),
                           ("stale_rollout", s.stale_rollout_action, StaleRollouts().check),
                           ("no_tool_calls", "warn", NoToolCalls(s.first_tool_call_steps).check)]
        self.rollout_probe: RolloutProbe | None = None  # set by pipeline/trainer/build.py when an engine is separate

    def attach(self, trainer: Any) -> HealthCallback:
        """Give the callback the trainer whose `beta` it reads and (with adaptive_beta) sets."""
        if not hasattr(trainer, "beta"):
            raise TypeError(f"{type(trainer).__name__} has no `beta` attribute; attach a GRPOTrainer.")
        self.trainer = trainer
        self.beta = float(trainer.beta)
        self.state.beta = self.beta
        return self

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.settings.adaptive_beta and self.trainer is None:
            raise RuntimeError("adaptive_beta is on but the HealthCallback has no trainer: call "
                               "callback.attach(trainer) after building the GRPOTrainer.")
        if getattr(args, "logging_nan_inf_filter", False):  # as HEALTH_TRAINING_ARGS, for a driver that forgot it
            args.logging_nan_inf_filter = False
            logger.info("health: set logging_nan_inf_filter=False so NaN/inf losses reach the NaN stop rule")
        if self.rollout_probe is not None and self.trainer is not None:  # the starting weights, to recognise later
            self.rollout_probe.remember(self.trainer.model, int(state.global_step))
        return control

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs):
        logs = logs if logs is not None else {}
        # Health metrics TRL did not log (no log_metric in this trainer) come from the shared state.
        for name, value in self.state.flush().items():
            logs.setdefault(name, value)
        # on_log also fires for evaluation and the end-of-training summary, which carry none of the metrics read here
        training = ("loss", "grad_norm", "kl", GARBLED_RATE, REPETITION_RATE, FLAT_GROUP_SHARE)
        if self.stop_reason is not None or not any(key in logs for key in training):
            return control
        step = int(state.global_step)
        self._args = args  # where checkpoints are (output_dir) and how many steps a log covers, for a rollback
        self._check_non_finite(logs, step, control)
        # The probe sends the adapter to the engine as the rollouts do; TRL merges it into the base weights and out
        # again (VLLMGeneration._iter_named_params), so a NaN adapter would leave NaN in the base weights for good,
        # and a rollback would go on from a broken model. After a non-finite step, nothing is sent.
        if (self.stop_reason is None and self.rollout_probe is not None and self.trainer is not None
                and self.rollout_probe.due(step)):
            logs.update(self.rollout_probe.measure(self.trainer.model, step))
        for rule, action, check in self._detectors:
            detail = check(logs, step) if self.stop_reason is None else None
            if detail:
                self._act(rule, action, step, control, detail)
        if self.stop_reason is None and self.settings.adaptive_beta:
            self._adapt_beta(logs, step)
        if self.current_beta() > 0:
            logs.setdefault(BETA, self.current_beta())
        return control

    def _check_non_finite(self, logs: dict[str, Any], step: int, control: TrainerControl) -> None:
        for key in NON_FINITE_KEYS:
            value = as_number(logs.get(key))
            if value is not None and not math.isfinite(value):
                self._stop("non_finite", step, control,
                           f"{key} is {value} (NaN/inf in loss, grad_norm or kl always stops the run; "
                           "the checkpoint of this step is kept for inspection)")
                return

    def _garbled(self, logs: dict[str, Any], step: int) -> str | None:
        rate = as_number(logs.get(GARBLED_RATE))
        if rate is None:
            return None
        self._garbled_window.append(rate)
        window, threshold = self.settings.garbled_window, self.settings.garbled_threshold
        mean = sum(self._garbled_window) / window
        if len(self._garbled_window) < window or not mean > threshold:
            return None
        return (f"garbled completions averaged {mean:.3f} over the last {window} logged steps, above "
                f"garbled_threshold {threshold} (U+FFFD, control or zero-width characters in the output; lower "
                "learning_rate, or raise beta)")

    def _kl(self, logs: dict[str, Any], step: int) -> str | None:
        kl = as_number(logs.get("kl"))
        if kl is None or self.current_beta() <= 0 or not kl > self.settings.kl_ceiling:
            return None
        return (f"kl {kl:.4g} is above kl_ceiling {self.settings.kl_ceiling} at beta {self.current_beta():.4g} (the "
                "policy is running away from the reference model; raise beta, turn on adaptive_beta, or lower "
                "learning_rate)")

    def _repetition(self, logs: dict[str, Any], step: int) -> str | None:
        rate = as_number(logs.get(REPETITION_RATE))
        if rate is None or not rate > self.settings.repetition_threshold:
            return None
        return (f"repetition rate {rate:.3f} is above repetition_threshold {self.settings.repetition_threshold} "
                "(completions are looping over the same token 4-grams)")

    def _adapt_beta(self, logs: dict[str, Any], step: int) -> None:
        kl = as_number(logs.get("kl"))
        if kl is None or not math.isfinite(kl):
            return
        h = self.settings
        new = next_beta(self.current_beta(), kl, h.kl_target, h.beta_min, h.beta_max)
        if new != self.current_beta():
            self.set_beta(new)
            self.beta_history.append((step, new))
        logs[BETA] = new

    def current_beta(self) -> float:
        """The beta the trainer uses now (the attached trainer's, else the last one set)."""
        return float(self.trainer.beta) if self.trainer is not None else self.beta

    def set_beta(self, beta: float) -> None:
        self.beta = float(beta)
        self.state.beta = self.beta
        if self.trainer is not None:
            self.trainer.beta = self.beta

    def summary(self) -> dict[str, Any]:
        """What the training driver writes into summary.json."""
        return {"stop_reason": self.stop_reason, "stop_rule": self.stop_rule, "stop_step": self.stop_step,
                "warnings": list(self.warnings), "final_beta": self.current_beta(),
                "beta_changes": [list(change) for change in self.beta_history]}

    def _act(self, rule: str, action: str, step: int, control: TrainerControl, detail: str) -> None:
        if action == "stop":
            self._stop(rule, step, control, f"{detail}; set {rule}_action: warn to only warn")
        else:
            self._warn(rule, step, detail)

    def _stop(self, rule: str, step: int, control: TrainerControl, detail: str) -> None:
        if rule in COLLAPSE_RULES and self.settings.on_collapse == "rollback" and self.rollbacks_left > 0:
            checkpoint = self._checkpoint_before(step)
            if checkpoint is not None:
                self.rollback_to, self.stop_rule, self.stop_step = checkpoint, rule, step
                headline = detail.split(" (", 1)[0]  # what happened, without the stop's own advice
                self.stop_reason = f"Collapse at step {step}: {headline}; rolling back to {checkpoint.name}."
                control.should_training_stop = True
                control.should_save = False  # not even a save_steps one: the broken state must not become the newest
                logger.error("health: %s", self.stop_reason)
                return
            detail += "; no checkpoint from before this step to roll back to"
        self.stop_rule = rule
        self.stop_step = step
        self.stop_reason = f"Stopped at step {step}: {detail}."
        control.should_save = True
        control.should_training_stop = True
        logger.error("health: %s", self.stop_reason)

    def _checkpoint_before(self, step: int) -> Path | None:
        """The newest healthy checkpoint whose weights the failing log did not measure: a log at step s over
        L = logging_steps steps measured the weights after steps s-L .. s-1 (each step's loss and kl use the weights
        before its update), so checkpoint-(s-L) would fail again; the rollback goes below s-L."""
        if self._args is None or not getattr(self._args, "output_dir", None):
            return None
        first_measured = step - max(1, int(getattr(self._args, "logging_steps", 1) or 1))
        candidates = complete_checkpoints(self._args.output_dir, below_step=first_measured)  # oldest first
        return candidates[-1] if candidates else None

    def _warn(self, rule: str, step: int, detail: str) -> None:
        last = self._last_warned.get(rule)
        if last is not None and step - last < self.warn_every_steps:
            return
        self._last_warned[rule] = step
        message = f"step {step}: {detail}"
        self.warnings.append(message)
        logger.warning("health warning: %s (repeats silenced for %d steps)", message, self.warn_every_steps)


def build_health(cfg: PipelineConfig, tokenizer: Any,
                 rollbacks_done: int = 0) -> tuple[Callable[..., list[float]], HealthCallback]:
    """The observer reward function and the callback for one run of `cfg`, sharing one HealthState.
    `rollbacks_done`: rollbacks this run already made (of max_rollbacks). Derives the tokenizer's incomplete-UTF-8
    token set once (about 0.7 s for Qwen2.5).

    >>> from grpo_pipeline.pipeline.config import PipelineConfig
    >>> from grpo_pipeline.pipeline.assets import load_qwen_tokenizer
    >>> observer, callback = build_health(PipelineConfig(), load_qwen_tokenizer())
    >>> observer.__name__, callback.stop_reason
    ('health', None)
    """
    state, h, g = HealthState(), cfg.health, cfg.grpo
    observer = make_observer(state, incomplete_utf8_token_ids(tokenizer), tokenizer,
                             cfg.trl.get("max_tool_calling_iterations"))
    callback = HealthCallback(h, beta=g.beta, state=state, temperature=g.temperature,
                              num_generations=g.num_generations,
                              rollbacks_left=(h.max_rollbacks - rollbacks_done if h.on_collapse == "rollback" else 0))
    return observer, callback


def _check_settings(h: HealthArguments) -> None:
    check_choices(h)  # garbled_action, repetition_action, kl_action, flat_reward_action, hacking_action, on_collapse
    for name in ("garbled_window", "flat_reward_window", "hacking_window"):
        if getattr(h, name) < 1:
            raise ConfigError(name, f"got {getattr(h, name)}; use a positive number of logged steps.")
