"""Chunked log-probs / entropy against the naive full-logits computation, forward and backward."""

import pytest
import torch

from roll_lite.logprobs import chunked_log_probs


def naive(hidden, weight, targets, temperature):
    logits = (hidden @ weight.T) / temperature
    log_softmax = torch.log_softmax(logits, dim=-1)
    log_probs = log_softmax.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_probs, entropy


@pytest.mark.parametrize("chunk_size", [1, 7, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_naive_forward_and_backward(chunk_size, temperature):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(23, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (23,), generator=gen)
    g_lp, g_ent = torch.randn(23, generator=gen, dtype=torch.float64), torch.randn(23, generator=gen, dtype=torch.float64)

    lp, ent = chunked_log_probs(hidden, weight, targets, chunk_size=chunk_size, temperature=temperature, with_entropy=True)
    grads = torch.autograd.grad((lp * g_lp).sum() + (ent * g_ent).sum(), (hidden, weight))
    lp_ref, ent_ref = naive(hidden, weight, targets, temperature)
    grads_ref = torch.autograd.grad((lp_ref * g_lp).sum() + (ent_ref * g_ent).sum(), (hidden, weight))

    torch.testing.assert_close(lp, lp_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, grads_ref):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)


def test_without_entropy_and_low_precision_inputs_compute_in_float32():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 8, generator=gen).to(torch.bfloat16).requires_grad_()
    weight = torch.randn(30, 8, generator=gen).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 30, (9,), generator=gen)
    lp, ent = chunked_log_probs(hidden, weight, targets, chunk_size=4)
    assert ent is None and lp.dtype == torch.float32
    lp.sum().backward()
    lp_ref, _ = naive(hidden.float(), weight.float(), targets, 1.0)
    torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=1e-5)
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.shape == weight.shape


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"must be \[N, H\]"):
        chunked_log_probs(torch.zeros(2, 3, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long))


def test_an_entropy_no_loss_uses_adds_nothing_to_the_gradient_and_vice_versa():
    # The training forward always returns the entropy (a metric); backward must skip its part when
    # the loss does not use it, and give the entropy-only gradient when the log-probs are unused.
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(11, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(40, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 40, (11,), generator=gen)
    lp_ref, ent_ref = naive(hidden, weight, targets, 0.9)
    for uses_log_probs, uses_entropy in ((True, False), (False, True)):
        lp, ent = chunked_log_probs(hidden, weight, targets, chunk_size=4, temperature=0.9, with_entropy=True)
        pick = lambda a, b: (a.sum() if uses_log_probs else 0) + ((b ** 2).sum() if uses_entropy else 0)  # noqa: E731
        got = torch.autograd.grad(pick(lp, ent), (hidden, weight))
        want = torch.autograd.grad(pick(lp_ref, ent_ref), (hidden, weight), retain_graph=True)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-12)
