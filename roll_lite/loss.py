"""Loss aggregation and per-token losses: pure tensor functions, no distributed code.

All tensors are [batch, seq] and token-aligned: position t holds the quantity for token t of the
row (its log-prob given the tokens before it). A mask marks which tokens a loss counts.

`agg_loss` always takes its denominators from the caller. Inside a training step they are the
global ones the strategy put in `micro_batch.meta_info` (see `mask_stats`); outside one, compute
them explicitly with `local_mask_stats(mask)`. There is no silent fallback to the micro-batch.
"""

from __future__ import annotations

from typing import Mapping

import torch

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def check_binary_mask(mask: torch.Tensor, name: str) -> None:
    """Masks are 0/1 (or bool): a token counts or it does not. Weighted masks are rejected rather
    than binarised; to weight tokens, multiply the per-token loss by the weights instead."""
    if mask.dtype == torch.bool:
        return
    if not bool(((mask == 0) | (mask == 1)).all()):
        bad = mask[(mask != 0) & (mask != 1)]
        raise ValueError(
            f"mask '{name}' holds values other than 0 and 1 (e.g. {bad.flatten()[0].item()!r}); masks mark which "
            "tokens count and are not weights: multiply the per-token loss by your weights instead"
        )


def zero_outside(mask: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each tensor with exact zeros where `mask` is 0, whatever it held there (nan, inf, garbage).

    Call it on a loss's inputs before any arithmetic: torch.where passes no gradient to the
    masked-out branch, so a nan outside the mask can no longer turn 0·nan into a nan gradient."""
    keep = mask.bool()
    return tuple(torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device)) for t in tensors)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Σ mask·values, where masked-out positions count as exactly zero even if they hold nan/inf."""
    zeros = torch.zeros((), dtype=values.dtype, device=values.device)
    masked = torch.where(mask.bool(), values, zeros)
    return masked.sum() if dim is None else masked.sum(dim)


def local_mask_stats(mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The denominators of `mask` alone: for use outside a training step (eval, tests)."""
    return {
        "batch_num_tokens": mask.sum().to(torch.float64),
        "global_valid_samples": (mask.sum(-1) > 0).sum().to(torch.float64),
    }


def mask_stats(meta_info: Mapping, mask_key: str) -> dict[str, torch.Tensor]:
    """The global denominators the strategy computed for `mask_key` for this optimizer step."""
    missing = [name for name in ("batch_num_tokens", "global_valid_samples") if mask_key not in meta_info.get(name, {})]
    if missing:
        raise KeyError(
            f"meta_info has no {' / '.join(missing)} for mask '{mask_key}': add '{mask_key}' to "
            f"data.meta_info['loss_mask_keys'] so the strategy computes its global stats "
            f"(keys present: {sorted(meta_info.get('batch_num_tokens', {}))})"
        )
    return {
        "batch_num_tokens": meta_info["batch_num_tokens"][mask_key],
        "global_valid_samples": meta_info["global_valid_samples"][mask_key],
    }


def _safe_denominator(denominator, like: torch.Tensor) -> torch.Tensor:
    # A zero denominator means every numerator term is zero too (no valid token anywhere): divide
    # by one instead, so the loss and its gradient are 0, never nan.
    return torch.as_tensor(denominator, dtype=like.dtype, device=like.device).clamp(min=1.0)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    batch_num_tokens=None,
    global_valid_samples=None,
    seq_len_norm: float | None = None,
) -> torch.Tensor:
    """Aggregate a [batch, seq] per-token loss into this micro-batch's share of the global loss.

    token-mean:              Σ m·L / batch_num_tokens
    seq-mean-token-sum:      Σ_i (Σ_t m·L) / global_valid_samples
    seq-mean-token-mean:     Σ_i (Σ_t m·L / N_i) / global_valid_samples      (N_i = Σ_t m of row i)
    seq-mean-token-sum-norm: Σ m·L / (global_valid_samples · seq_len_norm)  (Dr. GRPO; constant norm)

    Summed over all micro-batches of a step, the result is the loss of the whole global batch.
    """
    if loss_agg_mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode '{loss_agg_mode}'; choose one of {', '.join(AGG_MODES)}")
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(f"agg_loss: loss_mat {tuple(loss_mat.shape)} and loss_mask {tuple(loss_mask.shape)} differ")
    needed = "batch_num_tokens" if loss_agg_mode == "token-mean" else "global_valid_samples"
    given = batch_num_tokens if loss_agg_mode == "token-mean" else global_valid_samples
    if given is None:
        raise ValueError(
            f"agg_loss({loss_agg_mode}) needs {needed}: inside a training step pass "
            f"**mask_stats(micro_batch.meta_info, mask_key); outside one pass **local_mask_stats(mask)"
        )
    check_binary_mask(loss_mask, "loss_mask")
    mask = loss_mask.bool()
    if loss_agg_mode == "token-mean":
        return masked_sum(loss_mat, mask) / _safe_denominator(batch_num_tokens, loss_mat)
    row_sums = masked_sum(loss_mat, mask, dim=-1)
    if loss_agg_mode == "seq-mean-token-sum":
        return row_sums.sum() / _safe_denominator(global_valid_samples, loss_mat)
    if loss_agg_mode == "seq-mean-token-mean":
        row_tokens = mask.sum(-1).to(loss_mat.dtype)
        return (row_sums / row_tokens.clamp(min=1.0)).sum() / _safe_denominator(global_valid_samples, loss_mat)
    if seq_len_norm is None or seq_len_norm <= 0:
        raise ValueError(
            "agg_loss(seq-mean-token-sum-norm) needs seq_len_norm > 0: a constant such as the max response "
            f"length from config, never the micro-batch's padded length (got {seq_len_norm})"
        )
    return row_sums.sum() / (_safe_denominator(global_valid_samples, loss_mat) * seq_len_norm)


def token_mean_metric(values: torch.Tensor, mask: torch.Tensor, batch_num_tokens) -> torch.Tensor:
    """This micro-batch's share of a global token mean (report it with the '@sum' suffix)."""
    return masked_sum(values.detach(), mask) / _safe_denominator(batch_num_tokens, values)


# -- per-token losses ----------------------------------------------------------------------------


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
    row_tokens = mask.sum(-1).to(log_probs.dtype).clamp(min=1.0)
    mean_log_ratio = masked_sum(log_probs - old_log_probs, mask, dim=-1) / row_tokens
    ratio = torch.exp(mean_log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    row_loss = torch.maximum(-seq_advantages * ratio, -seq_advantages * clipped_ratio)
    return row_loss.unsqueeze(-1).expand_as(log_probs)


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


def kl_penalty(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str = "k3", clamp: float | None = None
) -> torch.Tensor:
    """Per-token estimate of KL(π || π_ref) from samples of π (Schulman's k1, k2, k3).

    clamp=None (the default) gives the exact estimate. clamp=c > 0 clamps it to [-c, c], which
    zeroes the gradient of the clamped tokens (verl clamps k3 to [-10, 10] always). The log-ratio is
    first clamped to ±(c + 1): every estimator is already beyond ±c there (|k1| = |x|,
    k2 ≥ |x| - 1/2, k3 ≥ |x| - 1), so values inside [-c, c] stay exact and, for c below float32's
    exp range (~87), no exp overflows to inf (which would turn the zero gradient into 0·inf = nan).
    """
    log_ratio = log_probs - ref_log_probs
    if clamp is not None:
        if clamp <= 0:
            raise ValueError(f"kl_penalty: clamp must be > 0 or None, got {clamp}")
        log_ratio = log_ratio.clamp(-clamp - 1.0, clamp + 1.0)
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = 0.5 * log_ratio.square()
    elif estimator == "k3":
        # exp(-x) - 1 + x with x = log π - log π_ref: unbiased and non-negative.
        kl = torch.expm1(-log_ratio) + log_ratio
    else:
        raise ValueError(f"unknown KL estimator '{estimator}'; choose one of k1, k2, k3")
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_range: float = 0.2
) -> torch.Tensor:
    """PPO value loss per token: 0.5·max((V - R)², (clip(V, V_old ± ε) - R)²)."""
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    return 0.5 * torch.maximum((values - returns).square(), (clipped_values - returns).square())
