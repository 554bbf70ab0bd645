"""Attention for packed micro-batches: one row holding several sequences, delimited by cu_seqlens.

Registered with transformers as the attention implementation "roll_lite_varlen". With
`cu_seq_lens_q` in the forward kwargs (a packed row) every sequence attends only to itself, by the
first path that can run (`packed_attention_path` says which and why; the strategy logs it):
- "flash-attn": flash-attn's `flash_attn_varlen_func` (CUDA, bf16/fp16, flash-attn installed);
- "torch-varlen": torch's own flash kernel `torch.nn.attention.varlen.varlen_attn` (CUDA,
  bf16/fp16, no attention dropout, a torch whose varlen_attn takes `window_size` and `scale`), so
  a GPU without flash-attn still gets one varlen kernel;
- "per-sequence-sdpa": causal sdpa on each sequence's slice; exact in any dtype, on any device.
Without `cu_seq_lens_q` (a padded batch) it is transformers' own sdpa with the usual padding mask.
All give the numbers of attending each sequence alone (tests/test_packing.py; the CUDA kernels in
benchmarks/cuda_check.py). Set ROLL_LITE_PACKED_ATTENTION to one of the paths to force it.

Under Ulysses sequence parallelism the forward kwargs carry `sequence_parallel`, the strategy's exchange
(roll_lite/strategy/sequence_parallel.py: this module has no collectives). Each rank then holds 1/S of the
sequence and every head; an all-to-all turns that into the whole sequence and 1/S of the heads, attention
runs as above on the whole sequence (the full cu_seqlens of a packed row, or the full-sequence 4-D mask
the strategy passes for a padded batch), and a second all-to-all turns it back.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "roll_lite_varlen"
PACKED_PATHS = ("flash-attn", "torch-varlen", "per-sequence-sdpa")
OVERRIDE_ENV = "ROLL_LITE_PACKED_ATTENTION"
HALF_DTYPES = (torch.bfloat16, torch.float16)


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


@functools.lru_cache(maxsize=1)
def _torch_varlen_missing() -> str | None:
    """None if torch's varlen_attn takes what we pass (window_size for causality, scale), else why not."""
    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen"
    from torch.nn.attention.varlen import varlen_attn

    missing = {"window_size", "scale"} - set(inspect.signature(varlen_attn).parameters)
    if missing:  # torch 2.10's first version took is_causal and no scale
        return f"torch {torch.__version__}'s varlen_attn has no {', '.join(sorted(missing))} argument"
    return None


def torch_varlen_available() -> bool:
    return _torch_varlen_missing() is None


def _why_not(path: str, device: torch.device, dtype: torch.dtype, dropout: float) -> str | None:
    """None if `path` can run here, else the reason it cannot."""
    if path == "per-sequence-sdpa":
        return None
    if device.type != "cuda":
        return f"device is {device.type}; the varlen kernels run on CUDA only"
    if dtype not in HALF_DTYPES:
        return f"compute dtype is {str(dtype).removeprefix('torch.')}; the varlen kernels take bfloat16/float16"
    if path == "flash-attn" and not flash_attn_available():
        return "flash-attn is not installed (with nvcc: pip install flash-attn==2.8.3.post2 --no-build-isolation)"
    if path == "torch-varlen":
        if missing := _torch_varlen_missing():
            return missing
        if dropout:
            return "attention dropout is on; torch's varlen_attn has no dropout"
    return None


def packed_attention_path(device: torch.device, dtype: torch.dtype, dropout: float = 0.0) -> tuple[str, str]:
    """(path, why) for packed rows of `dtype` on `device`."""
    return _choose_path(torch.device(device), dtype, dropout, os.environ.get(OVERRIDE_ENV, "auto"))


@functools.lru_cache(maxsize=None)  # asked once per layer and forward: the answer does not change
def _choose_path(device: torch.device, dtype: torch.dtype, dropout: float, forced: str) -> tuple[str, str]:
    if forced != "auto":
        if forced not in PACKED_PATHS:
            raise ValueError(f"{OVERRIDE_ENV}='{forced}' is not one of auto, {', '.join(PACKED_PATHS)}")
        reason = _why_not(forced, device, dtype, dropout)
        if reason is not None:
            raise ValueError(f"{OVERRIDE_ENV}={forced} cannot run: {reason}")
        return forced, f"forced by {OVERRIDE_ENV}"
    skipped: list[str] = []
    for path in PACKED_PATHS:
        reason = _why_not(path, device, dtype, dropout)
        if reason is None:
            why = "; ".join(skipped) or f"{device.type}, {str(dtype).removeprefix('torch.')}"
            return path, why
        skipped.append(f"not {path}: {reason}")
    raise AssertionError("per-sequence-sdpa always runs")


