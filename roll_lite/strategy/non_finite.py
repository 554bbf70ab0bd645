"""What to say when a step's gradient is not finite: which inputs hold nan/inf, and where."""

from __future__ import annotations

from typing import Sequence

import torch

from roll_lite.data import DataProto


class NonFiniteStepsError(RuntimeError):
    """Too many optimizer steps in a row were skipped for a nan/inf gradient norm."""


def describe_non_finite(data: DataProto, mask_keys: Sequence[str]) -> str:
    """One line naming the batch tensors with nan/inf values, counted inside and outside the masks.

    Inside a loss mask they reach the loss (fix the data or the reward); outside, the built-in
    losses ignore them, so a skipped step then points at a custom loss_func that does not."""
    in_masks = torch.zeros_like(data["attention_mask"], dtype=torch.bool)
    for key in mask_keys:
        in_masks |= data[key].bool()
    findings = []
    for name, tensor in data.batch.items():
        if not tensor.is_floating_point():
            continue
        bad = ~torch.isfinite(tensor)
        if bad.any():
            if tensor.shape == in_masks.shape:
                inside = int((bad & in_masks).sum())
                findings.append(f"'{name}' ({inside} inside the loss masks, {int(bad.sum()) - inside} outside)")
            else:
                findings.append(f"'{name}' ({int(bad.sum())} values)")
    if not findings:
        return "no nan/inf in this rank's batch tensors: the model's forward or the loss_func produced it"
    return "nan/inf in " + ", ".join(findings)
