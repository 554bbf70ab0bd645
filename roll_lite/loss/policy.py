"""Policy losses: the per-token PPO clipped surrogate and the GSPO-style sequence ratio, and the
built-in policy loss_funcs built on them (BUILTIN_LOSSES: by name, with the masks they need).

Every loss zeroes its inputs outside its mask (`zero_outside`) before any arithmetic: a nan or
inf at a prompt or padding position (user data, a reward that failed) then changes nothing, and
the step equals the clean one bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, cast

import torch

from roll_lite.loss.aggregation import agg_loss, mask_stats, masked_sum, token_mean_metric, zero_outside
from roll_lite.loss.correction import RolloutCorrection, bypass_old_log_probs, rollout_correction
from roll_lite.loss.kl import kl_penalty

if TYPE_CHECKING:
    from roll_lite.data.proto import DataProto
    from roll_lite.strategy.micro_batches import LossFunc


def ppo_clipped_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token, with asymmetric clip and optional dual-clip (c > 1).

    Returns (loss_mat, clipped) where `clipped` is 1.0 where the clipped branch was taken.
    """
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = -advantages * clipped_ratio
    loss = torch.maximum(unclipped, clipped)
    was_clipped = (clipped > unclipped).to(log_probs.dtype)
    if dual_clip_c is not None:
        if dual_clip_c <= 1.0:
            raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
        # For negative advantages the loss is bounded by -c·A (Ye et al., 2020).
        bounded = torch.minimum(loss, -advantages * dual_clip_c)
        loss = torch.where(advantages < 0, bounded, loss)
    return loss, was_clipped


def sequence_ratio_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    seq_advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
) -> torch.Tensor:
    """GSPO-style sequence-level clipped loss, one value per row broadcast over the row's tokens.

    s_i = exp(mean_t (logp - old_logp)) over row i's masked tokens; loss_i = max(-A_i·s_i, -A_i·clip(s_i)).
    With seq-mean-token-mean aggregation this is Σ_i loss_i / B_valid.
    """
    ratio = torch.exp(_mean_log_ratio(log_probs, old_log_probs, mask))
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    row_loss = torch.maximum(-seq_advantages * ratio, -seq_advantages * clipped_ratio)
    return row_loss.unsqueeze(-1).expand_as(log_probs)


