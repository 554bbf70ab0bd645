"""Token log-probs and entropy from hidden states, without the [tokens, vocab] logits at once.

The logits of `chunk_size` tokens at a time are computed in (at least) float32, reduced to the
target log-prob and the entropy, and dropped; backward recomputes them chunk by chunk. Peak extra
memory is chunk_size × vocab floats instead of tokens × vocab.
"""

from __future__ import annotations

import torch


def _chunk_logits(hidden_chunk, weight, temperature, compute_dtype):
    return (hidden_chunk.to(compute_dtype) @ weight.to(compute_dtype).T) / temperature


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, temperature, with_entropy):
        compute_dtype = torch.promote_types(hidden.dtype, torch.float32)
        num_tokens = hidden.shape[0]
        log_probs = hidden.new_empty(num_tokens, dtype=compute_dtype)
        entropy = hidden.new_zeros(num_tokens if with_entropy else 0, dtype=compute_dtype)
        for start in range(0, num_tokens, chunk_size):
            end = min(start + chunk_size, num_tokens)
            logits = _chunk_logits(hidden[start:end], weight, temperature, compute_dtype)
            log_normalizer = torch.logsumexp(logits, dim=-1)
            log_probs[start:end] = logits.gather(-1, targets[start:end, None]).squeeze(-1) - log_normalizer
            if with_entropy:
                probs = torch.exp(logits - log_normalizer[:, None])
                entropy[start:end] = log_normalizer - (probs * logits).sum(-1)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk_size, ctx.temperature, ctx.with_entropy = chunk_size, temperature, with_entropy
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, targets = ctx.saved_tensors
        compute_dtype = torch.promote_types(hidden.dtype, torch.float32)
        grad_hidden = torch.zeros_like(hidden, dtype=compute_dtype)
        grad_weight = torch.zeros_like(weight, dtype=compute_dtype)
        weight_c = weight.to(compute_dtype)
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            end = min(start + ctx.chunk_size, hidden.shape[0])
            hidden_chunk = hidden[start:end].to(compute_dtype)
            logits = _chunk_logits(hidden_chunk, weight_c, ctx.temperature, compute_dtype)
            probs = torch.softmax(logits, dim=-1)
            # d logp(y)/dz = onehot(y) - p
            g = grad_log_probs[start:end, None].to(compute_dtype)
            grad_logits = -probs * g
            grad_logits.scatter_add_(-1, targets[start:end, None], g)
            if ctx.with_entropy and grad_entropy is not None:
                # dH/dz = -p (z - E_p[z])
                mean_logit = (probs * logits).sum(-1, keepdim=True)
                grad_logits -= grad_entropy[start:end, None].to(compute_dtype) * probs * (logits - mean_logit)
            grad_logits /= ctx.temperature
            grad_hidden[start:end] = grad_logits @ weight_c
            grad_weight += grad_logits.T @ hidden_chunk
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
