"""Token log-probs and entropy from hidden states, without the [tokens, vocab] logits at once.

The logits of `chunk_size` tokens at a time are computed in (at least) float32, reduced to the
target log-prob and the entropy, and dropped; backward recomputes them chunk by chunk. Peak extra
memory is one chunk_size × vocab buffer (every step after the matmul works in place on it, a few
rows at a time, with a small scratch block) and the LM head's gradient, accumulated in place
(addmm_), instead of several tokens × vocab.

On a GPU with bf16 (or fp16) compute the matmuls take the low-precision hidden states and head
as they are and write float32 (torch.mm's out_dtype): the tensor cores multiply bf16 values exactly
and accumulate in float32, the same numbers as upcasting both first but at the tensor cores' rate
(the upcast float32 matmul was ~2/3 of a 1.5 B train step on an H100). Backward feeds them the
logits' gradient rounded to bf16, as autograd does for any bf16 layer. Elsewhere (CPU, float32 and
float64 models) the matmuls run in the compute dtype, unchanged.

Forward keeps each token's log-normalizer and entropy, so backward rebuilds the probabilities with
one exp instead of a softmax, and the entropy's gradient -p (log p + H) without another reduction.
Backward skips the entropy's part when no loss uses the entropy (only a metric read it): autograd
then hands it no gradient (set_materialize_grads(False)).
"""

from __future__ import annotations

import torch

SCRATCH_ELEMENTS = 1 << 21  # on CPU the elementwise steps go over this many logits at a time (8 MiB in float32)


