"""The engine / trainer mismatch, measured every step (docs/rollout.md, "Mismatch metrics").

On each token t of the loss mask, Δ_t = log π_engine(y_t) - log π_trainer(y_t): the log-prob the
engine sampled y_t with, minus the actor's (its old log-probs, or the training forward's on an
on-policy step); r_t = exp(-Δ_t) = π_trainer / π_engine is the token's importance ratio.

A step's tokens are spread over micro-batches and ranks, whose metrics are reduced as scalars
(roll_lite.runtime.metrics), and a median is no sum of micro-batch medians. So each micro-batch
reports mergeable raw sums (`mismatch_sums`: counts, sums, maxima and a histogram of |Δ|, named
'mismatch/<split>/...'), and the controller turns the step's reduced sums into the metrics
(`mismatch_metrics`). The quantiles come from the histogram: bins 20 to a decade from 1e-7 to 1e2
(each 12% wide), the quantile reported as the upper edge of the bin that holds it, capped at the
exact max, so p50 <= p99 <= max always and each is at most 12% above the exact value (below 1e-7:
reported as 1e-7, or the max if smaller).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping

import torch

if TYPE_CHECKING:
    from roll_lite.data.proto import DataProto

GAP_FLOOR = 1e-7
BINS_PER_DECADE = 20
FINITE_BINS = 9 * BINS_PER_DECADE  # [1e-7, 1e2)
# bin 0: |Δ| < GAP_FLOOR; bin k in 1..FINITE_BINS: [edge(k - 1), edge(k)); the last: >= 1e2 (or not finite)
OVERFLOW_BIN = FINITE_BINS + 1
QUANTILES = (("p50", 0.5), ("p99", 0.99))
RAW = "mismatch/"  # the raw sums' prefix among a loss's metrics
ALL, CURRENT, OLDER = "all", "current_weights", "older_weights"


def upper_edge(index: int) -> float:
    """The upper edge of histogram bin `index` (inf for the overflow bin)."""
    return math.inf if index >= OVERFLOW_BIN else GAP_FLOOR * 10 ** (index / BINS_PER_DECADE)


def gap_bins(gaps: torch.Tensor) -> torch.Tensor:
    """Each |Δ|'s histogram bin (long), in float64 so that a bin does not depend on the input dtype."""
    gaps = gaps.double()
    scaled = torch.log10(gaps.clamp(min=GAP_FLOOR) / GAP_FLOOR) * BINS_PER_DECADE
    bins = torch.nan_to_num(scaled, nan=OVERFLOW_BIN, posinf=OVERFLOW_BIN).floor().long() + 1
    bins = torch.where(gaps < GAP_FLOOR, torch.zeros_like(bins), bins.clamp(max=OVERFLOW_BIN))
    return torch.where(torch.isfinite(gaps), bins, torch.full_like(bins, OVERFLOW_BIN))


def histogram_quantile(counts: list[float], q: float, maximum: float) -> float:
    """The nearest-rank q-quantile (the smallest value at least q of the values are <= to), as the upper
    edge of the bin that holds it, capped at `maximum`. `counts`: per bin; at least one value."""
    total = sum(counts)
    rank = max(1, math.ceil(q * total))
    seen = 0.0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return min(upper_edge(index), maximum)
    return maximum


def current_weights_mask(
    mask: torch.Tensor, versions: torch.Tensor | None, actor_version: int, weights_behind: int
) -> torch.Tensor:
    """Which tokens the actor's current weights sampled: by each token's weight version where the batch
    has them (fully async: 'rollout_versions'), else all or none by the batch's staleness."""
    if versions is not None:
        return versions == actor_version
    return torch.full_like(mask, weights_behind == 0, dtype=torch.bool)


