"""Batch-invariant kernels: a token's numbers do not depend on what else is in its batch.

Inside `batch_invariant_kernels()` (a thread-local torch function mode) every op whose result for one
row could depend on the other rows, on the padding or on the sequence length is replaced by one whose
reduction order is fixed per row:
- F.linear and torch.mm: CPU float32 GEMMs round a row differently with the number of rows M (MKL/oneDNN
  pick their blocking by shape; M=1 is a GEMV) and with the thread count. Here every product runs on
  tiles of exactly TILE_ROWS rows (the last one zero-padded): one GEMM shape, whatever M is.
- F.scaled_dot_product_attention (transformers' sdpa, the packed per-sequence path, and decoding with a
  KV cache all call it): scores as q·k per key (a sum over head_dim), the softmax's denominator and the
  weighted sum of values as sequential cumulative sums over the keys, in float32 at least. A masked key
  adds an exact zero, so a query's result is the same over its own keys alone (decoding), behind left
  padding (a batch of prompts) or before the keys it may not see (the trainer's full sequence).
- F.silu and rsqrt: their vectorised and scalar (tail) loops round differently on CPU, and which one an
  element takes depends on its position in the tensor; x / (1 + exp(-x)) and 1 / sqrt(x) do not.
Other ops (embedding, RMSNorm's mean over the hidden size, rotary, exp, log, elementwise arithmetic,
the chunked LM head's per-row reductions) are already row-invariant on CPU (tests/test_exact_rollout.py
checks the whole path). The hf engine's exact mode (rollout.exact, roll_lite/model/exact_decoding.py) decodes
with these kernels and the actor computes its log-probs with them, so the two agree bit for bit.
Their cost is measured in docs/on-policy.md. Verified on CPU (float32, bfloat16; 1 and 2 threads); on a
GPU no claim is made. That one GEMM shape rounds each row alike wherever it sits in the tile is measured,
not promised by MKL / oneDNN: tests/test_exact_rollout.py fails on a CPU where it does not hold.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

TILE_ROWS = 16


def tiled_rows(rows: torch.Tensor, product) -> torch.Tensor:
    """product(tile) over [TILE_ROWS, K] tiles of a [M, K] tensor, the last tile zero-padded."""
    count = rows.shape[0]
    pad = (-count) % TILE_ROWS
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])
    return torch.cat([product(tile) for tile in rows.split(TILE_ROWS)])[:count]


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    out = tiled_rows(rows, lambda tile: F.linear(tile, weight))
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def invariant_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v with every reduction in a fixed order per query (module docstring)."""
    if dropout_p:
        raise ValueError("batch-invariant attention has no dropout: set the model's attention_dropout to 0")
    out_dtype = query.dtype
    compute = torch.promote_types(query.dtype, torch.float32)
    query, key, value = (t.to(compute) for t in (query, key, value))
    if key.shape[-3] != query.shape[-3]:  # grouped-query attention
        groups = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query.unsqueeze(-2) * key.unsqueeze(-3)).sum(-1) * scale  # [..., Tq, Tk]
    allowed = None
    if is_causal:  # top-left aligned, as torch's is_causal
        allowed = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = attn_mask if allowed is None else allowed & attn_mask
        else:
            scores = scores + attn_mask
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    row_max = scores.amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))  # a row with no key
    weights = torch.exp(scores - row_max)
    total = weights.cumsum(-1)[..., -1:]
    total = torch.where(total > 0, total, torch.ones_like(total))
    weighted = (weights.unsqueeze(-1) * value.unsqueeze(-3)).cumsum(-2)[..., -1, :]  # [..., Tq, D]
    return (weighted / total).to(out_dtype)


class _BatchInvariantMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            return invariant_linear(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            return invariant_attention(*args, **kwargs)
        if func is F.silu:
            x = args[0]
            return x / (1 + torch.exp(-x))
        if func in (torch.rsqrt, torch.Tensor.rsqrt):
            return 1 / torch.sqrt(args[0])
        if func in (torch.mm, torch.Tensor.mm) and not kwargs and args[0].dim() == 2:
            a, b = args
            return tiled_rows(a, lambda tile: torch.mm(tile, b))
        return func(*args, **kwargs)


@contextmanager
def batch_invariant_kernels(enabled: bool = True):
    """Run the enclosed torch calls of this thread with the batch-invariant kernels (when `enabled`)."""
    with _BatchInvariantMode() if enabled else nullcontext():
        yield
