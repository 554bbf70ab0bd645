"""Token log-probs and entropy from hidden states, without the [tokens, vocab] logits at once.

The logits of `chunk_size` tokens at a time are computed in (at least) float32, reduced to the
target log-prob and the entropy, and dropped; backward recomputes them chunk by chunk. Peak extra
memory is two chunk_size × vocab buffers (logits and probabilities, every later step in place on
them) and the LM head's gradient, accumulated in place (addmm_), instead of several tokens × vocab.
Backward skips the entropy's part when no loss uses the entropy (only a metric read it): autograd
then hands it no gradient (set_materialize_grads(False)).
"""

from __future__ import annotations

import torch


def _chunk_logits(hidden_chunk, weight, temperature):
    logits = hidden_chunk @ weight.T
    return logits.div_(temperature) if temperature != 1.0 else logits


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum(a * b, -1) for [c, V] tensors without a [c, V] product."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, temperature, with_entropy):
        compute_dtype = torch.promote_types(hidden.dtype, torch.float32)
        weight_c = weight.to(compute_dtype)
        num_tokens = hidden.shape[0]
        log_probs = hidden.new_empty(num_tokens, dtype=compute_dtype)
        entropy = hidden.new_zeros(num_tokens if with_entropy else 0, dtype=compute_dtype)
        for start in range(0, num_tokens, chunk_size):
            end = min(start + chunk_size, num_tokens)
            logits = _chunk_logits(hidden[start:end].to(compute_dtype), weight_c, temperature)
            log_normalizer = torch.logsumexp(logits, dim=-1)
            log_probs[start:end] = logits.gather(-1, targets[start:end, None]).squeeze(-1) - log_normalizer
            if with_entropy:
                log_p = logits.sub_(log_normalizer[:, None])  # in place: the logits are not needed any more
                entropy[start:end] = -_row_dot(torch.exp(log_p), log_p)
                del log_p
            del logits  # before the next chunk's buffers are allocated
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk_size, ctx.temperature, ctx.with_entropy = chunk_size, temperature, with_entropy
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, targets = ctx.saved_tensors
        use_entropy = ctx.with_entropy and grad_entropy is not None
        if grad_log_probs is None and not use_entropy:
            return None, None, None, None, None, None
        compute_dtype = torch.promote_types(hidden.dtype, torch.float32)
        grad_hidden = torch.empty_like(hidden, dtype=compute_dtype)
        grad_weight = torch.zeros_like(weight, dtype=compute_dtype)
        weight_c = weight.to(compute_dtype)
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            end = min(start + ctx.chunk_size, hidden.shape[0])
            hidden_chunk = hidden[start:end].to(compute_dtype)
            logits = _chunk_logits(hidden_chunk, weight_c, ctx.temperature)
            probs = torch.softmax(logits, dim=-1)
            if use_entropy:
                # dH/dz = -p (z - E_p[z]), built in the logits' buffer
                entropy_part = logits.sub_(_row_dot(probs, logits)[:, None]).mul_(probs)
                entropy_part.mul_(-grad_entropy[start:end, None].to(compute_dtype))
            # d logp(y)/dz = onehot(y) - p, built in the probabilities' buffer
            grad_logits = probs
            if grad_log_probs is not None:
                g = grad_log_probs[start:end, None].to(compute_dtype)
                grad_logits.mul_(-g).scatter_add_(-1, targets[start:end, None], g)
            else:
                grad_logits.zero_()
            if use_entropy:
                grad_logits.add_(entropy_part)
                del entropy_part
            del logits
            if ctx.temperature != 1.0:
                grad_logits.div_(ctx.temperature)
            torch.mm(grad_logits, weight_c, out=grad_hidden[start:end])
            grad_weight.addmm_(grad_logits.T, hidden_chunk)
            del probs, grad_logits  # before the next chunk's buffers are allocated
        return grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype), None, None, None, None


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(hidden @ weight.T / temperature)[targets] per token, and optionally the entropy.

    hidden: [N, H]; weight: [V, H] (the LM head); targets: [N] token ids. Returns float32 (float64
    for float64 inputs) tensors of shape [N]; entropy is None unless `with_entropy`.
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"chunked_log_probs: hidden {tuple(hidden.shape)} must be [N, H], targets [N]")
    if chunk_size < 1 or temperature <= 0:
        raise ValueError(f"chunked_log_probs: need chunk_size >= 1 and temperature > 0 ({chunk_size}, {temperature})")
    log_probs, entropy = _ChunkedLogProbs.apply(hidden, weight, targets, chunk_size, temperature, with_entropy)
    return log_probs, (entropy if with_entropy else None)
