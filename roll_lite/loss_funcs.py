"""Deprecated: the built-in loss_funcs moved into the loss package; import them from roll_lite.loss."""

import warnings

from roll_lite.loss import (  # noqa: F401 (re-exported: every name this module had)
    BUILTIN_LOSSES,
    agg_loss,
    clipped_value_loss,
    kl_penalty,
    kl_regularized_loss_func,
    mask_stats,
    masked_sum,
    old_log_probs,
    ppo_clipped_loss,
    ppo_policy_loss_func,
    rollout_correction,
    rollout_importance_weights,
    sequence_policy_loss_func,
    sequence_ratio_loss,
    sft_loss_func,
    token_mean_metric,
    value_loss_func,
    zero_outside,
)

warnings.warn(
    "roll_lite.loss_funcs is deprecated: import the same names from roll_lite.loss "
    "(e.g. from roll_lite.loss import ppo_policy_loss_func, old_log_probs, rollout_correction)",
    DeprecationWarning,
    stacklevel=2,
)
