"""Built-in loss_funcs: `loss_func(micro_batch, model_output) -> (loss, metrics)`.

Each reads the global denominators of its mask(s) from `micro_batch.meta_info` (put there by the
strategy for every key in `meta_info['loss_mask_keys']`), so the sum of its values over all
micro-batches and ranks of a step is the loss of the whole global batch. Losses and global-mean
metrics are reported with '@sum'. A custom loss_func should follow the same pattern.

Every loss zeroes its inputs outside its mask (`zero_outside`) before any arithmetic: a nan or
inf at a prompt or padding position (user data, a reward that failed) then changes nothing, and
the step equals the clean one bit for bit.
"""

from __future__ import annotations

from roll_lite.loss import (
    agg_loss,
    clipped_value_loss,
    kl_penalty,
    mask_stats,
    masked_sum,
    ppo_clipped_loss,
    rollout_importance_weights,
    sequence_ratio_loss,
    token_mean_metric,
    zero_outside,
)


def old_log_probs(batch, output):
    """The behaviour policy's log-probs: batch['old_log_probs'], or, when the controller marked the
    step strictly on-policy (one optimizer step per rollout), the training forward's own log-probs
    detached: they are the same numbers, so the extra forward is skipped."""
    if "old_log_probs" in batch.batch:
        return batch["old_log_probs"]
    if batch.meta_info.get("on_policy", False):
        return output["log_probs"].detach()
    raise KeyError("the batch has no 'old_log_probs' and meta_info['on_policy'] is not set")


def rollout_correction(batch, behaviour_log_probs, mask, stats, rollout_is: str | None, rollout_is_cap: float):
    """(TIS weights or None, metrics) for the gap between the rollout engine and the actor.

    With the engine's log-probs in the batch ('rollout_log_probs') it reports |Δ log p| between the
    actor's old log-probs and the engine's (token mean and max); with `rollout_is` ('token' or
    'sequence') it also returns the truncated importance weights (roll_lite.loss) to multiply the
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


def ppo_policy_loss_func(
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    dual_clip_c: float | None = None,
    entropy_coef: float = 0.0,
    seq_len_norm: float | None = None,
    mask_key: str = "response_mask",
    rollout_is: str | None = None,
    rollout_is_cap: float = 2.0,
):
    """Token-level PPO clipped surrogate (+ optional entropy bonus). Needs batch tensors
    old_log_probs and advantages, and `mask_key` in loss_mask_keys. rollout_is: truncated importance
    sampling on the engine's log-probs (rollout_correction)."""

    def loss_func(batch, output):
        mask, stats = batch[mask_key], mask_stats(batch.meta_info, mask_key)
        log_probs, behaviour_log_probs, advantages = zero_outside(
            mask, output["log_probs"], old_log_probs(batch, output), batch["advantages"]
        )
        loss_mat, clipped = ppo_clipped_loss(
            log_probs, behaviour_log_probs, advantages, clip_ratio_low, clip_ratio_high, dual_clip_c
        )
        is_weights, correction_metrics = rollout_correction(batch, behaviour_log_probs, mask, stats, rollout_is, rollout_is_cap)
        if is_weights is not None:
            loss_mat = loss_mat * is_weights
        pg_loss = agg_loss(loss_mat, mask, loss_agg_mode, **stats, seq_len_norm=seq_len_norm)
        loss = pg_loss
        metrics = {
            "pg_loss@sum": pg_loss.detach(),
            "clipfrac@sum": token_mean_metric(clipped, mask, stats["batch_num_tokens"]),
            "approx_kl@sum": token_mean_metric(behaviour_log_probs - log_probs, mask, stats["batch_num_tokens"]),
            **correction_metrics,
        }
        if "entropy" in output:
            (entropy,) = zero_outside(mask, output["entropy"])
            metrics["entropy@sum"] = token_mean_metric(entropy, mask, stats["batch_num_tokens"])
            if entropy_coef:
                entropy_loss = agg_loss(entropy, mask, loss_agg_mode, **stats, seq_len_norm=seq_len_norm)
                loss = loss - entropy_coef * entropy_loss
        elif entropy_coef:
            raise KeyError("entropy_coef > 0 needs the model output's 'entropy'")
        return loss, metrics

    return loss_func


