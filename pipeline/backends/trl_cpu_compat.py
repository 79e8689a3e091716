"""Let TRL 1.15's GRPOTrainer run where Triton cannot (CPU-only torch, or vLLM's CPU build's "0 active drivers").

TRL 1.15 computes per-token log-probabilities only through a Triton kernel (`trl.kernels.ChunkedLogProbFunction`;
without it `trl.trainer.utils._ChunkedLogProbFunction` is None and the first step dies in `add_fused_lm_head`'s
forward). TRL 1.16's pure-torch path is backported here (unsloth 2026.10.9 caps trl<=1.15.0). On a GPU TRL's own
kernel runs untouched.
"""

from __future__ import annotations

OPTIONAL_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
TOKENS_PER_CHUNK = 1024  # bounds the [tokens, vocab] logits held at once (151k vocab x 1024 x 4 B = 0.6 GB)


class TorchChunkedLogProb:
    """Drop-in for `trl.kernels.ChunkedLogProbFunction` (TRL 1.15 signature) in plain torch."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
              logit_scale=1.0, outputs=OPTIONAL_OUTPUTS):
        import torch
        import torch.nn.functional as F

        del chunk_size  # the vocabulary is not tiled here; tokens are
        pieces: dict[str, list] = {"log_probs": [], **{name: [] for name in OPTIONAL_OUTPUTS}}
        for start in range(0, hidden.shape[0], TOKENS_PER_CHUNK):
            h = hidden[start:start + TOKENS_PER_CHUNK]
            t = targets[start:start + TOKENS_PER_CHUNK]
            # TRL's kernel's order, in fp32: scale, soft-cap, then temperature (identities skipped: a full pass each).
            z = F.linear(h.float(), weight.float(), None if bias is None else bias.float())
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
    """Install the torch fallback if TRL has no usable log-prob kernel; True when it was installed."""
    import torch
    import trl.trainer.utils as trl_utils

    kernel = getattr(trl_utils, "_ChunkedLogProbFunction", object())
    xpu = getattr(torch, "xpu", None)  # Triton's kernels need a GPU: CUDA or ROCm through torch.cuda, or an XPU
    if kernel is None or (kernel is not TorchChunkedLogProb
                          and not (torch.cuda.is_available() or bool(xpu is not None and xpu.is_available()))):
        trl_utils._ChunkedLogProbFunction = TorchChunkedLogProb
        return True
    return False
