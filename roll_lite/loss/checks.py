"""Checks of a loss_func that partition invariance alone cannot see (used by roll_lite.loss.checker).

A loss can give the same step under every (D, A, packing) and still be wrong for the user:

- it reads a mask that is not in `loss_mask_keys` (the strategy never computes its global counts);
- its numerator is not masked: it sums over prompt or padding tokens, whose log-probs depend on
  the weights, or reads advantages / old log-probs at positions that hold no data;
- it normalises by the padded width (`mask.shape[-1]`), which is the same for every micro-batch
  of a step but changes from step to step.

Each check runs `step(data, loss_func) -> (loss, {name: grad})`, the checker's single global
forward/backward, on altered data and compares with the unaltered step. A failed check is one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from roll_lite.data import DataProto

if TYPE_CHECKING:
    from roll_lite.strategy.micro_batches import LossFunc

StepResult = tuple[float, dict[str, torch.Tensor]]  # (loss, {parameter name: gradient})
Step = Callable[[DataProto, "LossFunc"], StepResult]  # the checker's single global forward/backward
OUTPUT_NAMES = ("log_probs", "entropy", "values", "scores")  # what the model heads return
EXTRA_PADDING_COLUMNS = 7


class RecordingDict(dict[str, Any]):
    """A dict that remembers which keys were read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[object] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(key)
        return super().__contains__(key)


def is_mask(tensor: torch.Tensor) -> bool:
    return tensor.dim() == 2 and (tensor.dtype == torch.bool or bool(((tensor == 0) | (tensor == 1)).all()))


def relative_deviation(value: torch.Tensor | float, reference: torch.Tensor | float) -> float:
    value, reference = torch.as_tensor(value, dtype=torch.float64), torch.as_tensor(reference, dtype=torch.float64)
    scale = reference.norm().item()
    difference = (value - reference).norm().item()
    return difference / scale if scale > 0 else difference


