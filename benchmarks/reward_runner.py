"""Time of scoring one batch of 32 responses (the demo's 4 prompts × 8 samples) with the reward
worker, inline and through the guarded process, and the cost of a restart after a timeout.

    python benchmarks/reward_runner.py

`exact_answer` runs inline (a cheap built-in); the same function named by its import path
(roll_lite.rewards.rules:exact_answer) runs in the guarded process, like any user function, so the
difference between the two rows is the guarded path's overhead.
"""

import random
import statistics
import time

from roll_lite.rewards.runner import RewardRunner

ROWS, REPEATS = 32, 200


def batch(seed: int = 0):
    rng = random.Random(seed)
    answers = ["".join(rng.choice("0123456789") for _ in range(rng.randint(3, 7))) for _ in range(ROWS)]
    responses = [a[::-1] if rng.random() < 0.5 else a for a in answers]
    math_responses = [f"so the answer is \\boxed{{{r}}}" for r in responses]
    return responses, math_responses, answers, [{} for _ in range(ROWS)]


def median_ms(runner, spec, responses, answers, extras, repeats=REPEATS) -> float:
    runner.score(spec, responses, answers, extras)  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.score(spec, responses, answers, extras)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    responses, math_responses, answers, extras = batch()
    start = time.perf_counter()
    runner = RewardRunner(["exact_answer", "roll_lite.rewards.rules:exact_answer", "math"], timeout_s=5.0)
    started = time.perf_counter() - start
    rows = [
        ("exact_answer (inline)", median_ms(runner, "exact_answer", responses, answers, extras)),
        (
            "roll_lite.rewards.rules:exact_answer (guarded process)",
            median_ms(runner, "roll_lite.rewards.rules:exact_answer", responses, answers, extras),
        ),
        ("math (guarded process, math-verify)", median_ms(runner, "math", math_responses, answers, extras, repeats=20)),
    ]
    start = time.perf_counter()
    runner.process.restart()
    restart = time.perf_counter() - start
    runner.close()
    print(f"| function | ms per batch of {ROWS} | ms per call |")
    print("|---|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.3f} | {ms / ROWS:.4f} |")
    print(f"\nguarded process: start {started:.2f} s (imports math-verify), restart after a timeout {restart:.2f} s")


if __name__ == "__main__":
    main()
