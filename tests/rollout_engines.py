"""CPU rollout engines for the rollout-freshness tests and bench/rollout_probe.py (not a test module).

Plugged into the plain backend (pipeline/backends/plain.py plugged_rollout_engine), each stands in for vLLM: a
separate copy of the model the rollout probe scores (pipeline/health/rollout.py).
"""

from __future__ import annotations

from pipeline.health.rollout import has_dropout, trainer_logprobs


class FollowingEngine:
    """A separate CPU model (the base loaded again, with the run's LoRA) sent the trainer's adapter tensors before
    it scores, as vLLM is sent them before each rollout (Unsloth: load_lora(..., load_tensors=True))."""

    def __init__(self, trainer, cfg):
        from peft import get_peft_model

        from pipeline.backends import plain

        self.trainer = trainer
        self.model = get_peft_model(plain.load_model(cfg.model.model_name_or_path, cfg, for_training=False),
                                    plain.peft_config(cfg))
        self.dropout = has_dropout(self.model)
        self.receive()

    def receive(self):
        import torch

        if not hasattr(self, "_pairs"):  # the trainable (adapter) tensors of both copies, matched by name once
            ours = dict(self.model.named_parameters())
            self._pairs = [(ours[name], param) for name, param in self.trainer.model.named_parameters()
                           if param.requires_grad]
        with torch.no_grad():
            for mine, theirs in self._pairs:
                mine.copy_(theirs)

    def score(self, prompt_ids, continuation_ids):
        self.receive()
        return trainer_logprobs(self.model, prompt_ids, continuation_ids, dropout=self.dropout)


class FrozenEngine(FollowingEngine):
    """Ignores every weight update: it keeps the adapter it had when the trainer was built."""

    def score(self, prompt_ids, continuation_ids):
        return trainer_logprobs(self.model, prompt_ids, continuation_ids, dropout=self.dropout)
