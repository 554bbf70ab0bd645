"""roll-train's check of a user's own loss before anything starts (algorithm.check_loss)."""

from __future__ import annotations

import time

from .losses import corrections_asked, is_builtin_policy_loss
from .ppo import PPOPipeline


class LossCheckFailed(Exception):
    """A user's loss fails the loss checker; the message is its report."""


def check_own_losses(pipeline) -> str | None:
    """Before anything starts: put the actor's loss, when it is not a built-in (algorithm.policy_loss by
    import path, or a subclass's loss_func), and a subclass's critic_loss_func through the loss checker
    (roll_lite.loss.checker) on a synthetic batch. Returns a line for the log, None when there is nothing
    to check; raises LossCheckFailed with the checker's report."""
    if not isinstance(pipeline, PPOPipeline):  # the SFT pipeline: its loss is the built-in SFT loss
        return None
    cls, a = type(pipeline), pipeline.config.algorithm
    own = []
    if cls.loss_func is not PPOPipeline.loss_func or not is_builtin_policy_loss(a.policy_loss):
        own.append(("loss_func", pipeline.loss_func, "log_probs"))
    if pipeline.use_critic and cls.critic_loss_func is not PPOPipeline.critic_loss_func:
        own.append(("critic_loss_func", pipeline.critic_loss_func, "value"))
    if not own or not a.check_loss:
        return (
            None
            if not own
            else f"loss check: skipped (algorithm.check_loss=false) for {', '.join(n for n, _, _ in own)}"
        )
    from roll_lite.loss.checker import check_loss_invariance  # builds a model: transformers' model classes, ~1 s

    start, lines = time.perf_counter(), []
    for name, loss_func, head in own:
        try:
            report = check_loss_invariance(loss_func, [pipeline.loss_mask_key], head=head, raise_on_failure=False)
        except Exception as error:  # it would raise in the workers too, at the first step
            raise LossCheckFailed(
                f"{cls.__name__}.{name} raised on the checker's synthetic batch: "
                f"{type(error).__name__}: {error} (algorithm.check_loss=false skips this check, "
                "e.g. for a loss that needs batch keys the synthetic batch lacks)"
            ) from None
        if not report.passed:
            raise LossCheckFailed(
                f"{cls.__name__}.{name} ({a.policy_loss if name == 'loss_func' else 'critic'}) fails "
                f"the loss checker, so its step would depend on D, A or packing (algorithm.check_loss="
                f"false skips this check):\n{report.table()}"
            )
        max_gap = pipeline.config.rollout.max_logp_gap
        if name == "loss_func" and max_gap is not None and "rollout_logp_gap@sum" not in report.metrics:
            raise LossCheckFailed(
                f"{cls.__name__}.loss_func reports no 'rollout_logp_gap@sum' (it reports {sorted(report.metrics) or 'nothing'}), "
                f"so the check that the rollout engine samples with the actor's weights (rollout.max_logp_gap={max_gap}) "
                "would stop the run after its first step: add the metrics of roll_lite.loss.rollout_correction(batch, "
                "old_log_probs, mask, stats) to the ones it returns, as the built-in losses do, or set rollout.max_logp_gap=null"
            )
        missing = [
            (key, setting, metric)
            for key, setting, metric in corrections_asked(a)
            if f"{metric}@sum" not in report.metrics
        ]
        if name == "loss_func" and missing:
            raise LossCheckFailed(
                f"{cls.__name__}.loss_func reports no {' or '.join(sorted({repr(m + '@sum') for _, _, m in missing}))} "
                f"(it reports {sorted(report.metrics) or 'nothing'}), so the rollout correction of "
                f"{', '.join(f'algorithm.{key}={setting}' for key, setting, _ in missing)} would not be applied and the "
                "run would stop after its first step: multiply its per-token loss by the weights of "
                "roll_lite.loss.rollout_correction(batch, old_log_probs, mask, stats, correction=RolloutCorrection."
                "from_config(algorithm)) and return that call's metrics, as the built-in losses do, or set "
                f"{' and '.join(f'algorithm.{key}' for key, _, _ in missing)} to null"
            )
        lines.append(f"{name} passed (worst relative deviation {report.worst:.1e})")
    return f"loss check: {'; '.join(lines)}, {time.perf_counter() - start:.1f} s"