def mismatch_sums(
    engine_log_probs: torch.Tensor,
    trainer_log_probs: torch.Tensor,
    mask: torch.Tensor,
    band: tuple[float, float],
    current: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The raw sums (0-d float64 tensors on the CPU) of the tokens of `mask` (all), and with `current` (bool, same shape) of those the
    current weights sampled and the others: 'mismatch/<split>/<sum>@<reduction>'. A split without a
    token reports nothing."""
    keep = mask.bool()
    delta = torch.where(keep, engine_log_probs.detach().double() - trainer_log_probs.detach().double(), 0.0)
    sums = _split_sums(ALL, delta, keep, band)
    if current is not None:
        sums.update(_split_sums(CURRENT, delta, keep & current.bool(), band))
        sums.update(_split_sums(OLDER, delta, keep & ~current.bool(), band))
    return sums


def _split_sums(
    split: str, delta: torch.Tensor, keep: torch.Tensor, band: tuple[float, float]
) -> dict[str, torch.Tensor]:
    row_tokens = keep.sum(-1)
    rows = row_tokens > 0
    if not bool(rows.any()):
        return {}
    delta = torch.where(keep, delta, 0.0)  # this split's tokens only: a row's others are another split's
    gaps = delta.abs()[keep]
    log_ratio = -delta  # log r = log π_trainer - log π_engine
    low = math.log(band[0]) if band[0] > 0 else -math.inf
    out_of_band = keep & ((log_ratio < low) | (log_ratio > math.log(band[1])))
    # KL(π_engine ‖ π_trainer) per sequence, from the engine's samples: k1 = Δ, k3 = (r - 1) - log r
    k3 = torch.where(keep, torch.expm1(log_ratio) - log_ratio, 0.0)
    per_row = torch.stack([delta.sum(-1), k3.sum(-1)]) / row_tokens.clamp(min=1)
    seq_k1, seq_k3 = per_row[:, rows]
    values = torch.stack(
        [
            keep.sum().double(),
            out_of_band.sum().double(),
            gaps.max(),
            rows.sum().double(),
            seq_k1.sum(),
            seq_k1.max(),
            seq_k3.sum(),
            seq_k3.max(),
        ]
    ).cpu()
    names = ["tokens@sum", "out_of_band@sum", "gap_max@max", "seqs@sum"]
    names += ["seq_k1@sum", "seq_k1_max@max", "seq_k3@sum", "seq_k3_max@max"]
    sums = {f"{RAW}{split}/{name}": value for name, value in zip(names, values.unbind())}
    counts = torch.bincount(gap_bins(gaps), minlength=OVERFLOW_BIN + 1).double().cpu()
    sums.update({f"{RAW}{split}/bin{index}@sum": counts[index] for index in counts.nonzero().flatten().tolist()})
    return sums


def asked_mismatch_sums(
    batch: DataProto, engine_log_probs: torch.Tensor, trainer_log_probs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The raw sums the controller asked a loss for in meta_info['mismatch'] (pipelines/mismatch.py:
    band, split_versions, actor_version, weights_behind), or none when it did not ask."""
    asked = batch.meta_info.get("mismatch")
    if asked is None:
        return {}
    current = None
    if asked["split_versions"]:
        versions = batch.batch.get("rollout_versions")
        current = current_weights_mask(mask, versions, asked["actor_version"], asked["weights_behind"])
    return mismatch_sums(engine_log_probs, trainer_log_probs, mask, tuple(asked["band"]), current)


def pop_raw(metrics: dict[str, float]) -> dict[str, float]:
    """The raw sums taken out of a train step's reduced metrics (their reduction suffix already gone)."""
    return {name: metrics.pop(name) for name in [name for name in metrics if name.startswith(RAW)]}


def mismatch_metrics(raw: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The metrics of a step's reduced raw sums (roll_lite.runtime.metrics.reduce_metrics), each split under
    `prefix` (all tokens) or `prefix`/current_weights, `prefix`/older_weights:
    tokens, logp_gap_p50 / _p99 / _max (of |Δ| per token), ratio_out_of_band (the share of tokens whose
    r is outside the band), seq_kl_k1_mean / _max and seq_kl_k3_mean / _max (over sequences, each the
    mean of k1 = Δ or k3 = (r - 1) - log r over its tokens)."""
    metrics = {}
    for split in (ALL, CURRENT, OLDER):
        tokens = raw.get(f"{RAW}{split}/tokens")
        if not tokens:
            continue
        get = lambda name: float(raw[f"{RAW}{split}/{name}"])  # noqa: E731
        base = prefix if split == ALL else f"{prefix}/{split}"
        counts = [float(raw.get(f"{RAW}{split}/bin{index}", 0.0)) for index in range(OVERFLOW_BIN + 1)]
        metrics[f"{base}/tokens"] = float(tokens)
        for name, q in QUANTILES:
            metrics[f"{base}/logp_gap_{name}"] = histogram_quantile(counts, q, get("gap_max"))
        metrics[f"{base}/logp_gap_max"] = get("gap_max")
        metrics[f"{base}/ratio_out_of_band"] = get("out_of_band") / float(tokens)
        for k in ("k1", "k3"):
            metrics[f"{base}/seq_kl_{k}_mean"] = get(f"seq_{k}") / get("seqs")
            metrics[f"{base}/seq_kl_{k}_max"] = get(f"seq_{k}_max")
    return metrics
