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
