"""Advantage estimators and reward shaping: pure tensor functions, no distributed code.

Shapes follow roll_lite.loss.aggregation: [batch, seq] token-aligned tensors and a response mask
marking the generated tokens. Scores are one scalar per row ([batch]); `group_ids` ([batch], ints)
say which rows are samples of the same prompt.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy
import torch

from roll_lite.loss.aggregation import masked_sum
from roll_lite.loss.kl import kl_penalty

ADVANTAGE_ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp")


def last_token_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[batch, seq] rewards: each row's score on its last response token, zero elsewhere."""
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    rows = (last >= 0).nonzero().flatten()
    rewards[rows, last[rows]] = scores[rows]
    return rewards


def exact_sqrt(values: torch.Tensor) -> torch.Tensor:
    """sqrt correctly rounded to the dtype of `values` (float64 and narrower), equal on every CPU.

    torch.sqrt of a CPU tensor runs MKL's vector math, which is not correctly rounded: in float32 one
    value in five is one ulp off (differently on AVX-512 than on AVX2 CPUs), and on an Intel Xeon
    (AVX-512) float64 too, 0.7 % of values. numpy's sqrt is the CPU's IEEE instruction, correctly
    rounded; a float32 sqrt taken in float64 and rounded to float32 is the correctly rounded float32 one
    (53 >= 2 * 24 + 2 bits). CUDA's sqrt is correctly rounded already.
    """
    if values.device.type != "cpu":
        return torch.sqrt(values)
    roots = numpy.sqrt(values.detach().to(torch.float64).numpy())
    return torch.from_numpy(roots).to(values.dtype)


def _group_statistics(
    scores: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(groups), dtype=scores.dtype, device=scores.device).index_add_(0, inverse, scores)
    means = sums / counts
    squares = torch.zeros_like(sums).index_add_(0, inverse, (scores - means[inverse]) ** 2)
    # unbiased std as in GRPO; a group of one has no spread
    stds = exact_sqrt(squares / (counts - 1).clamp(min=1))
    return inverse, counts, sums, means, stds


