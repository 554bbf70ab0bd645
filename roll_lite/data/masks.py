"""Loss masks are 0/1: the check that the strategy (on every named mask of a step) and the
aggregation (on the mask it reduces over) share."""

from __future__ import annotations

import torch


def check_binary_mask(mask: torch.Tensor, name: str) -> None:
    """Masks are 0/1 (or bool): a token counts or it does not. Weighted masks are rejected rather
    than binarised; to weight tokens, multiply the per-token loss by the weights instead."""
    if mask.dtype == torch.bool:
        return
    if not bool(((mask == 0) | (mask == 1)).all()):
        bad = mask[(mask != 0) & (mask != 1)]
        raise ValueError(
            f"mask '{name}' holds values other than 0 and 1 (e.g. {bad.flatten()[0].item()!r}); masks mark which "
            "tokens count and are not weights: multiply the per-token loss by your weights instead"
        )
