"""The torch log-prob fallback for CPU-only TRL: same numbers as the full transform chain.

The fallback skips the logit-scale and temperature passes when they are 1.0; these tests hold it to the
unskipped chain (scale, soft-cap, temperature, in fp32, as TRL's kernel orders them), values and gradients.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from grpo_pipeline.pipeline.backends import trl_cpu_compat  # noqa: E402
from grpo_pipeline.pipeline.backends.trl_cpu_compat import OPTIONAL_OUTPUTS, TorchChunkedLogProb  # noqa: E402


def full_chain(hidden, weight, bias, targets, temperature, softcap, logit_scale):
    """Every transform applied unconditionally: the path the skip must agree with."""
    z = torch.nn.functional.linear(hidden.float(), weight.float(), None if bias is None else bias.float())
    z = z * logit_scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    log_p = torch.log_softmax(z, dim=-1)
    return {
        "log_probs": log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1),
        "entropy": -(log_p.exp() * log_p).sum(-1),
        "log_sum_sq_probs": torch.logsumexp(2 * log_p, dim=-1),
        "mean_logits": z.mean(-1),
        "is_top1": z.argmax(-1) == targets,
    }


def inputs(tokens=37, width=16, vocab=211, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, width, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, width, generator=gen, requires_grad=True)
    bias = torch.randn(vocab, generator=gen)
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    return hidden, weight, bias, targets


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_skipped_identity_passes_give_the_full_paths_log_probs_and_gradients(monkeypatch, softcap):
    monkeypatch.setattr(trl_cpu_compat, "TOKENS_PER_CHUNK", 10)  # several token chunks, as on a real batch
    hidden, weight, bias, targets = inputs()
    ours = TorchChunkedLogProb.apply(hidden, weight, bias, targets, 1.0, 4096, softcap, 1.0)
    ours_grads = torch.autograd.grad(ours[0].sum() + ours[1].sum(), (hidden, weight))

    # The full chain on the same token chunks: a matmul's bits depend on its row count and on torch's thread count
    # (the suite's modules leave 1 or 2 threads; vLLM's CPU worker binds its own), so only the skip may differ.
    parts = [full_chain(hidden[i:i + 10], weight, bias, targets[i:i + 10], 1.0, softcap, 1.0)
             for i in range(0, hidden.shape[0], 10)]
    ref = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
    ref_grads = torch.autograd.grad(ref["log_probs"].sum() + ref["entropy"].sum(), (hidden, weight))

    for name, value in zip(("log_probs", *OPTIONAL_OUTPUTS), ours):
        # x * 1.0 and x / 1.0 are exact in fp32, so skipping them changes no bit.
        assert torch.equal(value, ref[name].detach() if value.dtype != torch.bool else ref[name]), name
    for mine, theirs in zip(ours_grads, ref_grads):
        # the weight's gradient sums over token chunks in another order: equal up to fp32 rounding
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_scale_and_temperature_other_than_one_are_still_applied():
    hidden, weight, bias, targets = inputs(seed=1)
    plain = TorchChunkedLogProb.apply(hidden, weight, bias, targets, 1.0, 4096, None, 1.0)[0]
    ours = TorchChunkedLogProb.apply(hidden, weight, bias, targets, 0.7, 4096, 30.0, 0.5)[0]
    ref = full_chain(hidden, weight, bias, targets, 0.7, 30.0, 0.5)["log_probs"]
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert not torch.allclose(ours, plain)  # the transforms changed the result, so the test can tell


def test_only_requested_optional_outputs_are_returned():
    hidden, weight, bias, targets = inputs(tokens=5)
    out = TorchChunkedLogProb.apply(hidden, weight, None, targets, 1.0, 4096, None, 1.0, outputs=("entropy",))
    assert out[0].shape == (5,) and out[1].shape == (5,)
    assert out[2:] == (None, None, None)