def sequence_policy_loss_func(
    loss_agg_mode: str = "seq-mean-token-mean",
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    seq_len_norm: float | None = None,
    mask_key: str = "response_mask",
    rollout_is: str | None = None,
    rollout_is_cap: float = 2.0,
):
    """Sequence-level (GSPO-style) clipped loss: one importance ratio per sequence. The sequence's
    advantage is the mean of `advantages` over its masked tokens. rollout_is: as for the PPO loss."""

    def loss_func(batch, output):
        mask, stats = batch[mask_key], mask_stats(batch.meta_info, mask_key)
        log_probs, behaviour_log_probs, advantages = zero_outside(
            mask, output["log_probs"], old_log_probs(batch, output), batch["advantages"]
        )
        row_tokens = mask.sum(-1).clamp(min=1).to(advantages.dtype)
        seq_advantages = masked_sum(advantages, mask, dim=-1) / row_tokens
        loss_mat = sequence_ratio_loss(
            log_probs, behaviour_log_probs, seq_advantages, mask, clip_ratio_low, clip_ratio_high
        )
        is_weights, correction_metrics = rollout_correction(batch, behaviour_log_probs, mask, stats, rollout_is, rollout_is_cap)
        if is_weights is not None:
            loss_mat = loss_mat * is_weights
        loss = agg_loss(loss_mat, mask, loss_agg_mode, **stats, seq_len_norm=seq_len_norm)
        return loss, {"seq_pg_loss@sum": loss.detach(), **correction_metrics}

    return loss_func


def kl_regularized_loss_func(
    loss_agg_mode: str = "token-mean",
    kl_coef: float = 0.1,
    kl_estimator: str = "k3",
    seq_len_norm: float | None = None,
    policy_mask_key: str = "response_mask",
    kl_mask_key: str = "kl_mask",
    kl_clamp: float | None = None,
    **policy_options,
):
    """PPO policy loss on one mask plus a KL-to-reference loss on another (or the same) mask: each
    aggregated with its own global stats. Needs ref_log_probs in the batch. Reports 'kl' (the
    token mean of the estimate over the KL mask) whatever kl_coef is. kl_clamp: see kl_penalty."""
    policy_loss = ppo_policy_loss_func(loss_agg_mode, seq_len_norm=seq_len_norm, mask_key=policy_mask_key, **policy_options)

    def loss_func(batch, output):
        loss, metrics = policy_loss(batch, output)
        kl_stats, kl_mask = mask_stats(batch.meta_info, kl_mask_key), batch[kl_mask_key]
        log_probs, ref_log_probs = zero_outside(kl_mask, output["log_probs"], batch["ref_log_probs"])
        kl_mat = kl_penalty(log_probs, ref_log_probs, kl_estimator, kl_clamp)
        metrics["kl@sum"] = token_mean_metric(kl_mat, kl_mask, kl_stats["batch_num_tokens"])
        if kl_coef:
            kl_loss = agg_loss(kl_mat, kl_mask, loss_agg_mode, **kl_stats, seq_len_norm=seq_len_norm)
            metrics["kl_loss@sum"] = kl_loss.detach()
            loss = loss + kl_coef * kl_loss
        return loss, metrics

    return loss_func


BUILTIN_LOSSES = {
    "ppo": (ppo_policy_loss_func, ["response_mask"]),
    "sequence": (sequence_policy_loss_func, ["response_mask"]),
    "ppo_kl": (kl_regularized_loss_func, ["response_mask", "kl_mask"]),
}


def sft_loss_func(mask_key: str = "response_mask"):
    """Supervised fine-tuning: token-mean negative log-likelihood of the masked tokens."""

    def loss_func(batch, output):
        mask, stats = batch[mask_key], mask_stats(batch.meta_info, mask_key)
        (log_probs,) = zero_outside(mask, output["log_probs"])
        loss = agg_loss(-log_probs, mask, "token-mean", **stats)
        return loss, {"sft_loss@sum": loss.detach()}

    return loss_func


def value_loss_func(loss_agg_mode: str = "token-mean", clip_range: float = 0.2, seq_len_norm: float | None = None,
                    mask_key: str = "response_mask"):
    """PPO critic: clipped value loss against batch 'returns', old values in batch 'values'. It goes
    through agg_loss with the global stats like every other loss (no local masked mean)."""

    def loss_func(batch, output):
        mask, stats = batch[mask_key], mask_stats(batch.meta_info, mask_key)
        values, old_values, returns = zero_outside(mask, output["values"], batch["values"], batch["returns"])
        loss_mat = clipped_value_loss(values, old_values, returns, clip_range)
        loss = agg_loss(loss_mat, mask, loss_agg_mode, **stats, seq_len_norm=seq_len_norm)
        clipped = ((values - old_values).abs() > clip_range).to(loss_mat.dtype)
        return loss, {"vf_loss@sum": loss.detach(), "vf_clipfrac@sum": token_mean_metric(clipped, mask, stats["batch_num_tokens"])}

    return loss_func
