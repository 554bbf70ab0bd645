"""The packed-attention paths benchmarks/cuda_check.py compares: each kernel called directly (KERNELS),
the paths that can run on a device in a dtype, and forcing the model onto one (roll_lite/model/attention.py's
override variable; None: its own choice)."""

from __future__ import annotations

import os

import torch

import roll_lite.model.attention as attention

KERNELS = {
    "flash-attn": lambda q, k, v, cu, m, s: attention._flash_attn_varlen(q, k, v, cu, m, s, 0.0),
    "torch-varlen": attention._torch_varlen,
    "per-sequence-sdpa": lambda q, k, v, cu, m, s: attention._per_sequence_sdpa(q, k, v, cu, s, 0.0),
}


def runnable_paths(device: torch.device, dtype: torch.dtype) -> list[str]:
    return [p for p in attention.PACKED_PATHS if attention._why_not(p, device, dtype, 0.0) is None]


def force_path(path: str | None) -> None:
    if path is None:
        os.environ.pop(attention.OVERRIDE_ENV, None)
    else:
        os.environ[attention.OVERRIDE_ENV] = path
