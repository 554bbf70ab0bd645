"""What to say when a step's gradient is not finite: which inputs hold nan/inf, and where."""

from __future__ import annotations

from typing import Sequence

import torch

from roll_lite.data import DataProto


def skipped_step_message(grad_norm: float, in_a_row: int, rank: int, finding: str) -> str:
    """The warning of a skipped step. No step number: the driver's steps are not the optimizer's (a
    warm start, ppo_epochs × mini_batches); the driver's log says which step it is."""
    return f"grad norm is {grad_norm}, optimizer step skipped ({in_a_row} in a row); rank {rank}: {finding}"


class NonFiniteStepsError(RuntimeError):
    """Too many optimizer steps in a row were skipped for a nan/inf gradient norm: the run stops on
    purpose, and this message (no traceback) is the reason. `describe(prefix)` names the config key
    with its section (actor., critic.), which the strategy does not know."""

    def __init__(self, grad_norm: float, in_a_row: int, rank: int, finding: str):
        self.grad_norm, self.in_a_row, self.rank, self.finding = grad_norm, in_a_row, rank, finding
        super().__init__(grad_norm, in_a_row, rank, finding)  # what pickling (Ray) rebuilds it from

    def describe(self, key_prefix: str = "") -> str:
        return (
            f"{skipped_step_message(self.grad_norm, self.in_a_row, self.rank, self.finding)}; "
            f"{key_prefix}max_consecutive_skipped_steps={self.in_a_row} reached (raise it, or null to never stop; "
            "lowering lr or fixing the data usually helps)"
        )

    def __str__(self) -> str:
        return self.describe()


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
