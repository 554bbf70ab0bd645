"""algorithm.advantage's estimator on a batch (the pure functions are in roll_lite/loss/advantages.py)."""

from __future__ import annotations

import torch

from roll_lite.config.schema import AlgorithmConfig
from roll_lite.data import DataProto
from roll_lite.loss.advantages import (
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    masked_whiten,
    rloo_advantages,
    whitens_advantages,
)

from .dapo import informative_rows


def estimate_advantages(
    a: AlgorithmConfig, token_rewards: torch.Tensor, batch: DataProto, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(advantages, returns for the critic or None). The estimator's raw advantages, whitened over the
    masked tokens when algorithm.whiten_advantages says so (default: gae and reinforce_pp); the
    critic's returns are built from the raw GAE advantages. Rows the rewards left unscored under
    reward.on_failure=drop (batch["scored"] false; their mask is already 0) stay out of the group
    baselines."""
    returns = None
    valid = batch["scored"] if "scored" in batch else None
    if a.advantage == "gae":
        advantages, returns = gae_advantages(token_rewards, batch["values"], mask, a.gamma, a.lam)
    elif a.advantage in ("grpo", "dr_grpo"):
        shaped = token_rewards.sum(-1)  # the score, minus the KL penalty when it is in the reward
        advantages = grpo_advantages(shaped, batch["group_ids"], mask, normalize_std=a.advantage == "grpo", valid=valid)
    elif a.advantage == "rloo":
        advantages = rloo_advantages(token_rewards.sum(-1), batch["group_ids"], mask, valid=valid)
    else:  # reinforce_pp: discounted returns, whitened below (reinforce_pp_advantages)
        advantages = discounted_returns(token_rewards, mask, a.gamma)
    if whitens_advantages(a.advantage, a.whiten_advantages):
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


def reward_signal_metrics(
    scores: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor | None
) -> dict[str, float]:
    """advantage/groups: the batch's groups (a prompt's samples); advantage/equal_reward_groups: those
    whose scored rows all have one reward (or that have fewer than two scored rows). The group-baseline
    estimators (grpo, dr_grpo, rloo) give every row of such a group advantage 0: when all groups are
    equal, the step's gradient comes from nothing but a KL loss or a teacher (0 without them)."""
    groups = len(torch.unique(group_ids))
    if valid is not None:
        scores, group_ids = scores[valid], group_ids[valid]
    informative = len(torch.unique(group_ids[informative_rows(scores, group_ids)]))
    return {"advantage/groups": float(groups), "advantage/equal_reward_groups": float(groups - informative)}