def sequence_ratio_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO-token (Zheng et al., 2025, eq. 13-14): s_it = sg[s_i] · π(y_t) / sg[π(y_t)], whose value is
    the sequence ratio s_i and whose gradient is token t's own; loss_it = max(-A_it·s_it, -A_it·clip(s_it)).
    With the same advantage on every token of a row it equals GSPO in value and gradient; it lets
    per-token advantages through. Returns (loss_mat, clipped: 1.0 on the rows' tokens that were clipped)."""
    sequence_log_ratio = _mean_log_ratio(log_probs, old_log_probs, mask).detach()
    ratio = torch.exp(sequence_log_ratio.unsqueeze(-1) + log_probs - log_probs.detach())
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    unclipped, clipped = -advantages * ratio, -advantages * clipped_ratio
    return torch.maximum(unclipped, clipped), (clipped > unclipped).to(log_probs.dtype)


def _mean_log_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[rows]: the mean over each row's masked tokens of log π - log π_old."""
    return _row_mean(log_probs - old_log_probs, mask)


def _row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[rows]: the mean of `values` over each row's masked tokens (0 for a row without any)."""
    return masked_sum(values, mask, dim=-1) / mask.sum(-1).to(values.dtype).clamp(min=1.0)


def cispo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio_low: float = 1.0,
    clip_ratio_high: float = 0.28,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, Chen et al., 2025, eq. 4-5) per token: -sg(clip(r_t, 1 - ε_low, 1 + ε_high)) ·
    A_t · log π(y_t), r_t = π(y_t) / π_old(y_t). The importance weight is clipped, not the update: every
    token keeps its gradient, A_t·∇log π scaled by the clipped weight. MiniMax sets no lower bound
    (ε_low large: 1.0 gives 0) and tunes ε_high. Returns (loss_mat, clipped: 1.0 where the weight was cut)."""
    ratio = torch.exp(log_probs - old_log_probs).detach()
    weight = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    return -weight * advantages * log_probs, (weight != ratio).to(log_probs.dtype)


def old_log_probs(batch: DataProto, output: dict[str, torch.Tensor], bypass: bool = False) -> torch.Tensor:
    """The behaviour policy's log-probs: batch['old_log_probs'], or, when the controller marked the
    step strictly on-policy (one optimizer step per rollout), the training forward's own log-probs
    detached: they are the same numbers, so the extra forward is skipped. With `bypass`
    (algorithm.rollout_bypass: the loss's π_old is the engine's) a step may skip that forward too:
    then the training forward's, detached, are π_actor for the rollout correction."""
    if "old_log_probs" in batch.batch:
        return batch["old_log_probs"]
    if bypass or batch.meta_info.get("on_policy", False):
        return output["log_probs"].detach()
    raise KeyError("the batch has no 'old_log_probs' and meta_info['on_policy'] is not set")


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
    correction: RolloutCorrection | None = None,
) -> LossFunc:
    """Token-level PPO clipped surrogate (+ optional entropy bonus). Needs batch tensors
    old_log_probs and advantages, and `mask_key` in loss_mask_keys. correction: the rollout correction
    on the engine's log-probs (RolloutCorrection: TIS, masks, veto, bypass); rollout_is /
    rollout_is_cap: TIS alone, the older form."""

    def per_token(
        log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, advantages: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return ppo_clipped_loss(
            log_probs, behaviour_log_probs, advantages, clip_ratio_low, clip_ratio_high, dual_clip_c
        )

    return _token_policy_loss_func(
        per_token,
        loss_agg_mode,
        entropy_coef,
        seq_len_norm,
        mask_key,
        RolloutCorrection.resolve(correction, rollout_is, rollout_is_cap),
    )


def cispo_policy_loss_func(
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 1.0,
    clip_ratio_high: float = 0.28,
    entropy_coef: float = 0.0,
    seq_len_norm: float | None = None,
    mask_key: str = "response_mask",
    rollout_is: str | None = None,
    rollout_is_cap: float = 2.0,
    correction: RolloutCorrection | None = None,
) -> LossFunc:
    """CISPO (cispo_loss): the clipped, detached importance weight times A·log π, token by token;
    MiniMax-M1 aggregates it by token-mean. Options as for the PPO loss."""

    def per_token(
        log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, advantages: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return cispo_loss(log_probs, behaviour_log_probs, advantages, clip_ratio_low, clip_ratio_high)

    return _token_policy_loss_func(
        per_token,
        loss_agg_mode,
        entropy_coef,
        seq_len_norm,
        mask_key,
        RolloutCorrection.resolve(correction, rollout_is, rollout_is_cap),
    )


def _policy_inputs(
    batch: DataProto, output: dict[str, torch.Tensor], mask: torch.Tensor, correction: RolloutCorrection
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log π, the actor's π_old: what the correction compares the engine with, the π_old the loss's
    ratio is taken against: the engine's with rollout_bypass, A), each zeroed outside the mask."""
    log_probs, actor_log_probs, advantages = zero_outside(
        mask, output["log_probs"], old_log_probs(batch, output, correction.rollout_bypass), batch["advantages"]
    )
    return log_probs, actor_log_probs, bypass_old_log_probs(batch, mask, actor_log_probs, correction), advantages


def _corrected(
    loss_mat: torch.Tensor,
    batch: DataProto,
    actor_log_probs: torch.Tensor,
    mask: torch.Tensor,
    stats: dict[str, torch.Tensor],
    correction: RolloutCorrection,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss_mat times the rollout correction's weights, when it asks for any; its metrics)."""
    weights, metrics = rollout_correction(batch, actor_log_probs, mask, stats, correction=correction)
    return (loss_mat if weights is None else loss_mat * weights), metrics


def _token_policy_loss_func(
    per_token: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    loss_agg_mode: str,
    entropy_coef: float,
    seq_len_norm: float | None,
    mask_key: str,
    correction: RolloutCorrection,
) -> LossFunc:
    """A policy loss_func from a per-token loss (log π, log π_old, A) -> (loss_mat, clipped)."""

    def loss_func(batch: DataProto, output: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask, stats = batch[mask_key], mask_stats(batch.meta_info, mask_key)
        log_probs, actor_log_probs, behaviour_log_probs, advantages = _policy_inputs(batch, output, mask, correction)
        loss_mat, clipped = per_token(log_probs, behaviour_log_probs, advantages)
        loss_mat, correction_metrics = _corrected(loss_mat, batch, actor_log_probs, mask, stats, correction)
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
    token_level: bool = False,
    correction: RolloutCorrection | None = None,
) -> LossFunc:
    """GSPO: one importance ratio per sequence, the geometric mean of its token ratios, clipped per
    sequence; the sequence's advantage is the mean of `advantages` over its masked tokens. With
    token_level, GSPO-token (sequence_ratio_token_loss): each token keeps its own advantage.
    correction, rollout_is: as for the PPO loss."""
    correction = RolloutCorrection.resolve(correction, rollout_is, rollout_is_cap)

    def loss_func(batch: DataProto, output: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask, stats = batch[mask_key], mask_stats(batch.meta_info, mask_key)
        log_probs, actor_log_probs, behaviour_log_probs, advantages = _policy_inputs(batch, output, mask, correction)
        if token_level:
            loss_mat, _ = sequence_ratio_token_loss(
                log_probs, behaviour_log_probs, advantages, mask, clip_ratio_low, clip_ratio_high
            )
        else:
            loss_mat = sequence_ratio_loss(
                log_probs, behaviour_log_probs, _row_mean(advantages, mask), mask, clip_ratio_low, clip_ratio_high
            )
        loss_mat, correction_metrics = _corrected(loss_mat, batch, actor_log_probs, mask, stats, correction)
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
    policy_loss: LossFunc | None = None,
    **policy_options: Any,
) -> LossFunc:
    """A policy loss on one mask plus a KL-to-reference loss on another (or the same) mask: each
    aggregated with its own global stats. Needs ref_log_probs in the batch. Reports 'kl' (the
    token mean of the estimate over the KL mask) whatever kl_coef is. kl_clamp: see kl_penalty.
    policy_loss: a loss_func (any of POLICY_LOSSES', or a user's); default PPO on policy_mask_key
    with `policy_options`."""
    if policy_loss is None:
        policy_loss = ppo_policy_loss_func(
            loss_agg_mode, seq_len_norm=seq_len_norm, mask_key=policy_mask_key, **policy_options
        )

    def loss_func(batch: DataProto, output: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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


def gspo_token_policy_loss_func(*args: Any, **kwargs: Any) -> LossFunc:
    """GSPO-token: sequence_policy_loss_func with token_level=True."""
    # cast: mypy cannot tell that `args` stops before token_level (more would be a TypeError, as it should)
    return cast("Callable[..., LossFunc]", sequence_policy_loss_func)(*args, token_level=True, **kwargs)


# algorithm.policy_loss: the actor's loss by name. Each factory takes (loss_agg_mode, clip_ratio_low=,
# clip_ratio_high=, seq_len_norm=, mask_key=, correction=RolloutCorrection(...), or the older
# rollout_is=, rollout_is_cap=) and has its own clip defaults.
POLICY_LOSSES: dict[str, Callable[..., LossFunc]] = {
    "ppo": ppo_policy_loss_func,
    "gspo": sequence_policy_loss_func,
    "gspo_token": gspo_token_policy_loss_func,
    "cispo": cispo_policy_loss_func,
}

BUILTIN_LOSSES: dict[str, tuple[Callable[..., LossFunc], list[str]]] = {
    "ppo": (ppo_policy_loss_func, ["response_mask"]),
    "sequence": (sequence_policy_loss_func, ["response_mask"]),  # GSPO
    "gspo_token": (gspo_token_policy_loss_func, ["response_mask"]),
    "cispo": (cispo_policy_loss_func, ["response_mask"]),
    "ppo_kl": (kl_regularized_loss_func, ["response_mask", "kl_mask"]),
}
