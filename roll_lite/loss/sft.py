"""Supervised fine-tuning's loss_func: the negative log-likelihood of the masked tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from roll_lite.loss.aggregation import agg_loss, mask_stats, zero_outside

if TYPE_CHECKING:
    import torch

    from roll_lite.data.proto import DataProto
    from roll_lite.strategy.micro_batches import LossFunc


def sft_loss_func(mask_key: str = "response_mask") -> LossFunc:
    """Supervised fine-tuning: token-mean negative log-likelihood of the masked tokens."""

    def loss_func(batch: DataProto, output: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask, stats = batch[mask_key], mask_stats(batch.meta_info, mask_key)
        (log_probs,) = zero_outside(mask, output["log_probs"])
        loss = agg_loss(-log_probs, mask, "token-mean", **stats)
        return loss, {"sft_loss@sum": loss.detach()}

    return loss_func
