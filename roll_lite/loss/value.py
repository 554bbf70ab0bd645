"""The critic's loss: the PPO clipped value loss per token, and the built-in value loss_func."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from roll_lite.loss.aggregation import agg_loss, mask_stats, token_mean_metric, zero_outside

if TYPE_CHECKING:
    from roll_lite.data.proto import DataProto
    from roll_lite.strategy.micro_batches import LossFunc


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_range: float = 0.2
) -> torch.Tensor:
    """PPO value loss per token: 0.5·max((V - R)², (clip(V, V_old ± ε) - R)²)."""
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    return 0.5 * torch.maximum((values - returns).square(), (clipped_values - returns).square())


def value_loss_func(
    loss_agg_mode: str = "token-mean",
    clip_range: float = 0.2,
    seq_len_norm: float | None = None,
    mask_key: str = "response_mask",
) -> LossFunc:
    """PPO critic: clipped value loss against batch 'returns', old values in batch 'values'. It goes
    through agg_loss with the global stats like every other loss (no local masked mean)."""

    def loss_func(batch: DataProto, output: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask, stats = batch[mask_key], mask_stats(batch.meta_info, mask_key)
        values, old_values, returns = zero_outside(mask, output["values"], batch["values"], batch["returns"])
        loss_mat = clipped_value_loss(values, old_values, returns, clip_range)
        loss = agg_loss(loss_mat, mask, loss_agg_mode, **stats, seq_len_norm=seq_len_norm)
        clipped = ((values - old_values).abs() > clip_range).to(loss_mat.dtype)
        return loss, {
            "vf_loss@sum": loss.detach(),
            "vf_clipfrac@sum": token_mean_metric(clipped, mask, stats["batch_num_tokens"]),
        }

    return loss_func