def _tensor_core_inputs(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """bf16 / fp16 on a GPU: matmuls with float32 output straight from the low-precision operands."""
    return hidden.is_cuda and hidden.dtype in (torch.bfloat16, torch.float16) and weight.dtype == hidden.dtype


def _mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """a @ b in `out_dtype`: from low-precision operands on a GPU (out_dtype float32), else upcast."""
    if a.dtype == b.dtype and a.dtype != out_dtype:
        return torch.mm(a, b, out_dtype=out_dtype)
    return torch.mm(a.to(out_dtype), b.to(out_dtype))


def _chunk_logits(hidden_chunk, weight, temperature, compute_dtype):
    logits = _mm(hidden_chunk, weight.T, compute_dtype)
    return logits.div_(temperature) if temperature != 1.0 else logits


def _whole_chunk(logits: torch.Tensor) -> bool:
    """Whether the elementwise steps take a chunk's logits at once: on a GPU, where blocks of a few
    rows cost a kernel launch each for microseconds of work; on CPU they go over SCRATCH_ELEMENTS
    logits at a time, so that the scratch stays in cache."""
    return logits.is_cuda


def _row_dot_(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum(a * b, -1) for [c, V] tensors without a [c, V] product. On CPU a batched dot; on a GPU that
    is one gemv per row (62 µs for 13 rows of a 151,936 vocabulary on an H100), so there the product
    overwrites `a` and is summed."""
    if _whole_chunk(a):
        return a.mul_(b).sum(dim=-1)
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def _row_blocks(logits: torch.Tensor):
    """Row ranges of a [rows, vocab] buffer for the elementwise steps (see _whole_chunk)."""
    rows, vocab = logits.shape
    step = max(1, rows if _whole_chunk(logits) else SCRATCH_ELEMENTS // vocab)
    return ((start, min(start + step, rows)) for start in range(0, rows, step))


def _reduce_logits_(logits, targets, log_probs, log_normalizer, entropy):
    """Write a chunk's log p(y), log-normalizer and, when `entropy` is given, entropy into those
    [rows] slices, a few rows at a time; the logits are shifted in place by their row max. The
    entropy is H = log sum e^s - E_p[s] for s = z - max z: two terms >= 0, no cancellation."""
    row_max = logits.amax(dim=-1)
    shifted = logits.sub_(row_max[:, None])
    for a, b in _row_blocks(shifted):
        exp_shifted = torch.exp(shifted[a:b])
        total = exp_shifted.sum(dim=-1)
        log_total = torch.log(total)
        log_normalizer[a:b] = row_max[a:b] + log_total
        if targets.dim() == 1:
            log_probs[a:b] = shifted[a:b].gather(-1, targets[a:b, None]).squeeze(-1) - log_total
        else:  # several ids per token: the sampled one and the teacher's top k
            log_probs[a:b] = shifted[a:b].gather(-1, targets[a:b]) - log_total[:, None]
        if entropy is not None:
            entropy[a:b] = log_total - _row_dot_(exp_shifted, shifted[a:b]) / total


def _logits_to_grad_(logits, log_normalizer, g, entropy_terms):
    """Turn a chunk's logits, in place and a few rows at a time, into the gradient of
    sum(g logp(y) + g_H H) with respect to them, except g onehot(y) (the caller's scatter):
    d logp(y)/dz = onehot(y) - p and dH/dz = -p (log p + H), so it is -p (g + g_H (log p + H)),
    with entropy_terms = (g_H, g + g_H H); -p g when they are None."""
    for a, b in _row_blocks(logits):
        log_p = logits[a:b].sub_(log_normalizer[a:b, None])
        if entropy_terms is None:
            log_p.exp_().mul_(-g[a:b, None])
        else:
            g_entropy, offset = entropy_terms
            probs = torch.exp(log_p)
            log_p.mul_(-g_entropy[a:b, None]).sub_(offset[a:b, None]).mul_(probs)


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, temperature, with_entropy):
        compute_dtype = torch.promote_types(hidden.dtype, torch.float32)
        weight_c = weight if _tensor_core_inputs(hidden, weight) else weight.to(compute_dtype)
        num_tokens = hidden.shape[0]
        log_probs = hidden.new_empty(targets.shape, dtype=compute_dtype)
        log_normalizer = hidden.new_empty(num_tokens, dtype=compute_dtype)
        entropy = hidden.new_zeros(num_tokens if with_entropy else 0, dtype=compute_dtype)
        for start in range(0, num_tokens, chunk_size):
            end = min(start + chunk_size, num_tokens)
            logits = _chunk_logits(hidden[start:end].to(weight_c.dtype), weight_c, temperature, compute_dtype)
            _reduce_logits_(
                logits,
                targets[start:end],
                log_probs[start:end],
                log_normalizer[start:end],
                entropy[start:end] if with_entropy else None,
            )
            del logits  # before the next chunk's buffer is allocated
        ctx.save_for_backward(hidden, weight, targets, log_normalizer, entropy)
        ctx.chunk_size, ctx.temperature, ctx.with_entropy = chunk_size, temperature, with_entropy
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, targets, log_normalizer, entropy = ctx.saved_tensors
        use_entropy = ctx.with_entropy and grad_entropy is not None
        if grad_log_probs is None and not use_entropy:
            return None, None, None, None, None, None
        compute_dtype = torch.promote_types(hidden.dtype, torch.float32)
        num_tokens = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden, dtype=compute_dtype)
        grad_weight = torch.zeros_like(weight, dtype=compute_dtype)
        weight_c = weight if _tensor_core_inputs(hidden, weight) else weight.to(compute_dtype)
        g_all = (
            torch.zeros(targets.shape, dtype=compute_dtype, device=hidden.device)
            if grad_log_probs is None
            else grad_log_probs.to(compute_dtype)
        )
        # d logp(y_j)/dz = onehot(y_j) - p for each of a token's ids: the -p part takes their summed gradient
        g_total = g_all if targets.dim() == 1 else g_all.sum(-1)
        if use_entropy:
            g_entropy = grad_entropy.to(compute_dtype)
            offset = g_total + g_entropy * entropy  # g + g_H H
        for start in range(0, num_tokens, ctx.chunk_size):
            end = min(start + ctx.chunk_size, num_tokens)
            hidden_chunk = hidden[start:end].to(weight_c.dtype)
            grad_logits = _chunk_logits(hidden_chunk, weight_c, ctx.temperature, compute_dtype)
            entropy_terms = (g_entropy[start:end], offset[start:end]) if use_entropy else None
            _logits_to_grad_(grad_logits, log_normalizer[start:end], g_total[start:end], entropy_terms)
            if targets.dim() == 1:
                grad_logits.scatter_add_(-1, targets[start:end, None], g_all[start:end, None])
            else:
                grad_logits.scatter_add_(-1, targets[start:end], g_all[start:end])
            if ctx.temperature != 1.0:
                grad_logits.div_(ctx.temperature)
            if weight_c.dtype == compute_dtype:
                torch.mm(grad_logits, weight_c, out=grad_hidden[start:end])
                grad_weight.addmm_(grad_logits.T, hidden_chunk)
            else:  # the tensor cores' operands: the gradient rounded to the head's dtype
                grad_logits = grad_logits.to(weight_c.dtype)
                grad_hidden[start:end] = _mm(grad_logits, weight_c, compute_dtype)
                grad_weight += _mm(grad_logits.T, hidden_chunk, compute_dtype)
            del grad_logits  # before the next chunk's buffer is allocated
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

    hidden: [N, H]; weight: [V, H] (the LM head); targets: [N] token ids, or [N, M] (M ids per token,
    e.g. the sampled one and a teacher's top k). Returns float32 (float64 for float64 inputs) log-probs
    of the targets' shape and an entropy of shape [N]; entropy is None unless `with_entropy`.
    """
    if hidden.dim() != 2 or targets.shape[:1] != hidden.shape[:1] or targets.dim() not in (1, 2):
        raise ValueError(f"chunked_log_probs: hidden {tuple(hidden.shape)} must be [N, H], targets [N] or [N, M]")
    if chunk_size < 1 or temperature <= 0:
        raise ValueError(f"chunked_log_probs: need chunk_size >= 1 and temperature > 0 ({chunk_size}, {temperature})")
    log_probs, entropy = _ChunkedLogProbs.apply(hidden, weight, targets, chunk_size, temperature, with_entropy)
    return log_probs, (entropy if with_entropy else None)


def head_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[rows, vocab] logits / temperature of `hidden` [rows, H], computed as the chunked head computes a
    chunk's (the hf engine's exact mode samples from them: roll_lite/model/exact_decoding.py)."""
    compute_dtype = torch.promote_types(hidden.dtype, torch.float32)
    weight_c = weight if _tensor_core_inputs(hidden, weight) else weight.to(compute_dtype)
    return _chunk_logits(hidden.to(weight_c.dtype), weight_c, temperature, compute_dtype)


def target_log_probs_(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[rows] log p(targets) of `head_logits`, reduced as the chunked head reduces them (overwrites logits)."""
    log_probs = logits.new_empty(targets.shape)
    _reduce_logits_(logits, targets, log_probs, logits.new_empty(logits.shape[0]), None)
    return log_probs


@torch.no_grad()
def chunked_top_k(
    hidden: torch.Tensor, weight: torch.Tensor, k: int, *, chunk_size: int = 1024, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, log-probs), each [N, k]: the k most likely next tokens of softmax(hidden @ weight.T /
    temperature) per token, most likely first, chunk by chunk (a teacher's top-k distribution)."""
    compute_dtype = torch.promote_types(hidden.dtype, torch.float32)
    weight_c = weight if _tensor_core_inputs(hidden, weight) else weight.to(compute_dtype)
    ids = torch.empty(hidden.shape[0], k, dtype=torch.long, device=hidden.device)
    log_probs = hidden.new_empty(hidden.shape[0], k, dtype=compute_dtype)
    for start in range(0, hidden.shape[0], chunk_size):
        end = min(start + chunk_size, hidden.shape[0])
        logits = _chunk_logits(hidden[start:end].to(weight_c.dtype), weight_c, temperature, compute_dtype)
        top = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
        log_probs[start:end], ids[start:end] = top.values, top.indices
        del logits
    return ids, log_probs
