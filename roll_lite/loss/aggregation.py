"""Loss aggregation and the injected global stats: pure tensor functions, no distributed code.

All tensors are [batch, seq] and token-aligned: position t holds the quantity for token t of the
row (its log-prob given the tokens before it). A mask marks which tokens a loss counts.

`agg_loss` always takes its denominators from the caller. Inside a training step they are the
global ones the strategy put in `micro_batch.meta_info` (see `mask_stats`); outside one, compute
them explicitly with `local_mask_stats(mask)`. There is no silent fallback to the micro-batch.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from roll_lite.data.masks import check_binary_mask

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def zero_outside(mask: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each tensor with exact zeros where `mask` is 0, whatever it held there (nan, inf, garbage).

    Call it on a loss's inputs before any arithmetic: torch.where passes no gradient to the
    masked-out branch, so a nan outside the mask can no longer turn 0·nan into a nan gradient."""
    keep = mask.bool()
    return tuple(torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device)) for t in tensors)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
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


def mask_stats(meta_info: Mapping[str, Any], mask_key: str) -> dict[str, torch.Tensor]:
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


def _safe_denominator(denominator: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    # A zero denominator means every numerator term is zero too (no valid token anywhere): divide
    # by one instead, so the loss and its gradient are 0, never nan.
    return torch.as_tensor(denominator, dtype=like.dtype, device=like.device).clamp(min=1.0)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    batch_num_tokens: torch.Tensor | float | None = None,
    global_valid_samples: torch.Tensor | float | None = None,
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


def token_mean_metric(values: torch.Tensor, mask: torch.Tensor, batch_num_tokens: torch.Tensor | float) -> torch.Tensor:
    """This micro-batch's share of a global token mean (report it with the '@sum' suffix)."""
    return masked_sum(values.detach(), mask) / _safe_denominator(batch_num_tokens, values)
