"""The engine / trainer mismatch of every RL step (roll_lite/loss/mismatch.py; docs/rollout.md,
"Mismatch metrics"), logged as rollout/mismatch/<engine>-<dtype>/... .

Where the trainer's log-probs are: a step that computes the actor's old log-probs first (ppo_epochs or
mini_batches above 1, a KL in the reward) has both in the driver's batch, and the sums are taken
there, over the whole batch. An on-policy step's trainer log-probs are its training forward's, inside
the actor: the controller asks the loss for the sums (meta_info['mismatch'], read by
roll_lite.loss.rollout_correction) and takes them back out of the actor's metrics. A batch without the
engine's log-probs (an engine that returns none) logs none of these metrics; so does a loss_func of
one's own that does not call rollout_correction on an on-policy step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roll_lite.config import rollout_dtype
from roll_lite.loss.mismatch import current_weights_mask, mismatch_metrics, mismatch_sums, pop_raw
from roll_lite.runtime.metrics import reduce_metrics

if TYPE_CHECKING:
    import torch

    from roll_lite.config import RunConfig
    from roll_lite.data import DataProto


def mismatch_prefix(config: RunConfig) -> str:
    """rollout/mismatch/<rollout.engine>-<the engine's dtype>, e.g. rollout/mismatch/vllm-bfloat16."""
    return f"rollout/mismatch/{config.rollout.engine}-{rollout_dtype(config)}"


def measure_mismatch(
    batch: DataProto, mask_key: str, config: RunConfig, step: int, weights_behind: int
) -> dict[str, torch.Tensor] | None:
    """Before the actor's train step: the raw sums of the whole batch when it has the actor's old
    log-probs; else None, having asked the loss for them (nothing when the engine gave no log-probs)."""
    if "rollout_log_probs" not in batch.batch:
        return None
    r = config.rollout
    band = (float(r.mismatch_band[0]), float(r.mismatch_band[1]))
    asked = {
        "band": band,
        # split only where tokens can be older than the actor (fully async with max_staleness 0 is lockstep)
        "split_versions": r.async_steps > 0 or (r.fully_async and r.max_staleness > 0),
        "actor_version": step - 1,  # the actor trains step s on the weights of s - 1 updates
        "weights_behind": weights_behind,
    }
    if "old_log_probs" not in batch.batch:
        batch.meta_info["mismatch"] = asked
        return None
    mask = batch[mask_key]
    current = None
    if asked["split_versions"]:
        current = current_weights_mask(mask, batch.batch.get("rollout_versions"), step - 1, weights_behind)
    return mismatch_sums(batch["rollout_log_probs"], batch["old_log_probs"], mask, band, current)


def step_mismatch_metrics(
    config: RunConfig, driver_sums: dict[str, torch.Tensor] | None, actor_metrics: dict[str, float]
) -> dict[str, float]:
    """After the actor's train step: the step's metrics, from the driver's sums or the loss's (taken
    out of `actor_metrics`, so that they never show as actor/mismatch/...)."""
    from_loss = pop_raw(actor_metrics)
    raw = reduce_metrics([driver_sums]) if driver_sums is not None else from_loss
    return mismatch_metrics(raw, mismatch_prefix(config))
