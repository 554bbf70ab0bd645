"""`reasoning_gym`: a data.source=reasoning_gym row graded by reasoning-gym's own scorer
(`dataset.score_answer(answer, entry)`), on the entry the row came from: the row's source_* fields
rebuild that dataset (roll_lite.data.sources, cached per process) and pick the entry by index.

It runs in the reward runner's guarded subprocess (a task's scorer may parse with sympy): a call past
reward.timeout_s or one that raises is a failed call, counted, never a silent zero.
"""

from __future__ import annotations

from roll_lite.rewards.registry import register_reward

SOURCE_FIELDS = ("source_task", "source_args", "source_seed", "source_size", "source_index")


@register_reward("reasoning_gym")
def reasoning_gym_score(response: str, ground_truth: str, extra: dict | None = None) -> float:
    """reasoning-gym's score of the response (0..1) for the row's own entry."""
    extra = extra or {}
    missing = [key for key in SOURCE_FIELDS if key not in extra]
    if missing:
        raise ValueError(
            f"the reasoning_gym reward grades rows of data.source=reasoning_gym; this row has no {', '.join(missing)}"
        )
    from roll_lite.data.sources import reasoning_gym_dataset

    dataset = reasoning_gym_dataset(
        extra["source_task"], extra["source_args"], int(extra["source_seed"]), int(extra["source_size"])
    )
    return float(dataset.score_answer(answer=response.strip(), entry=dataset[int(extra["source_index"])]))
