"""Sequence packing: balance rows by token count, group them by token budget, pack and unpack.

Rows are right-padded: row i holds its `length_i` tokens at positions 0..length_i-1 and
attention_mask marks them. A packed micro-batch is one row of all its sequences back to back,
with position ids restarting at 0 per sequence and `cu_seqlens` = cumulative lengths.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Sequence

import torch


def row_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Token count of every row; rows must be right-padded (ones, then zeros)."""
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    positions = torch.arange(mask.shape[-1], device=mask.device)
    expected = positions[None, :] < lengths[:, None]
    bad_rows = (expected != mask).any(-1).nonzero().flatten().tolist()
    if bad_rows:
        raise ValueError(
            f"attention_mask rows {bad_rows[:10]} are not right-padded (tokens first, then padding); "
            "roll_lite expects every row to start at position 0"
        )
    return lengths.tolist()


def karmarkar_karp(weights: Sequence[int], num_parts: int) -> list[list[int]]:
    """Split item indices into `num_parts` groups with near-equal weight sums (largest differencing).

    Deterministic; groups are returned with their indices sorted, some may be empty.
    """
    if num_parts < 1:
        raise ValueError(f"karmarkar_karp: num_parts must be >= 1, got {num_parts}")
    tie = itertools.count()
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []  # (-spread, tie, [(sum, indices) per part])
    for index, weight in enumerate(weights):
        parts = [(weight, [index])] + [(0, []) for _ in range(num_parts - 1)]
        heapq.heappush(heap, (-weight, next(tie), parts))
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        first = sorted(first, key=lambda part: -part[0])
        second = sorted(second, key=lambda part: part[0])
        merged = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(first, second)]
        sums = [part[0] for part in merged]
        heapq.heappush(heap, (-(max(sums) - min(sums)), next(tie), merged))
    if not heap:
        return [[] for _ in range(num_parts)]
    parts = sorted(heap[0][2], key=lambda part: (-part[0], sorted(part[1])))
    return [sorted(indices) for _, indices in parts]


def token_budget_groups(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group row indices so each group's token total is at most `max_tokens` (first-fit decreasing)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens}")
    bins: list[list] = []  # [tokens, indices]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[index]
        if length > max_tokens:
            raise ValueError(
                f"row {index} has {length} tokens, more than max_tokens_per_micro_batch={max_tokens}; "
                "raise the budget to at least the longest sequence"
            )
        for bin_ in bins:
            if bin_[0] + length <= max_tokens:
                bin_[0] += length
                bin_[1].append(index)
                break
        else:
            bins.append([length, [index]])
    return [sorted(indices) for _, indices in bins]


@dataclass
class PackedRows:
    input_ids: torch.Tensor  # [1, total_tokens]
    position_ids: torch.Tensor  # [1, total_tokens], restarting at 0 per sequence
    cu_seqlens: torch.Tensor  # [num_sequences + 1], int32
    max_seqlen: int
    lengths: list[int]


def pack_rows(input_ids: torch.Tensor, lengths: Sequence[int]) -> PackedRows:
    if any(length < 1 for length in lengths):
        raise ValueError(f"cannot pack empty rows (lengths {list(lengths)}); every row needs at least one token")
    device = input_ids.device
    tokens = torch.cat([input_ids[i, :length] for i, length in enumerate(lengths)])
    positions = torch.cat([torch.arange(length, device=device) for length in lengths])
    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    cu_seqlens[1:] = torch.cumsum(torch.tensor(lengths, device=device), 0)
    return PackedRows(tokens[None], positions[None], cu_seqlens, max(lengths), list(lengths))


def unpack_next_token_values(values: torch.Tensor, packed: PackedRows, seq_len: int) -> torch.Tensor:
    """[1, total] (or [1, total, k]) next-token-aligned values of a packed row -> [rows, seq_len] (or
    [rows, seq_len, k]) token-aligned.

    Token t ≥ 1 of row i gets the value computed at packed position start_i + t - 1; token 0 and
    padding get 0.
    """
    device = values.device
    starts = packed.cu_seqlens[:-1].to(device=device, dtype=torch.long)
    lengths = torch.tensor(packed.lengths, device=device)
    t = torch.arange(seq_len, device=device)
    valid = (t[None, :] >= 1) & (t[None, :] < lengths[:, None])
    source = (starts[:, None] + t[None, :] - 1).clamp(0, values.shape[1] - 1)
    gathered = values[0][source]  # [rows, seq], or [rows, seq, k] for values [1, total, k]
    valid = valid.reshape(valid.shape + (1,) * (gathered.dim() - 2))
    return torch.where(valid, gathered, torch.zeros((), dtype=values.dtype, device=device))
