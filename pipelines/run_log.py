"""What the RL pipeline writes to the log: one line per step, the async-rollout notes."""

from __future__ import annotations

import os
import re

from roll_lite.config import RunConfig
from roll_lite.loss import RolloutCorrection
from roll_lite.rewards.outcomes import KINDS


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


DOMAIN_MEAN = re.compile(r"reward/([^/]+)/mean")  # reward.domains: each domain's mean reward
SOURCE_MEAN = re.compile(r"reward/((?:model|judge):[^/]+)")  # a reward model's or a judge's mean score
NOT_SCORED = [kind for kind in KINDS if kind != "ok"]  # the outcomes of a row a source did not score
CODE_VERDICT = re.compile(r"reward/(?:([^/]+)/)?code/programs/(\w+)")  # the code source's program verdicts


def domain_means(m: dict, prefix: str = "") -> dict[str, float]:
    """{domain: its mean reward} of a run with reward.domains (`prefix`: "eval/" for the held-out ones);
    empty without. Its domains' sources score on different scales (a reward model's logit, a judge's
    yes-rate, an exact-answer rate), so the log shows them apart, never one mean over them. By name: the
    reward worker's order of the domains is a set's."""
    means = {
        match[1]: value
        for key, value in m.items()
        if key.startswith(prefix) and (match := DOMAIN_MEAN.fullmatch(key[len(prefix) :]))
    }
    return dict(sorted(means.items()))


def reward_text(m: dict, prefix: str = "", overall: str = "reward/mean") -> str:
    """'0.406', or per domain 'reverse 0.406, increment -1.200, ...'."""
    means = domain_means(m, prefix)
    if means:
        return ", ".join(f"{domain} {value:.3f}" for domain, value in means.items())
    return fmt(m.get(prefix + overall))


def held_out(m: dict) -> str:
    """The held-out reward of an evaluation's metrics: eval/reward_mean, or per domain."""
    return reward_text(m, "eval/", "reward_mean")


def held_out_change(first: dict, last: dict) -> str:
    """The held-out reward from the run's first evaluation to its last: '0.094 at start -> 0.891 at the
    end', or per domain 'reverse 0.031 -> 0.500, increment ... (start -> end)'."""
    start, end = domain_means(first, "eval/"), domain_means(last, "eval/")
    if not start or not end:
        return f"{held_out(first)} at start -> {held_out(last)} at the end"
    changes = [f"{domain} {fmt(start.get(domain))} -> {fmt(value)}" for domain, value in end.items()]
    return ", ".join(changes) + " (start -> end)"


def feature_parts(m: dict) -> list[str]:
    """What the run's own feature does, from the metrics it logs: the reward models' and judges' scores, the
    code verdicts, the unscored responses, DAPO's informative groups, the distillation KL, the staleness of
    generating ahead, the turns and tool calls of multi-turn episodes."""
    parts = []
    for key, value in m.items():
        if match := SOURCE_MEAN.fullmatch(key):  # its mean over the rows it scored, and the rows it did not
            missed = ", ".join(f"{m[f'{key}/{kind}']:g} {kind}" for kind in NOT_SCORED if m.get(f"{key}/{kind}"))
            parts.append(f"{match[1]} {value:.3f}" + (f" ({missed})" if missed else ""))
    verdicts: dict[str | None, list[str]] = {}
    for key, count in m.items():
        if (match := CODE_VERDICT.fullmatch(key)) and count:
            verdicts.setdefault(match[1], []).append(f"{count:g} {match[2]}")
    parts += [f"{f'{domain} ' if domain else ''}programs: {', '.join(counts)}" for domain, counts in verdicts.items()]
    if m.get("reward/unscored"):
        parts.append(f"unscored {m['reward/unscored']:g}")
    for key, label in (
        ("dapo/informative_groups", "informative"),
        ("distill/reverse_kl", "distill kl"),
        ("actor/distill_kl", "distill kl"),
        ("rollout/staleness_token_mean", "staleness"),  # fully async: per token
        ("env/turns", "turns"),
        ("env/tool_calls", "tool calls"),
    ):
        if key in m:
            parts.append(f"{label} {m[key]:.3g}")
    if "rollout/staleness_token_mean" not in m and m.get("rollout/staleness"):  # rollout.async_steps
        parts.append(f"staleness {m['rollout/staleness']:g}")
    return parts


def signal_note(m: dict) -> str | None:
    """When no group of the step had different rewards: the step's reward taught nothing (with a group
    baseline, and no KL loss or teacher, its gradient is 0)."""
    groups, equal = m.get("advantage/groups"), m.get("advantage/equal_reward_groups")
    if not groups or equal != groups:
        return None
    note = f"all {groups:g} groups had equal rewards"
    return note + ": no gradient this step" if m.get("actor/grad_norm") == 0 else note


def progress_line(step: int, steps: int, m: dict) -> str:
    parts = [f"step {step}/{steps}", f"reward {reward_text(m)}"]
    if "eval/reward_mean" in m:
        parts.append(f"held-out {held_out(m)}")
    parts += feature_parts(m)
    for key, label in (
        ("actor/kl", "kl"),
        ("actor/entropy", "entropy"),
        ("actor/grad_norm", "grad"),
        ("perf/step_s", "s"),
    ):
        if key in m:
            parts.append(f"{label} {m[key]:.3g}")
    note = signal_note(m)
    return " | ".join(parts + ([note] if note else []))
