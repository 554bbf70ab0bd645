"""Losses: pure tensor functions (no torch.distributed, no Ray, no config objects).

A loss_func is `loss_func(micro_batch, model_output) -> (loss, metrics)`. It reads the global
denominators of its mask(s) from `micro_batch.meta_info` (put there by the strategy for every key in
`meta_info['loss_mask_keys']`, see `mask_stats`) and aggregates with `agg_loss`, so the sum of its
values over all micro-batches and ranks of a step is the loss of the whole global batch. Losses and
global-mean metrics are reported with '@sum'. A custom loss_func follows the same pattern.

aggregation.py  agg_loss, mask_stats / local_mask_stats, zero_outside, token_mean_metric
policy.py       the policy losses: PPO, GSPO, GSPO-token, CISPO (POLICY_LOSSES by name)
kl.py           the KL estimate to the reference          value.py  the critic's clipped value loss
sft.py          supervised fine-tuning's NLL               correction.py  rollout correction (TIS, MIS, veto, bypass)
preference.py   pair losses: Bradley–Terry (reward models), DPO, IPO, SimPO
distill.py      on-policy distillation: the teacher's reverse KL as an advantage or a loss
advantages.py   advantage estimators and reward shaping
mismatch.py     the engine / trainer log-prob mismatch's per-step sums and metrics (quantiles, band, KL)
checks.py, checker.py  the loss-invariance checker (roll-check-loss); not imported here
"""

from roll_lite.loss.aggregation import (
    AGG_MODES,
    agg_loss,
    check_binary_mask,
    local_mask_stats,
    mask_stats,
    masked_sum,
    token_mean_metric,
    zero_outside,
)
from roll_lite.loss.correction import (
    ROLLOUT_IS_LEVELS,
    ROLLOUT_MASK_LEVELS,
    RolloutCorrection,
    rollout_correction,
    rollout_drops,
    rollout_importance_weights,
)
from roll_lite.loss.distill import DISTILL_SIGNALS, distill_advantages, reverse_kl_loss_func, top_k_forward_kl_loss_func
from roll_lite.loss.kl import kl_penalty
from roll_lite.loss.policy import (
    BUILTIN_LOSSES,
    POLICY_LOSSES,
    cispo_loss,
    cispo_policy_loss_func,
    gspo_token_policy_loss_func,
    kl_regularized_loss_func,
    old_log_probs,
    ppo_clipped_loss,
    ppo_policy_loss_func,
    sequence_policy_loss_func,
    sequence_ratio_loss,
    sequence_ratio_token_loss,
)
from roll_lite.loss.preference import PAIR_LOSSES, bradley_terry_loss_func, dpo_loss_func, pair_rows
from roll_lite.loss.sft import sft_loss_func
from roll_lite.loss.value import clipped_value_loss, value_loss_func

__all__ = [
    "AGG_MODES",
    "BUILTIN_LOSSES",
    "DISTILL_SIGNALS",
    "PAIR_LOSSES",
    "POLICY_LOSSES",
    "ROLLOUT_IS_LEVELS",
    "ROLLOUT_MASK_LEVELS",
    "RolloutCorrection",
    "agg_loss",
    "bradley_terry_loss_func",
    "cispo_loss",
    "dpo_loss_func",
    "pair_rows",
    "cispo_policy_loss_func",
    "distill_advantages",
    "reverse_kl_loss_func",
    "top_k_forward_kl_loss_func",
    "gspo_token_policy_loss_func",
    "sequence_ratio_token_loss",
    "check_binary_mask",
    "clipped_value_loss",
    "kl_penalty",
    "kl_regularized_loss_func",
    "local_mask_stats",
    "mask_stats",
    "masked_sum",
    "old_log_probs",
    "ppo_clipped_loss",
    "ppo_policy_loss_func",
    "rollout_correction",
    "rollout_drops",
    "rollout_importance_weights",
    "sequence_policy_loss_func",
    "sequence_ratio_loss",
    "sft_loss_func",
    "token_mean_metric",
    "value_loss_func",
    "zero_outside",
]
