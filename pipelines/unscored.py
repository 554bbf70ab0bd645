"""reward.on_failure=drop: responses that some reward function did not score leave the step.

Their rows stay in the batch (shapes and data-parallel shares do not change), but their loss mask is
zeroed, so no loss term and no global denominator counts them, and the advantage estimators keep
them out of their groups' baselines (batch["scored"], pipelines/advantages.py). The step's
reward/mean is over the scored rows. With reward.on_failure=zero nothing here runs: the function that
failed adds 0 and the response trains on the rest (today's behaviour of most frameworks, named and
counted here: reward/unscored).
"""

from __future__ import annotations

import logging

import torch

from roll_lite.data import DataProto

logger = logging.getLogger(__name__)


def drop_unscored(batch: DataProto, mask_key: str, scores: torch.Tensor, metrics: dict[str, float]) -> dict[str, float]:
    """Zero the loss mask of the rows not scored; returns the metrics with reward/mean over the scored
    rows and reward/dropped. A no-op for a batch without batch["scored"] (reward.on_failure=zero)."""
    scored = batch.batch.get("scored")
    if scored is None:
        return metrics
    mask = batch[mask_key]
    batch.batch[mask_key] = mask * scored[:, None].to(mask.dtype)
    dropped = int((~scored).sum())
    if dropped == len(scored):
        logger.warning(
            "rewards: no response of this step was scored (reward.on_failure=drop); its loss is 0 "
            "and the optimizer steps on zero gradients"
        )
    mean = scores[scored].double().mean().item() if dropped < len(scored) else 0.0
    return {**metrics, "reward/mean": mean, "reward/dropped": float(dropped)}
