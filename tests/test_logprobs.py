"""Chunked log-probs / entropy against the naive full-logits computation, forward and backward."""

import pytest
import torch

from roll_lite.model.logprobs import chunked_log_probs


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
    g_lp, g_ent = (
        torch.randn(23, generator=gen, dtype=torch.float64),
        torch.randn(23, generator=gen, dtype=torch.float64),
    )

    lp, ent = chunked_log_probs(
        hidden, weight, targets, chunk_size=chunk_size, temperature=temperature, with_entropy=True
    )
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
        pick = lambda a, b: (a.sum() if uses_log_probs else 0) + ((b**2).sum() if uses_entropy else 0)  # noqa: E731
        got = torch.autograd.grad(pick(lp, ent), (hidden, weight))
        want = torch.autograd.grad(pick(lp_ref, ent_ref), (hidden, weight), retain_graph=True)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("scratch", [1, 120])  # one row at a time; two rows of 50 and an odd last block
def test_rows_taken_a_few_at_a_time_give_the_same_result(monkeypatch, scratch):
    import roll_lite.model.logprobs as logprobs

    monkeypatch.setattr(logprobs, "SCRATCH_ELEMENTS", scratch)
    test_matches_naive_forward_and_backward(chunk_size=7, temperature=0.7)


def test_the_gpus_whole_chunk_path_gives_the_same_result(monkeypatch):
    # on a GPU the elementwise steps take each chunk at once and the entropy's dot is a product summed
    # in place (no gemv); forced here on CPU, every other test above runs with it too
    import roll_lite.model.logprobs as logprobs

    monkeypatch.setattr(logprobs, "_whole_chunk", lambda logits: True)
    test_matches_naive_forward_and_backward(chunk_size=7, temperature=0.7)
    test_an_entropy_no_loss_uses_adds_nothing_to_the_gradient_and_vice_versa()
    test_float32_entropy_of_peaked_and_flat_rows_is_accurate()


def test_float32_entropy_of_peaked_and_flat_rows_is_accurate():
    # H = log sum e^s - E_p[s] over s = z - max z: no cancellation when the logits are large
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(6, 8, generator=gen, dtype=torch.float64)
    weight = torch.randn(1000, 8, generator=gen, dtype=torch.float64)
    hidden[:3] *= 40.0  # logits of a few hundred: nearly one-hot rows, entropy ~ 0
    hidden[3:] *= 1e-3  # nearly uniform rows, entropy ~ log(1000)
    targets = torch.randint(0, 1000, (6,), generator=gen)
    lp, ent = chunked_log_probs(hidden.float(), weight.float(), targets, chunk_size=4, with_entropy=True)
    lp_ref, ent_ref = naive(hidden, weight, targets, 1.0)
    torch.testing.assert_close(ent.double(), ent_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lp.double(), lp_ref, rtol=1e-5, atol=1e-4)


def test_backward_holds_one_chunk_of_logits_beside_the_heads_gradient():
    # what a step adds at its peak (resident memory): the [vocab, hidden] gradient and one
    # [chunk, vocab] buffer, not one per step of the computation (a view kept alive holds another)
    from pathlib import Path

    clear_refs = Path("/proc/self/clear_refs")
    if not clear_refs.exists():
        pytest.skip("needs Linux /proc to read the peak resident memory")

    def resident(field):
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    vocab, hidden_size, chunk = (
        150_000,
        32,
        512,
    )  # a 307 MB buffer: what malloc keeps of freed scratch is small beside it
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(2 * chunk, hidden_size, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, hidden_size, generator=gen).mul_(0.1).requires_grad_()
    targets = torch.randint(0, vocab, (2 * chunk,), generator=gen)
    buffer, head_grad = chunk * vocab * 4, vocab * hidden_size * 4
    chunked_log_probs(hidden, weight, targets, chunk_size=chunk)[0].sum().backward()  # first-call allocations
    for with_entropy in (False, True):
        hidden.grad = weight.grad = None
        clear_refs.write_text("5")
        before = resident("VmRSS")
        lp, ent = chunked_log_probs(hidden, weight, targets, chunk_size=chunk, with_entropy=with_entropy)
        (lp.sum() + (ent.sum() if with_entropy else 0)).backward()
        added = resident("VmHWM") - before
        assert added < head_grad + 1.5 * buffer, (with_entropy, added / buffer)
