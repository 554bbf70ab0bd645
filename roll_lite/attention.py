"""Attention for packed micro-batches: one row holding several sequences, delimited by cu_seqlens.

Registered with transformers as the attention implementation "roll_lite_varlen":
- with `cu_seq_lens_q` in the forward kwargs (a packed row), every sequence attends only to itself:
  flash-attn's `flash_attn_varlen_func` on CUDA when flash-attn is installed, otherwise an exact
  torch path that runs causal sdpa on each sequence's slice (CPU, or CUDA without flash-attn);
- without it (a padded batch), it is transformers' own sdpa with the usual padding mask.
Both give the same numbers as attending each sequence alone (tests/test_packing.py).
"""

from __future__ import annotations

import importlib.util
import logging

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "roll_lite_varlen"
logger = logging.getLogger(__name__)


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def packed_attention_path(device: torch.device) -> tuple[str, str]:
    """(path, why) for packed rows on `device`: the choice is logged by the strategy."""
    if device.type != "cuda":
        return "torch-per-sequence-sdpa", f"device is {device.type}; flash-attn runs on CUDA only"
    if not flash_attn_available():
        return "torch-per-sequence-sdpa", "flash-attn is not installed (pip install 'roll_lite[gpu]')"
    return "flash_attn_varlen_func", "CUDA device and flash-attn installed"


def _per_sequence_sdpa(query, key, value, cu_seqlens, scaling, dropout):
    # query: [1, heads, tokens, dim]; key/value may have fewer (grouped) heads.
    bounds = cu_seqlens.tolist()
    outputs = [
        F.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            dropout_p=dropout,
            is_causal=True,
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )
        for start, end in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()  # [1, tokens, heads, dim]


def _flash_varlen(query, key, value, cu_seqlens, max_seqlen, scaling, dropout):
    from flash_attn import flash_attn_varlen_func

    q, k, v = (t.squeeze(0).transpose(0, 1) for t in (query, key, value))  # [tokens, heads, dim]
    cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int32)
    out = flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, int(max_seqlen), int(max_seqlen),
        dropout_p=dropout, softmax_scale=scaling, causal=True,
    )
    return out.unsqueeze(0)


def varlen_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one packed row, got batch {query.shape[0]}")
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("packed attention does not implement sliding-window attention")
    path, _ = packed_attention_path(query.device)
    if path == "flash_attn_varlen_func":
        return _flash_varlen(query, key, value, cu_seqlens, kwargs["max_length_q"], scaling, dropout), None
    return _per_sequence_sdpa(query, key, value, cu_seqlens, scaling, dropout), None


def register_attention() -> str:
    """Make "roll_lite_varlen" known to transformers (idempotent); returns its name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, varlen_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION
