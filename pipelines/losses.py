"""The actor's loss from the config: `algorithm.policy_loss` by name (roll_lite.loss.POLICY_LOSSES:
ppo, gspo, gspo_token, cispo) or a user's loss_func by `package.module:function`, with the KL to the
reference around it when the run has a reference (a loss term with kl_coef, and the actor/kl metric)."""

from __future__ import annotations

from roll_lite.config import AlgorithmConfig, ConfigError
from roll_lite.loss import (
    POLICY_LOSSES,
    RolloutCorrection,
    kl_regularized_loss_func,
    reverse_kl_loss_func,
    top_k_forward_kl_loss_func,
)
from roll_lite.runtime.importing import load_object

# The options each built-in takes besides the clip range, rollout correction and the aggregation's.
EXTRA_OPTIONS = {"ppo": ("dual_clip_c", "entropy_coef"), "cispo": ("entropy_coef",), "gspo": (), "gspo_token": ()}


def is_builtin_policy_loss(name: str) -> bool:
    return name in POLICY_LOSSES


def policy_loss_func(a: AlgorithmConfig, mask_key: str, seq_len_norm: float, use_reference: bool, distill=None):
    """algorithm.policy_loss on `mask_key` (loss_mask_keys' mask), aggregated by algorithm.loss_agg_mode;
    with distill.signal = reverse_kl or top_k_forward_kl (a DistillConfig, when the run has a teacher) the KL to
    the teacher added as a loss."""
    policy = _policy_and_reference(a, mask_key, seq_len_norm, use_reference)
    if distill is not None and distill.signal == "reverse_kl":
        return reverse_kl_loss_func(policy, a.loss_agg_mode, distill.coef, distill.kl_estimator, mask_key, seq_len_norm)
    if distill is not None and distill.signal == "top_k_forward_kl":
        return top_k_forward_kl_loss_func(policy, a.loss_agg_mode, distill.coef, mask_key, seq_len_norm)
    return policy


def _policy_and_reference(a: AlgorithmConfig, mask_key: str, seq_len_norm: float, use_reference: bool):
    if is_builtin_policy_loss(a.policy_loss):
        options = dict(seq_len_norm=seq_len_norm, mask_key=mask_key, correction=RolloutCorrection.from_config(a))
        for key in ("clip_ratio_low", "clip_ratio_high"):  # null: the loss's own default
            if getattr(a, key) is not None:
                options[key] = getattr(a, key)
        options.update({key: getattr(a, key) for key in EXTRA_OPTIONS[a.policy_loss]})
        policy = POLICY_LOSSES[a.policy_loss](a.loss_agg_mode, **options)
    else:
        policy = load_object(a.policy_loss, search_cwd=True)
    if not use_reference:
        return policy
    return kl_regularized_loss_func(
        a.loss_agg_mode,
        kl_coef=0.0 if a.kl_in_reward else a.kl_coef,
        kl_estimator=a.kl_estimator,
        seq_len_norm=seq_len_norm,
        kl_mask_key=mask_key,
        kl_clamp=a.kl_clamp,
        policy_loss=policy,
    )


def corrections_asked(a: AlgorithmConfig) -> list[tuple[str, object, str]]:
    """(key, setting, metric) of each rollout correction the config asks for (algorithm.rollout_is,
    rollout_mask, rollout_veto_threshold): a loss that applies it reports `metric` ('@sum')."""
    asked = [
        ("rollout_is", a.rollout_is, "rollout_is_weight"),
        ("rollout_mask", a.rollout_mask, "rollout_dropped"),
        ("rollout_veto_threshold", a.rollout_veto_threshold, "rollout_dropped"),
    ]
    return [(key, setting, metric) for key, setting, metric in asked if setting]


def check_correction_applied(a: AlgorithmConfig, metrics: dict[str, float], pipeline: str) -> None:
    """After a policy train_step: a rollout correction the config asks for (corrections_asked) must show
    in the loss's metrics, or a loss_func of one's own left it silently undone. roll-train's loss check
    (loss_check.py) asks the same of a loss of one's own before training."""
    for key, setting, metric in corrections_asked(a):
        if metric not in metrics:
            raise ConfigError(
                f"algorithm.{key}={setting}: {pipeline}.loss_func applied no rollout correction (it reported no "
                f"'{metric}@sum'); pass its per-token loss through roll_lite.loss.rollout_correction, or set "
                f"algorithm.{key}=null"
            )
