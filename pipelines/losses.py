"""The actor's loss from the config: `algorithm.policy_loss` by name (roll_lite.loss.POLICY_LOSSES:
ppo, gspo, gspo_token, cispo) or a user's loss_func by `package.module:function`, with the KL to the
reference around it when the run has a reference (a loss term with kl_coef, and the actor/kl metric)."""

from __future__ import annotations

from roll_lite.config import AlgorithmConfig
from roll_lite.importing import load_object
from roll_lite.loss import POLICY_LOSSES, kl_regularized_loss_func

# The options each built-in takes besides the clip range, rollout correction and the aggregation's.
EXTRA_OPTIONS = {"ppo": ("dual_clip_c", "entropy_coef"), "cispo": ("entropy_coef",), "gspo": (), "gspo_token": ()}


def is_builtin_policy_loss(name: str) -> bool:
    return name in POLICY_LOSSES


def policy_loss_func(a: AlgorithmConfig, mask_key: str, seq_len_norm: float, use_reference: bool):
    """algorithm.policy_loss on `mask_key` (loss_mask_keys' mask), aggregated by algorithm.loss_agg_mode."""
    if is_builtin_policy_loss(a.policy_loss):
        options = dict(seq_len_norm=seq_len_norm, mask_key=mask_key, rollout_is=a.rollout_is,
                       rollout_is_cap=a.rollout_is_cap)
        for key in ("clip_ratio_low", "clip_ratio_high"):  # null: the loss's own default
            if getattr(a, key) is not None:
                options[key] = getattr(a, key)
        options.update({key: getattr(a, key) for key in EXTRA_OPTIONS[a.policy_loss]})
        policy = POLICY_LOSSES[a.policy_loss](a.loss_agg_mode, **options)
    else:
        policy = load_object(a.policy_loss, search_cwd=True)
    if not use_reference:
        return policy
    return kl_regularized_loss_func(a.loss_agg_mode, kl_coef=0.0 if a.kl_in_reward else a.kl_coef,
                                    kl_estimator=a.kl_estimator, seq_len_norm=seq_len_norm, kl_mask_key=mask_key,
                                    kl_clamp=a.kl_clamp, policy_loss=policy)


class LossCheckFailed(Exception):
    """A user's loss fails the loss checker; the message is its report."""


def check_own_losses(pipeline) -> str | None:
    """Before anything starts: put the actor's loss, when it is not a built-in (algorithm.policy_loss by
    import path, or a subclass's loss_func), and a subclass's critic_loss_func through the loss checker
    (roll_lite.loss.checker) on a synthetic batch. Returns a line for the log, None when there is nothing
    to check; raises LossCheckFailed with the checker's report."""
    import time

    from roll_lite.loss.checker import check_loss_invariance
    from roll_lite.pipelines.ppo import PPOPipeline

    if not isinstance(pipeline, PPOPipeline):  # the SFT pipeline: its loss is the built-in SFT loss
        return None
    cls, a = type(pipeline), pipeline.config.algorithm
    own = []
    if cls.loss_func is not PPOPipeline.loss_func or not is_builtin_policy_loss(a.policy_loss):
        own.append(("loss_func", pipeline.loss_func, "log_probs"))
    if pipeline.use_critic and cls.critic_loss_func is not PPOPipeline.critic_loss_func:
        own.append(("critic_loss_func", pipeline.critic_loss_func, "value"))
    if not own or not a.check_loss:
        return None if not own else f"loss check: skipped (algorithm.check_loss=false) for {', '.join(n for n, _, _ in own)}"
    start, lines = time.perf_counter(), []
    for name, loss_func, head in own:
        report = check_loss_invariance(loss_func, [pipeline.loss_mask_key], head=head, raise_on_failure=False)
        if not report.passed:
            raise LossCheckFailed(f"{cls.__name__}.{name} ({a.policy_loss if name == 'loss_func' else 'critic'}) fails "
                                  f"the loss checker, so its step would depend on D, A or packing (algorithm.check_loss="
                                  f"false skips this check):\n{report.table()}")
        lines.append(f"{name} passed (worst relative deviation {report.worst:.1e})")
    return f"loss check: {'; '.join(lines)}, {time.perf_counter() - start:.1f} s"
