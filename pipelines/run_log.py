"""What the RL pipeline writes to the log: one line per step, the async-rollout notes."""

from __future__ import annotations

import os

from roll_lite.config import RunConfig
from roll_lite.loss import RolloutCorrection


def describe_fully_async(rollout, algorithm, multi_turn: bool = False) -> str:
    from .async_schedule import segment_tokens

    segment = segment_tokens(rollout)
    if rollout.max_staleness == 0:
        ahead = "each batch is generated whole at the start of its step (max_staleness=0: the lockstep run)"
    elif segment is None:
        ahead = "each later batch is generated whole when admitted"
    elif multi_turn:
        rounds = (
            "rounds of turns for as long as a step trains (rollout.schedule=greedy: timing decides, a run does not repeat)"
            if rollout.schedule == "greedy"
            else f"{rollout.segment_turns} round(s) of turns per step"
        )
        ahead = f"each later batch's trajectories play {rounds} and go on under the new weights at an update"
    else:
        how_far = (
            f"{segment} tokens at a time for as long as a step trains (rollout.schedule=greedy: timing decides, "
            "a run does not repeat)"
            if rollout.schedule == "greedy"
            else f"{segment} tokens per step"
        )
        update = "go on under the new weights" if rollout.on_update == "continue" else "start again under them"
        ahead = f"each later batch's rows generate {how_far} and, in flight at a weight update, {update}"
    return (
        f"rollout.fully_async: batches up to {rollout.max_staleness} step(s) ahead are admitted while a step trains; "
        f"{ahead} (rollout.on_update={rollout.on_update}); no token is more than rollout.max_staleness="
        f"{rollout.max_staleness} weight versions older than the actor that trains on it; "
        + off_policy_handling(algorithm)
    )


def describe_async_rollout(async_steps: int, algorithm) -> str:
    return (
        f"rollout.async_steps={async_steps}: the next steps' batches are generated while a step trains, with "
        f"weights up to {async_steps} step(s) older than the actor (rollout/staleness); {off_policy_handling(algorithm)}"
    )


def off_policy_handling(algorithm) -> str:
    """Where the old log-probs come from, and what corrects the gap to the weights that sampled."""
    asked = [f"algorithm.{key}={value}" for key, value in RolloutCorrection.from_config(algorithm).settings_on()]
    correction = (
        f"{', '.join(asked)} correct(s) the gap to the sampling weights"
        if asked
        else "nothing corrects the gap to the sampling weights (algorithm.rollout_is, rollout_mask, "
        "rollout_veto_threshold, rollout_bypass: all off)"
    )
    old = (
        "the engine's log-probs serve as the old ones"
        if algorithm.rollout_bypass
        else "the actor recomputes the old log-probs"
    )
    return f"{old}, and {correction}"


def oversubscribed_cpu_warning(config: RunConfig) -> str | None:
    """Generating ahead on CPU: the rollout worker and the actor ranks compute at the same time, and
    more torch threads than cores make both crawl (on 2 cores, 2 threads each: a 0.56 s step where 1
    thread each gives 0.13 s, benchmarks/vs_trl.py)."""
    w = config.workers
    cores, busy = os.cpu_count() or 1, w.torch_threads * (w.actor_dp + 1)
    if w.gpus_per_rank or busy <= cores:
        return None
    ahead = "rollout.fully_async" if config.rollout.fully_async else f"rollout.async_steps={config.rollout.async_steps}"
    return (
        f"{ahead} on CPU: the rollout worker generates while "
        f"{w.actor_dp} actor rank(s) train, {busy} torch threads on {cores} cores; set "
        f"workers.torch_threads={max(cores // (w.actor_dp + 1), 1)} or the overlap is lost to contention"
    )


def fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def progress_line(step: int, steps: int, m: dict) -> str:
    parts = [f"step {step}/{steps}", f"reward {m['reward/mean']:.3f}"]
    if "eval/reward_mean" in m:
        parts.append(f"held-out {m['eval/reward_mean']:.3f}")
    for key, label in (
        ("actor/kl", "kl"),
        ("actor/entropy", "entropy"),
        ("actor/grad_norm", "grad"),
        ("perf/step_s", "s"),
    ):
        if key in m:
            parts.append(f"{label} {m[key]:.3g}")
    return " | ".join(parts)
