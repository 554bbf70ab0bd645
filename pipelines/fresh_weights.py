"""The per-step check that the rollout engine sampled with the actor's weights (rollout.max_logp_gap).

Peers' worst rollout bugs are an engine that keeps generating with stale weights after a sync (verl
#7495, TRL #5312) or with a prefix cache computed under old ones. Both show up as a gap between the
engine's log-prob of each sampled token and the actor's for the same token, which the policy losses
report as `rollout_logp_gap` (roll_lite.loss.rollout_correction). On a step whose batch was sampled
with the actor's current weights (rollout/staleness 0) that gap is numerical noise (~1e-5 in float32,
~1e-2 in bf16); a broken sync makes it large, and the run stops.
"""

from __future__ import annotations

from roll_lite.errors import ConfigError, StaleRolloutWeights


def check_fresh_weights(
    actor_metrics: dict[str, float], weights_behind: int, max_gap: float | None, pipeline: str, step: int
) -> None:
    if max_gap is None:
        return
    gap = actor_metrics.get("rollout_logp_gap")
    if gap is None:
        raise ConfigError(
            f"rollout.max_logp_gap={max_gap}: {pipeline}.loss_func reported no 'rollout_logp_gap@sum', so nothing "
            "checks that the rollout engine samples with the actor's weights; report it with "
            "roll_lite.loss.rollout_correction (as the built-in losses do), or set rollout.max_logp_gap=null"
        )
    if weights_behind == 0 and gap > max_gap:
        raise StaleRolloutWeights(
            f"step {step}: the rollout engine's log-probs differ from the actor's by {gap:.3g} per token "
            f"(actor/rollout_logp_gap; rollout.max_logp_gap={max_gap}) on a batch sampled after the latest "
            "weight sync: the engine is not generating with the actor's weights (a stale or partial weight "
            "sync, or a prefix cache kept across one). If the gap is expected (low precision, a large model), "
            "raise rollout.max_logp_gap, or set it to null to only log it"
        )