def worst_grad_deviation(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """Worst per-parameter relative deviation; a gradient missing on one side counts as zeros."""
    deviations = []
    for name in set(grads) | set(reference):
        like = grads.get(name, reference.get(name))
        deviations.append(
            relative_deviation(grads.get(name, torch.zeros_like(like)), reference.get(name, torch.zeros_like(like)))
        )
    return max(deviations, default=0.0)


def _deviation(result: StepResult, reference: StepResult) -> float:
    (loss, grads), (ref_loss, ref_grads) = result, reference
    return max(relative_deviation(loss, ref_loss), worst_grad_deviation(grads, ref_grads))


def undeclared_mask_reads(data: DataProto, mask_keys: Sequence[str], read_keys: set[object]) -> list[str]:
    """Masks the loss_func read (batch tensors of 0/1) that are not in loss_mask_keys."""
    return sorted(key for key in read_keys if key not in mask_keys and key in data.batch and is_mask(data.batch[key]))


def undeclared_mask_failure(stray: list[str], mask_keys: Sequence[str]) -> str:
    return (
        f"undeclared mask: loss_func reads {stray}, not in loss_mask_keys {list(mask_keys)}: the strategy computes no "
        "global counts for it, so a loss over it is wrong for the step; declare it and aggregate with "
        "agg_loss(..., **mask_stats(batch.meta_info, key)) (or pass allow_undeclared_masks / --allow-undeclared-masks "
        "if it only selects tokens for a metric)"
    )


def _outside(batch_like: DataProto | dict[str, torch.Tensor], mask_keys: Sequence[str]) -> torch.Tensor:
    keep = torch.zeros_like(batch_like[mask_keys[0]], dtype=torch.bool)
    for key in mask_keys:
        keep |= batch_like[key].bool()
    return ~keep


def _garbage(shape: torch.Size, seed: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (3.0 * torch.randn(shape, generator=gen, dtype=torch.float64) + 1.0).to(dtype)


def _with_changed_outputs(loss_func: LossFunc, names: Sequence[str], mask_keys: Sequence[str]) -> LossFunc:
    """loss_func seeing the model outputs `names` changed outside the masks; the change is added, so
    the outputs stay connected to the weights there and a loss that reads them gets another gradient."""

    def changed(batch: DataProto, output: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        outside = _outside(batch, mask_keys)
        output = dict(output)
        for seed, name in enumerate(names):
            if name in output:
                value = output[name]
                output[name] = value + torch.where(outside, _garbage(value.shape, seed, value.dtype), 0.0)
        return loss_func(batch, output)

    return changed


def _with_changed_batch(data: DataProto, names: Sequence[str], outside: torch.Tensor) -> DataProto:
    changed = DataProto(dict(data.batch), data.non_tensor_batch, dict(data.meta_info))
    for seed, name in enumerate(names, start=len(OUTPUT_NAMES)):
        changed.batch[name] = torch.where(
            outside, _garbage(outside.shape, seed, data.batch[name].dtype), data.batch[name]
        )
    return changed


def mask_discipline_failure(
    step: Step, data: DataProto, loss_func: LossFunc, mask_keys: Sequence[str], reference: StepResult, tolerance: float
) -> str | None:
    """Change every value outside the declared masks: the model's outputs (log-probs, entropy,
    values, scores at prompt and padding positions) and every float tensor of the batch (advantages, old /
    ref log-probs, values, returns there). The loss and gradient must not move. All at once first;
    on a failure, one at a time to name the tensors the loss reads there."""
    outside = _outside(data.batch, mask_keys)
    batch_names = [
        name
        for name, tensor in data.batch.items()
        if name not in mask_keys
        and tensor.is_floating_point()
        and tensor.shape == outside.shape
        and not is_mask(tensor)
    ]

    def deviation(outputs: Sequence[str], tensors: Sequence[str]) -> float:
        changed = step(
            _with_changed_batch(data, tensors, outside), _with_changed_outputs(loss_func, outputs, mask_keys)
        )
        return _deviation(changed, reference)

    if deviation(OUTPUT_NAMES, batch_names) <= tolerance:
        return None
    moved = [(name, deviation([name], [])) for name in OUTPUT_NAMES]
    moved += [(name, deviation([], [name])) for name in batch_names]
    listing = (
        ", ".join(f"'{name}' ({dev:.1e})" for name, dev in moved if dev > tolerance) or "only all of them together"
    )
    return (
        f"unmasked numerator: the loss or gradient changes when values outside the declared masks {list(mask_keys)} "
        f"change: {listing} (relative deviation): it sums or reads prompt / padding positions; mask every term "
        "(agg_loss does) and zero inputs outside the mask with zero_outside(mask, ...)"
    )


def with_extra_padding(data: DataProto, columns: int) -> DataProto:
    """The same rows with `columns` more padding columns on the right (zeros; masks 0)."""

    def pad(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() != 2:
            return tensor
        return torch.cat([tensor, torch.zeros(tensor.shape[0], columns, dtype=tensor.dtype)], dim=1)

    return DataProto(
        {name: pad(tensor) for name, tensor in data.batch.items()}, data.non_tensor_batch, dict(data.meta_info)
    )


def padding_width_failure(
    step: Step,
    data: DataProto,
    loss_func: LossFunc,
    reference: StepResult,
    tolerance: float,
    columns: int = EXTRA_PADDING_COLUMNS,
) -> str | None:
    """Re-run the step with extra padding columns: every micro-batch of one step has the global
    width, so partitions cannot see a width-dependent normaliser, but the width changes per step."""
    deviation = _deviation(step(with_extra_padding(data, columns), loss_func), reference)
    if deviation <= tolerance:
        return None
    return (
        f"padded-width normaliser: the loss changes by {deviation:.1e} (relative) when the batch gets {columns} more "
        "padding columns: it divides by the padded width (e.g. mask.shape[-1]), which changes from step to step; "
        "divide by a constant from config instead (seq_len_norm for seq-mean-token-sum-norm)"
    )
