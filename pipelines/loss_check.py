"""roll-train's check of a user's own loss before anything starts (algorithm.check_loss)."""

from __future__ import annotations

import time
from typing import Any

from .dpo import DPOPipeline
from .losses import corrections_asked, is_builtin_policy_loss
from .pairs import PairPipeline
from .ppo import PPOPipeline
from .reward_model import RewardModelPipeline

SKIP = (
    "algorithm.check_loss=false skips this check: only for a loss that needs batch keys the checker's synthetic "
    "batch lacks; check such a loss on a batch that has them (roll_lite.loss.checker.check_loss_invariance("
    "loss_func, mask_keys, data=batch))"
)


class LossCheckFailed(Exception):
    """A user's loss fails the loss checker; the message is its report."""


def own_losses(pipeline) -> list[tuple[str, Any, str]]:
    """(name, loss_func, head) of each loss of the pipeline that is not a built-in: the actor's loss
    (algorithm.policy_loss by import path, or a subclass's loss_func), a subclass's critic_loss_func,
    and a pair pipeline subclass's loss_func."""
    cls = type(pipeline)
    if isinstance(pipeline, PairPipeline):
        builtin = cls.loss_func in (DPOPipeline.loss_func, RewardModelPipeline.loss_func)
        return [] if builtin else [("loss_func", pipeline.loss_func, pipeline.actor_head)]
    if not isinstance(pipeline, PPOPipeline):  # the SFT pipeline: its loss is the built-in SFT loss
        return []
    own = []
    if cls.loss_func is not PPOPipeline.loss_func or not is_builtin_policy_loss(pipeline.config.algorithm.policy_loss):
        own.append(("loss_func", pipeline.loss_func, "log_probs"))
    if pipeline.use_critic and cls.critic_loss_func is not PPOPipeline.critic_loss_func:
        own.append(("critic_loss_func", pipeline.critic_loss_func, "value"))
    return own


def check_own_losses(pipeline) -> str | None:
    """Before anything starts: put each of the pipeline's own losses (own_losses) through the loss checker
    (roll_lite.loss.checker) on a synthetic batch: an RL batch, or for a pair pipeline preference pairs with
    the pair pipelines' loss_mask_keys. Returns a line for the log, None when there is nothing to check;
    raises LossCheckFailed with the checker's report: what failed and its fix first, the switch last."""
    cls, a = type(pipeline), pipeline.config.algorithm
    own = own_losses(pipeline)
    if not own:
        return None
    if not a.check_loss:
        return f"loss check: skipped (algorithm.check_loss=false) for {', '.join(n for n, _, _ in own)}"
    from roll_lite.loss.checker import check_loss_invariance  # builds a model: transformers' model classes, ~1 s

    pairs = isinstance(pipeline, PairPipeline)
    start, lines = time.perf_counter(), []
    for name, loss_func, head in own:
        mask_keys = None if pairs else [pipeline.loss_mask_key]  # None: the pair batch's own declaration
        try:
            report = check_loss_invariance(loss_func, mask_keys, pairs=pairs, head=head, raise_on_failure=False)
        except Exception as error:  # it would raise in the workers too, at the first step
            raise LossCheckFailed(
                f"{cls.__name__}.{name} raised on the checker's synthetic batch: {type(error).__name__}: {error}\n{SKIP}"
            ) from None
        if not report.passed:
            kind = "pair loss" if pairs else a.policy_loss if name == "loss_func" else "critic"
            raise LossCheckFailed(f"{cls.__name__}.{name} ({kind}) fails the loss checker:\n{report.table()}\n{SKIP}")
        if name == "loss_func" and not pairs:
            check_rollout_metrics(pipeline, report.metrics)
        lines.append(f"{name} passed (worst relative deviation {report.worst:.1e})")
    return f"loss check: {'; '.join(lines)}, {time.perf_counter() - start:.1f} s"


def check_rollout_metrics(pipeline, metrics: set[str]) -> None:
    """An RL actor's loss must report what the fresh-weights check and the rollout correction read."""
    cls, a = type(pipeline), pipeline.config.algorithm
    max_gap = pipeline.config.rollout.max_logp_gap
    if max_gap is not None and "rollout_logp_gap@sum" not in metrics:
        raise LossCheckFailed(
            f"{cls.__name__}.loss_func reports no 'rollout_logp_gap@sum' (it reports {sorted(metrics) or 'nothing'}), "
            f"so the check that the rollout engine samples with the actor's weights (rollout.max_logp_gap={max_gap}) "
            "would stop the run after its first step: add the metrics of roll_lite.loss.rollout_correction(batch, "
            "old_log_probs, mask, stats) to the ones it returns, as the built-in losses do, or set rollout.max_logp_gap=null"
        )
    missing = [
        (key, setting, metric) for key, setting, metric in corrections_asked(a) if f"{metric}@sum" not in metrics
    ]
    if missing:
        raise LossCheckFailed(
            f"{cls.__name__}.loss_func reports no {' or '.join(sorted({repr(m + '@sum') for _, _, m in missing}))} "
            f"(it reports {sorted(metrics) or 'nothing'}), so the rollout correction of "
            f"{', '.join(f'algorithm.{key}={setting}' for key, setting, _ in missing)} would not be applied and the "
            "run would stop after its first step: multiply its per-token loss by the weights of "
            "roll_lite.loss.rollout_correction(batch, old_log_probs, mask, stats, correction=RolloutCorrection."
            "from_config(algorithm)) and return that call's metrics, as the built-in losses do, or set "
            f"{' and '.join(f'algorithm.{key}' for key, _, _ in missing)} to null"
        )
