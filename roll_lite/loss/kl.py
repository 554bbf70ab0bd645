"""The per-token KL estimate to a reference policy, for the KL loss and KL-shaped rewards."""

from __future__ import annotations

import torch


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