def _per_sequence_sdpa(query, key, value, cu_seqlens, scaling, dropout):
    # query: [1, heads, tokens, dim]; key/value may have fewer (grouped) heads. split, not slicing:
    # the backward of each slice would build a zero gradient of the whole packed row, one per sequence.
    lengths = cu_seqlens.diff().tolist()
    outputs = [
        F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
        )
        for q, k, v in zip(query.split(lengths, dim=2), key.split(lengths, dim=2), value.split(lengths, dim=2))
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()  # [1, tokens, heads, dim]


def _tokens_first(query, key, value):
    return (t.squeeze(0).transpose(0, 1) for t in (query, key, value))  # [tokens, heads, dim]


def _flash_attn_varlen(query, key, value, cu_seqlens, max_seqlen, scaling, dropout):
    from flash_attn import flash_attn_varlen_func

    q, k, v = _tokens_first(query, key, value)  # flash-attn handles grouped kv heads itself
    cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int32)
    out = flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens,
        cu_seqlens,
        int(max_seqlen),
        int(max_seqlen),
        dropout_p=dropout,
        softmax_scale=scaling,
        causal=True,
    )
    return out.unsqueeze(0)


def _torch_varlen(query, key, value, cu_seqlens, max_seqlen, scaling):
    from torch.nn.attention.varlen import varlen_attn

    q, k, v = _tokens_first(query, key, value)
    if k.shape[1] != q.shape[1]:  # grouped-query attention: give every query head its kv head
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int32)
    out = varlen_attn(
        q, k, v, cu_seqlens, cu_seqlens, int(max_seqlen), int(max_seqlen), scale=scaling, window_size=(-1, 0)
    )  # (-1, 0): causal
    return out.unsqueeze(0)


def varlen_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    sequence_parallel = kwargs.pop("sequence_parallel", None)
    if sequence_parallel is not None:
        return _ulysses_attention(sequence_parallel, query, key, value, attention_mask, dropout, scaling, kwargs), None
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one packed row, got batch {query.shape[0]}")
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("packed attention does not implement sliding-window attention")
    return _packed_attention(query, key, value, cu_seqlens, kwargs["max_length_q"], scaling, float(dropout)), None


def _ulysses_attention(exchange, query, key, value, attention_mask, dropout, scaling, kwargs):
    """query / key / value [rows, heads, tokens / S, dim] -> attention output [rows, tokens / S, heads, dim]."""
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("sequence parallelism does not implement sliding-window attention")
    degree = exchange.degree
    if key.shape[1] < degree:  # fewer KV heads than ranks: repeat each so that every rank gets one
        key, value = (t.repeat_interleave(degree // t.shape[1], dim=1) for t in (key, value))
    # sequence-sharded -> head-sharded: [rows, heads / S, tokens, dim]
    query, key, value = (exchange.all_to_all(t, scatter_dim=1, gather_dim=2) for t in (query, key, value))
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is not None:
        output = _packed_attention(query, key, value, cu_seqlens, kwargs["max_length_q"], scaling, float(dropout))
    else:  # attention_mask: the whole sequence's [rows, 1, tokens, tokens] (True: attend)
        gqa = query.shape[1] != key.shape[1]
        output = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=float(dropout), scale=scaling, enable_gqa=gqa
        ).transpose(1, 2)
    # [rows, tokens, heads / S, dim] -> [rows, tokens / S, heads, dim]
    return exchange.all_to_all(output, scatter_dim=1, gather_dim=2)


# Compiled decoder layers (model.compile_layers) run this eagerly, between two compiled regions: each
# path is one kernel already (or a loop over sequences), and traced it would recompile for every new
# count of sequences or longest sequence in a pack.
@torch.compiler.disable
def _packed_attention(query, key, value, cu_seqlens, max_seqlen, scaling, dropout):
    path, _ = packed_attention_path(query.device, query.dtype, dropout)
    if path == "flash-attn":
        return _flash_attn_varlen(query, key, value, cu_seqlens, max_seqlen, scaling, dropout)
    if path == "torch-varlen":
        return _torch_varlen(query, key, value, cu_seqlens, max_seqlen, scaling)
    return _per_sequence_sdpa(query, key, value, cu_seqlens, scaling, dropout)


def register_attention() -> str:
    """Make "roll_lite_varlen" known to transformers (idempotent); returns its name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, varlen_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION
