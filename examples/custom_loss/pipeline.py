"""A custom policy loss, the way users write it: subclass the pipeline, override loss_func.

This one is a clipped policy gradient with a per-token "advantage cap" and an entropy floor
bonus. It divides only by the step's global counts (mask_stats), so it is exact under any
(D, A, packing) — check with:

    roll-check-loss examples.custom_loss.pipeline:capped_loss --mask-keys response_mask
"""

import torch
from roll_lite.pipelines.ppo import PPOPipeline

from roll_lite.loss import agg_loss, mask_stats, old_log_probs, ppo_clipped_loss, rollout_correction, token_mean_metric

ADVANTAGE_CAP = 2.0
ENTROPY_FLOOR, ENTROPY_COEF = 0.3, 0.01


def capped_loss(batch, output, loss_agg_mode="seq-mean-token-mean", rollout_is=None, rollout_is_cap=2.0):
    mask, stats = batch["response_mask"], mask_stats(batch.meta_info, "response_mask")
    advantages = batch["advantages"].clamp(-ADVANTAGE_CAP, ADVANTAGE_CAP)
    behaviour_log_probs = old_log_probs(batch, output)
    loss_mat, clipped = ppo_clipped_loss(output["log_probs"], behaviour_log_probs, advantages)
    # algorithm.rollout_is: truncated importance weights for the rollout engine's sampling (and the
    # engine-vs-actor log-prob gap in the metrics either way)
    is_weights, correction_metrics = rollout_correction(
        batch, behaviour_log_probs, mask, stats, rollout_is, rollout_is_cap
    )
    if is_weights is not None:
        loss_mat = loss_mat * is_weights
    # Bonus only where the entropy fell below the floor.
    entropy_shortfall = torch.relu(ENTROPY_FLOOR - output["entropy"])
    loss_mat = loss_mat + ENTROPY_COEF * entropy_shortfall
    loss = agg_loss(loss_mat, mask, loss_agg_mode, **stats)
    return loss, {
        "pg_loss@sum": loss.detach(),
        "clipfrac@sum": token_mean_metric(clipped, mask, stats["batch_num_tokens"]),
        "entropy@sum": token_mean_metric(output["entropy"], mask, stats["batch_num_tokens"]),
        **correction_metrics,
    }


class CappedAdvantagePipeline(PPOPipeline):
    def loss_func(self, batch, output):
        a = self.algorithm
        return capped_loss(batch, output, a.loss_agg_mode, a.rollout_is, a.rollout_is_cap)
