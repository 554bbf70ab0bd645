"""Rollout correction: the gap between the engine that sampled a batch (π_rollout: the batch's
'rollout_log_probs') and the actor that trains on it (π_actor: the actor's own old log-probs),
reported as metrics and, when asked, corrected. Every correction is a detached per-token weight on
the loss (docs/rollout.md, "Train / inference mismatch", has the formulas and their sources):

- truncated importance sampling (TIS), per token or per sequence: min(ratio, cap);
- masking (MIS): per token (IcePop), a token whose ratio π_actor / π_rollout is outside
  [low, high] gets weight 0; per sequence, a row whose geometric mean ratio is outside it;
- the veto: a row with any token ratio above τ or below 1 / τ gets weight 0;
- bypass: the engine's log-probs are the loss's π_old (no importance weight needed).

A dropped token keeps its place in the loss's denominators: those are the step's global mask stats
(mask_stats), fixed before the step and the same on every rank and micro-batch, so a correction can
only zero a token's term, never shrink the count it is divided by (IcePop's convention; verl removes
rejected tokens from its response mask instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch

from roll_lite.loss.aggregation import token_mean_metric, zero_outside
from roll_lite.loss.kl import kl_penalty
from roll_lite.loss.mismatch import asked_mismatch_sums

if TYPE_CHECKING:
    from roll_lite.data.proto import DataProto

ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_MASK_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class RolloutCorrection:
    """The correction settings, named as their algorithm.* config keys; each is off by default and
    they combine (TIS + token mask is IcePop's weight, e.g.). Bad values raise ValueError naming the key."""

    rollout_is: str | None = None  # TIS level: token | sequence
    rollout_is_cap: float = 2.0
    rollout_mask: str | None = None  # token | sequence (geometric mean over the row)
    rollout_mask_low: float = 0.5
    rollout_mask_high: float = 2.0
    rollout_veto_threshold: float | None = None  # τ > 1
    rollout_bypass: bool = False

    def __post_init__(self) -> None:
        if problems := self.problems(self):
            raise ValueError("; ".join(f"{key}: {message}" for key, message in problems))

    @staticmethod
    def problems(settings: Any) -> list[tuple[str, str]]:
        """(key, what is wrong) for each bad setting of `settings` (any object with these attributes)."""
        problems = []
        for key, levels in (("rollout_is", ROLLOUT_IS_LEVELS), ("rollout_mask", ROLLOUT_MASK_LEVELS)):
            if getattr(settings, key) is not None and getattr(settings, key) not in levels:
                problems.append((key, f"'{getattr(settings, key)}' is not one of {', '.join(levels)}"))
        if not settings.rollout_is_cap > 0:
            problems.append(("rollout_is_cap", f"must be > 0, got {settings.rollout_is_cap}"))
        low, high = settings.rollout_mask_low, settings.rollout_mask_high
        if not 0 <= low < 1 < high:
            problems.append(
                ("rollout_mask_low", f"the band [low, high] must hold 1: 0 <= low < 1 < high, got [{low}, {high}]")
            )
        veto = settings.rollout_veto_threshold
        if veto is not None and not veto > 1:
            problems.append(
                (
                    "rollout_veto_threshold",
                    f"must be > 1 or null (two-sided: a response goes when a token's "
                    f"ratio is > τ or < 1/τ, so verl's 1e-4 is τ = 1e4), got {veto}",
                )
            )
        if settings.rollout_bypass and settings.rollout_is:
            problems.append(
                (
                    "rollout_bypass",
                    "the engine's log-probs are then π_old, so the loss's ratio π_θ / "
                    "π_rollout already carries the importance weight, and rollout_is would apply it twice: "
                    "set that to null",
                )
            )
        return problems

    @classmethod
    def from_config(cls, algorithm: Any) -> RolloutCorrection:
        """From an object with the algorithm.rollout_* attributes (AlgorithmConfig)."""
        return cls(**{f.name: getattr(algorithm, f.name) for f in fields(cls)})

    @classmethod
    def resolve(
        cls, correction: RolloutCorrection | None, rollout_is: str | None, rollout_is_cap: float
    ) -> RolloutCorrection:
        """A loss factory's settings: `correction`, or TIS alone from the older rollout_is / rollout_is_cap."""
        if correction is None:
            return cls(rollout_is, rollout_is_cap)
        if rollout_is is not None:
            raise ValueError("pass rollout_is inside correction=RolloutCorrection(...), not beside it")
        return correction

    @property
    def weighted(self) -> bool:
        """Whether the loss gets weights (TIS, a mask or the veto)."""
        return bool(self.rollout_is or self.rollout_mask or self.rollout_veto_threshold is not None)

    def settings_on(self) -> list[tuple[str, object]]:
        """(key, value) of each correction that is on: rollout_is, rollout_mask, rollout_veto_threshold,
        rollout_bypass."""
        keys = ("rollout_is", "rollout_mask", "rollout_veto_threshold", "rollout_bypass")
        return [(key, getattr(self, key)) for key in keys if getattr(self, key) not in (None, False)]

    def describe(self) -> str:
        """The settings that are on, as config keys: 'algorithm.rollout_mask / algorithm.rollout_bypass'."""
        return " / ".join(f"algorithm.{key}" for key, _ in self.settings_on()) or "no rollout correction"


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


def rollout_drops(
    log_ratio: torch.Tensor, mask: torch.Tensor, correction: RolloutCorrection
) -> dict[str, torch.Tensor]:
    """What each mask of `correction` drops, from log_ratio = log π_actor - log π_rollout (0 outside
    the mask): 'token' [rows, seq] (outside [low, high]), 'sequence' and 'veto' [rows] (rows of the
    mask's tokens whose geometric mean ratio is outside [low, high] / that hold a token with a ratio
    above τ or below 1/τ). Bool; a row without a token of the mask is never dropped."""
    keep, drops = mask.bool(), {}
    row_has_tokens = keep.any(-1)
    low = math.log(correction.rollout_mask_low) if correction.rollout_mask_low > 0 else -math.inf
    high = math.log(correction.rollout_mask_high)
    if correction.rollout_mask == "token":
        drops["token"] = keep & ((log_ratio < low) | (log_ratio > high))
    if correction.rollout_mask == "sequence":
        row_tokens = keep.sum(-1).clamp(min=1).to(log_ratio.dtype)
        geometric_mean_log = torch.where(keep, log_ratio, 0.0).sum(-1) / row_tokens
        drops["sequence"] = row_has_tokens & ((geometric_mean_log < low) | (geometric_mean_log > high))
    if correction.rollout_veto_threshold is not None:
        bound = math.log(correction.rollout_veto_threshold)
        drops["veto"] = (keep & (log_ratio.abs() > bound)).any(-1)
    return drops


def _sequence_fraction(
    rows: torch.Tensor, global_valid_samples: torch.Tensor | float, dtype: torch.dtype
) -> torch.Tensor:
    """This micro-batch's share of the fraction of the step's sequences (rows with a token of the mask)."""
    denominator = torch.as_tensor(global_valid_samples, dtype=dtype, device=rows.device).clamp(min=1.0)
    return rows.to(dtype).sum() / denominator


def rollout_correction(
    batch: DataProto,
    behaviour_log_probs: torch.Tensor,
    mask: torch.Tensor,
    stats: dict[str, torch.Tensor],
    rollout_is: str | None = None,
    rollout_is_cap: float = 2.0,
    correction: RolloutCorrection | None = None,
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """(weights or None, metrics) for the gap between the rollout engine and the actor.

    `behaviour_log_probs` is the actor's own (π_actor: its old log-probs), whatever the loss's ratio is
    taken against. With the engine's log-probs in the batch ('rollout_log_probs') it reports, as token
    means over the mask ('@sum', exact over the step): rollout_logp_gap (|Δ log p|, and its max
    rollout_logp_gap_max '@max') and rollout_kl_k3, the k3 estimate of KL(π_rollout ‖ π_actor) from
    the engine's samples (Schulman, "Approximating KL divergence", 2020): with r = π_actor / π_rollout,
    k3 = (r - 1) - log r, unbiased because the tokens were drawn from π_rollout, and ≥ 0.

    `correction` (or TIS alone from rollout_is / rollout_is_cap, the older form) asks for weights,
    detached and 0 outside the mask, to multiply the per-token loss by: the TIS weight (or 1) times 0
    for what a mask or the veto dropped. Metrics then: rollout_is_weight / rollout_is_capped (TIS;
    token means), rollout_token_masked (fraction of tokens), rollout_seq_masked and rollout_vetoed
    (fractions of sequences), rollout_dropped (fraction of tokens with weight 0 from any of them)."""
    correction = RolloutCorrection.resolve(correction, rollout_is, rollout_is_cap)
    if "rollout_log_probs" not in batch.batch:
        if correction.weighted or correction.rollout_bypass:
            raise KeyError(f"{correction.describe()} needs the rollout engine's log-probs (batch 'rollout_log_probs')")
        return None, {}
    # zeroed outside the mask here too: a user's loss may hand in its inputs as they came
    engine = batch["rollout_log_probs"].to(behaviour_log_probs.dtype)
    actor, engine = zero_outside(mask, behaviour_log_probs.detach(), engine)
    tokens = stats["batch_num_tokens"]
    log_ratio = actor - engine
    gap = log_ratio.abs()
    metrics = {
        "rollout_logp_gap@sum": token_mean_metric(gap, mask, tokens),
        "rollout_logp_gap_max@max": gap.max() if gap.numel() else gap.new_zeros(()),
        # kl_penalty(π, π_ref): KL(π ‖ π_ref) from samples of π; here π = π_rollout, π_ref = π_actor
        "rollout_kl_k3@sum": token_mean_metric(kl_penalty(engine, actor, "k3"), mask, tokens),
    }
    metrics.update(asked_mismatch_sums(batch, engine, actor, mask))  # the controller's, when it asks
    if not correction.weighted:
        return None, metrics
    weights = mask.to(actor.dtype)
    if correction.rollout_is:
        weights, capped = rollout_importance_weights(
            actor, engine, mask, correction.rollout_is, correction.rollout_is_cap
        )
        metrics["rollout_is_weight@sum"] = token_mean_metric(weights, mask, tokens)
        metrics["rollout_is_capped@sum"] = token_mean_metric(capped, mask, tokens)
    drops = rollout_drops(log_ratio, mask, correction)
    if drops:
        dropped = torch.zeros_like(mask, dtype=torch.bool)
        if "token" in drops:
            dropped = dropped | drops["token"]
            metrics["rollout_token_masked@sum"] = token_mean_metric(drops["token"].to(actor.dtype), mask, tokens)
        for kind, name in (("sequence", "rollout_seq_masked@sum"), ("veto", "rollout_vetoed@sum")):
            if kind in drops:
                dropped = dropped | (drops[kind].unsqueeze(-1) & mask.bool())
                metrics[name] = _sequence_fraction(drops[kind], stats["global_valid_samples"], actor.dtype)
        metrics["rollout_dropped@sum"] = token_mean_metric(dropped.to(actor.dtype), mask, tokens)
        weights = torch.where(dropped, torch.zeros((), dtype=weights.dtype, device=weights.device), weights)
    return weights, metrics


def bypass_old_log_probs(
    batch: DataProto, mask: torch.Tensor, actor_log_probs: torch.Tensor, correction: RolloutCorrection
) -> torch.Tensor:
    """The log-probs a policy loss's ratio is taken against: the actor's old ones, or with
    rollout_bypass the engine's (π_old := π_rollout: the ratio is π_θ / π_rollout), 0 outside the mask."""
    if not correction.rollout_bypass:
        return actor_log_probs
    if "rollout_log_probs" not in batch.batch:
        raise KeyError("algorithm.rollout_bypass needs the rollout engine's log-probs (batch 'rollout_log_probs')")
    return zero_outside(mask, batch["rollout_log_probs"].to(actor_log_probs.dtype))[0]
