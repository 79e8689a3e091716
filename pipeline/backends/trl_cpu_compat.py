"""Let TRL 1.15's GRPOTrainer run where torch has no Triton (CPU-only torch builds).

Why this exists: TRL 1.15 computes per-token log-probabilities only through a Triton kernel
(`trl.kernels.ChunkedLogProbFunction`). CPU wheels of torch ship no Triton, so `trl.trainer.utils`
sets its module-level `_ChunkedLogProbFunction = None` when that import fails, and the first GRPO step
dies in the patched forward that `add_fused_lm_head` installs ('NoneType' object has no attribute 'apply').
TRL 1.16 added a pure-torch path for exactly this; we cannot pin 1.16 because unsloth 2026.10.9
caps trl<=1.15.0, and the CPU tests must exercise the TRL that GPU users run. So we backport the
fallback: same signature, same five outputs, plain torch ops (autograd does the backward).

It is installed only when TRL has no kernel. CUDA wheels of torch ship Triton, so on a GPU TRL's
own kernel runs untouched.
"""

from __future__ import annotations

OPTIONAL_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
TOKENS_PER_CHUNK = 1024  # bounds the [tokens, vocab] logits held at once (151k vocab x 1024 x 4 B = 0.6 GB)


class TorchChunkedLogProb:
    """Drop-in for `trl.kernels.ChunkedLogProbFunction` (TRL 1.15 signature) in plain torch."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
              logit_scale=1.0, outputs=OPTIONAL_OUTPUTS):
        # lazy: torch loads only once a model is needed
        import torch
        import torch.nn.functional as F

        del chunk_size  # the vocabulary is not tiled here; tokens are
        pieces: dict[str, list] = {"log_probs": [], **{name: [] for name in OPTIONAL_OUTPUTS}}
        for start in range(0, hidden.shape[0], TOKENS_PER_CHUNK):
            h = hidden[start:start + TOKENS_PER_CHUNK]
            t = targets[start:start + TOKENS_PER_CHUNK]
            # Same transform order as TRL's kernel: scale, soft-cap, then temperature; in fp32.
            z = F.linear(h.float(), weight.float(), None if bias is None else bias.float())
            # Each transform is a full [tokens, vocab] pass (151k wide on Qwen): skip the ones that are
            # identities (scale and temperature 1.0, GRPO's usual case); x * 1.0 and x / 1.0 are exact in
            # fp32, so the skipped path gives the same numbers.
            if logit_scale != 1.0:
                z = z * logit_scale
            if final_logit_softcapping is not None:
                z = final_logit_softcapping * torch.tanh(z / final_logit_softcapping)
            if temperature != 1.0:
                z = z / temperature
            log_p = torch.log_softmax(z, dim=-1)
            pieces["log_probs"].append(log_p.gather(-1, t.unsqueeze(-1)).squeeze(-1))
            if "entropy" in outputs:
                pieces["entropy"].append(-(log_p.exp() * log_p).sum(-1))
            if "log_sum_sq_probs" in outputs:
                pieces["log_sum_sq_probs"].append(torch.logsumexp(2 * log_p, dim=-1).detach())
            if "mean_logits" in outputs:
                pieces["mean_logits"].append(z.mean(-1).detach())
            if "is_top1" in outputs:
                pieces["is_top1"].append(z.argmax(-1) == t)  # first index wins ties, as in the kernel

        def joined(name):
            if name != "log_probs" and name not in outputs:
                return None
            return torch.cat(pieces[name]) if pieces[name] else hidden.new_zeros(0, dtype=torch.float32)

        return tuple(joined(name) for name in ("log_probs", *OPTIONAL_OUTPUTS))


def ensure_trl_logprob_kernel() -> bool:
    """Install the torch fallback if TRL has no log-prob kernel, or has one that cannot run here: Triton installed
    (vLLM's CPU build brings it) on a machine without a GPU, where Triton finds no driver ("0 active drivers").
    Returns True when it was installed."""
    # lazy: trl and torch load after the bootstrap's `import unsloth` (Unsloth patches them at import)
    import torch
    import trl.trainer.utils as trl_utils

    if not hasattr(trl_utils, "_ChunkedLogProbFunction"):  # another TRL: its own way
        return False
    kernel = trl_utils._ChunkedLogProbFunction
    if kernel is None or (kernel is not TorchChunkedLogProb and not torch.cuda.is_available()):
        trl_utils._ChunkedLogProbFunction = TorchChunkedLogProb
        return True
    return False
