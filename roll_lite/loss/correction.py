"""Rollout correction: the gap between the engine that sampled a batch and the actor that trains on
it, reported as a metric and, when asked, corrected by truncated importance sampling (TIS)."""

from __future__ import annotations

import torch

from roll_lite.loss.aggregation import token_mean_metric, zero_outside

ROLLOUT_IS_LEVELS = ("token", "sequence")


def rollout_importance_weights(
    behaviour_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor, level: str, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance sampling (TIS) for the gap between the engine that sampled and the actor.

    The rollout engine (another kernel, dtype or copy of the weights) samples from π_rollout, while
    the loss's ratio is taken against the actor's own π_old. Each token's loss is weighted by
    min(π_old / π_rollout, cap), or per sequence by min(Π_t π_old / π_rollout, cap) over the
    row's masked tokens. Returns (weights, capped): detached, 0 outside the mask; capped is 1.0
    where the cap was hit.
    """
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout importance sampling level '{level}' is not one of {', '.join(ROLLOUT_IS_LEVELS)}")
    if cap <= 0:
        raise ValueError(f"rollout importance sampling cap must be > 0, got {cap}")
    zero = torch.zeros((), dtype=behaviour_log_probs.dtype, device=mask.device)
    log_ratio = torch.where(mask.bool(), (behaviour_log_probs - rollout_log_probs).detach(), zero)
    if level == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    ratio = torch.exp(log_ratio)
    keep = mask.to(ratio.dtype)
    return ratio.clamp(max=cap) * keep, (ratio > cap).to(ratio.dtype) * keep


def rollout_correction(batch, behaviour_log_probs, mask, stats, rollout_is: str | None, rollout_is_cap: float):
    """(TIS weights or None, metrics) for the gap between the rollout engine and the actor.

    With the engine's log-probs in the batch ('rollout_log_probs') it reports |Δ log p| between the
    actor's old log-probs and the engine's (token mean and max); with `rollout_is` ('token' or
    'sequence') it also returns the truncated importance weights (rollout_importance_weights) to multiply the
    per-token loss by."""
    if "rollout_log_probs" not in batch.batch:
        if rollout_is:
            raise KeyError("algorithm.rollout_is needs the rollout engine's log-probs (batch 'rollout_log_probs')")
        return None, {}
    # zeroed outside the mask here too: a user's loss may hand in its inputs as they came
    behaviour_log_probs, rollout_log_probs = zero_outside(
        mask, behaviour_log_probs.detach(), batch["rollout_log_probs"].to(behaviour_log_probs.dtype))
    gap = (behaviour_log_probs - rollout_log_probs).abs()
    metrics = {"rollout_logp_gap@sum": token_mean_metric(gap, mask, stats["batch_num_tokens"]),
               "rollout_logp_gap_max@max": gap.max() if gap.numel() else gap.new_zeros(())}
    if not rollout_is:
        return None, metrics
    weights, capped = rollout_importance_weights(behaviour_log_probs, rollout_log_probs, mask, rollout_is, rollout_is_cap)
    metrics["rollout_is_weight@sum"] = token_mean_metric(weights, mask, stats["batch_num_tokens"])
    metrics["rollout_is_capped@sum"] = token_mean_metric(capped, mask, stats["batch_num_tokens"])
    return weights, metrics