def grpo_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    response_mask: torch.Tensor,
    normalize_std: bool = True,
    eps: float = 1e-6,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO: (score - group mean) / (group std + eps) on every response token. With
    normalize_std=False it is Dr. GRPO's advantage (no std division). `valid` ([rows] bool, optional):
    only those rows make their group's statistics; the others, and every row of a group left with
    fewer than two valid rows, get 0 (reward.on_failure=drop)."""
    if valid is not None:
        return _over_valid_rows(
            grpo_advantages, scores, group_ids, response_mask, valid, normalize_std=normalize_std, eps=eps
        )
    inverse, _, _, means, stds = _group_statistics(scores, group_ids)
    advantages = scores - means[inverse]
    if normalize_std:
        advantages = advantages / (stds[inverse] + eps)
    return advantages[:, None] * response_mask.to(scores.dtype)


def rloo_advantages(
    scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """RLOO: score minus the mean score of the other samples of the same prompt. A group of one row
    (the others dropped: a multi-turn run's faults) has no other samples and gets 0, as GRPO's does.
    `valid`: as in grpo_advantages."""
    if valid is not None:
        return _over_valid_rows(rloo_advantages, scores, group_ids, response_mask, valid)
    inverse, counts, sums, _, _ = _group_statistics(scores, group_ids)
    n = counts[inverse].to(scores.dtype)
    baseline = (sums[inverse] - scores) / (n - 1).clamp(min=1)
    advantages = torch.where(n >= 2, scores - baseline, torch.zeros_like(scores))
    return advantages[:, None] * response_mask.to(scores.dtype)


def _over_valid_rows(
    estimator: Callable[..., torch.Tensor],
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    response_mask: torch.Tensor,
    valid: torch.Tensor,
    **options: Any,
) -> torch.Tensor:
    """`estimator` on the valid rows of the groups that keep at least two of them; 0 elsewhere."""
    valid = valid.bool()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    valid_per_group = torch.zeros(int(inverse.max()) + 1 if len(inverse) else 0, dtype=torch.long).index_add_(
        0, inverse, valid.long()
    )
    rows = (valid & (valid_per_group[inverse] >= 2)).nonzero().flatten()
    advantages = torch.zeros(response_mask.shape, dtype=scores.dtype, device=scores.device)
    if len(rows):
        advantages[rows] = estimator(scores[rows], group_ids[rows], response_mask[rows], **options)
    return advantages


def discounted_returns(rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Σ_{k≥t} γ^{k-t} r_k over the masked tokens k (rewards outside the mask are ignored). The masked
    tokens are the time steps: positions outside the mask (a multi-turn trajectory's environment
    tokens) are skipped, not discounted."""
    mask = response_mask.bool()
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(mask[:, t], running, torch.zeros_like(running))
    return returns


def turn_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Multi-turn return-to-go by turn: on every token of turn k, G_k = Σ_{j≥k} γ^{j-k} R_j, where a
    turn is a run of consecutive masked tokens and R_j sums its token rewards (the environment's
    reward for a turn sits on its last token). Zero outside the mask."""
    mask = mask.bool()
    starts = mask & ~torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    turn = torch.where(mask, starts.long().cumsum(dim=1), torch.zeros_like(mask, dtype=torch.long))  # 1, 2, ...
    turns = int(turn.max()) if turn.numel() else 0
    per_turn = torch.zeros(rewards.shape[0], turns + 2, dtype=rewards.dtype, device=rewards.device)
    per_turn.scatter_add_(1, turn, torch.where(mask, rewards, torch.zeros_like(rewards)))
    for k in reversed(range(1, turns + 1)):  # column 0 collects nothing; turns + 1 is the 0 after the last
        per_turn[:, k] += gamma * per_turn[:, k + 1]
    return torch.where(mask, per_turn.gather(1, turn), torch.zeros_like(rewards))


def first_turn_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """[batch]: each row's G_1, the discounted return of its whole trajectory (turn_returns' first turn)."""
    return _at_first_masked_token(turn_returns(rewards, mask, gamma), mask)


def _at_first_masked_token(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    first = mask.bool().long().argmax(dim=1)
    return values.gather(1, first[:, None]).squeeze(1)


def turn_level_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    estimator: str,
    gamma: float = 1.0,
    eps: float = 1e-6,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-turn credit for the group estimators (grpo, dr_grpo, rloo): on turn k of trajectory i,
    A_ik = (G_ik - b_i) / s, where G_ik is its return-to-go (turn_returns), b_i the group baseline of
    the estimator computed from the group's whole-trajectory returns G_j1 (grpo / dr_grpo: their mean;
    rloo: the mean of the others'), and s the group's std of G_j1 + eps for grpo, else 1. A turn is
    credited with what followed it, never with the rewards of turns before it. A group of one
    trajectory (the others dropped: environment.on_fault=drop, a failed reset) has no baseline and gets
    0. `valid`: as in grpo_advantages (reward.on_failure=drop)."""
    if valid is not None:

        def on_rows(rows_rewards: torch.Tensor, rows_groups: torch.Tensor, rows_mask: torch.Tensor) -> torch.Tensor:
            return turn_level_advantages(rows_rewards, rows_mask, rows_groups, estimator, gamma, eps)

        return _over_valid_rows(on_rows, rewards, group_ids, mask, valid)
    returns = turn_returns(rewards, mask, gamma)
    g_first = _at_first_masked_token(returns, mask)
    inverse, counts, sums, means, stds = _group_statistics(g_first, group_ids)
    if estimator == "rloo":
        baseline = (sums[inverse] - g_first) / (counts[inverse].to(g_first.dtype) - 1).clamp(min=1)
    elif estimator in ("grpo", "dr_grpo"):
        baseline = means[inverse]
    else:
        raise ValueError(f"turn-level credit is for grpo, dr_grpo and rloo, not {estimator}")
    advantages = returns - baseline[:, None]
    if estimator == "grpo":
        advantages = advantages / (stds[inverse] + eps)[:, None]
    # alone in its group, a trajectory's later turns would be credited G_k - G_1 (over eps, for grpo)
    in_group = (counts[inverse] >= 2)[:, None]
    return torch.where(in_group, advantages, torch.zeros_like(advantages)) * mask.to(rewards.dtype)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(values - mean) / sqrt(var + eps) over the masked tokens of the whole batch; zero outside the mask.

    Conventions, as verl's `masked_whiten` (verl/utils/torch_functional.py, shift_mean=True) and ROLL's:
    the mean is subtracted and not added back (the result has mean 0 over the mask), and the variance
    is the unbiased one, Σ m·(v - mean)² / (N - 1). We pick unbiased to give the same numbers as verl;
    over the thousands of tokens of a rollout batch the variances differ by a factor (N-1)/N. Where verl raises
    on N = 1, a single token here whitens to 0 (its deviation from the mean is 0).
    """
    count = mask.sum()
    mean = masked_sum(values, mask) / count.clamp(min=1)
    variance = masked_sum((values - mean) ** 2, mask) / (count - 1).clamp(min=1)
    return torch.where(mask.bool(), (values - mean) * torch.rsqrt(variance + eps), torch.zeros_like(values))


# Estimators whose advantages are whitened over the batch unless algorithm.whiten_advantages says
# otherwise: GAE (verl always whitens it) and REINFORCE++ (whitening is part of its definition).
# GRPO, Dr. GRPO and RLOO advantages are already centred per prompt group, and verl leaves them as is.
WHITENED_BY_DEFAULT = ("gae", "reinforce_pp")


def whitens_advantages(estimator: str, whiten: bool | None = None) -> bool:
    """Whether `estimator`'s advantages are whitened: `whiten` when given, else its default."""
    return estimator in WHITENED_BY_DEFAULT if whiten is None else whiten


def reinforce_pp_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """REINFORCE++: discounted return of the (KL-shaped) token rewards, whitened over the batch
    (unbiased variance, as verl; see masked_whiten)."""
    return masked_whiten(discounted_returns(token_rewards, response_mask, gamma), response_mask)


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the response tokens. values[t] estimates the return from token t on.

    Returns (advantages, returns = advantages + values), zero outside the mask. Response tokens
    are contiguous per row; the value after the last response token is 0. The advantages are raw:
    the caller whitens them (masked_whiten, on by default for gae) and keeps these returns for the
    critic, as verl does.
    """
    mask = response_mask.to(values.dtype)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    running = torch.zeros_like(next_value)
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(mask[:, t] > 0, delta + gamma * lam * running, running)
        next_value = torch.where(mask[:, t] > 0, values[:, t], next_value)
        advantages[:, t] = running * mask[:, t]
    returns = (advantages + values) * mask
    return advantages, returns


def kl_shaped_rewards(
    token_rewards: torch.Tensor,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    estimator: str = "k1",
    clamp: float | None = None,
) -> torch.Tensor:
    """Token rewards minus kl_coef · KL estimate on response tokens (the 'KL in reward' variant);
    `clamp` as in kl_penalty."""
    kl = kl_penalty(log_probs, ref_log_probs, estimator, clamp)
    return token_rewards - kl_coef * torch.where(response_mask.bool(), kl, torch.zeros_like(kl))
