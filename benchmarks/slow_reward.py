"""A slow scorer for benchmarks/vs_trl.py's waiting workload: roll_lite's exact_answer after a wait of
$ROLL_BENCH_REWARD_DELAY_S seconds per response (a slow judge), as benchmarks/trl_grpo.py's
--reward-delay-s waits on TRL's side. Named in a run as `benchmarks.slow_reward:exact_answer_slow`."""

from __future__ import annotations

import os
import time

from roll_lite.rewards.rules import exact_answer


def exact_answer_slow(response: str, ground_truth: str, extra: dict | None = None) -> float:
    time.sleep(float(os.environ.get("ROLL_BENCH_REWARD_DELAY_S", "0")))
    return exact_answer(response, ground_truth, extra)
