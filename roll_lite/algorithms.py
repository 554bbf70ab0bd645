"""Deprecated: the advantage estimators moved to roll_lite.loss.advantages."""

import warnings

from roll_lite.loss.advantages import (  # noqa: F401 (re-exported: every name this module had)
    ADVANTAGE_ESTIMATORS,
    WHITENED_BY_DEFAULT,
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    kl_penalty,
    kl_shaped_rewards,
    last_token_rewards,
    masked_sum,
    masked_whiten,
    reinforce_pp_advantages,
    rloo_advantages,
    whitens_advantages,
)

warnings.warn(
    "roll_lite.algorithms is deprecated: import from roll_lite.loss.advantages instead",
    DeprecationWarning,
    stacklevel=2,
)
