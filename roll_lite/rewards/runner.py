"""Calling the configured reward functions on a batch: a call that raises, returns no finite number
or runs past `reward.timeout_s` gives that response 0 and is counted; the batch goes on.

Cheap built-ins (registry.CHEAP_REWARDS: exact_answer, token_accuracy, format, digits_only) run
inline, in this process: they are pure string rules with bounded time, and a round trip to another
process would cost more than the call. Everything else (math, the user's functions) runs in one
guarded child process (guarded.py) that is killed and started again when a call times out.
"""

from __future__ import annotations

from dataclasses import dataclass

from roll_lite.rewards.calls import call
from roll_lite.rewards.registry import is_cheap, resolve_reward


@dataclass
class Outcome:
    """One function over one batch: a score per response (0 where the call failed)."""

    scores: list[float]
    failed: int = 0  # raised, returned a non-number / nan / inf, or crashed the process
    timed_out: int = 0
    first_error: str | None = None


class RewardRunner:
    def __init__(self, specs: list[str], timeout_s: float):
        from roll_lite.rewards.guarded import GuardedProcess

        self.timeout_s = timeout_s
        self.inline = {spec: resolve_reward(spec) for spec in specs if is_cheap(spec)}
        guarded = [spec for spec in specs if spec not in self.inline]
        self.process = GuardedProcess(guarded) if guarded else None

    def score(self, spec: str, responses: list[str], answers: list[str], extras: list[dict]) -> Outcome:
        items = list(zip(responses, answers, extras))
        if spec in self.inline:
            results = [(*call(self.inline[spec], *item), False) for item in items]
        else:
            results = self.process.score(spec, items, self.timeout_s)
        outcome = Outcome([score for score, _, _ in results])
        for _, reason, timed_out in results:
            if reason is None:
                continue
            outcome.timed_out += timed_out
            outcome.failed += not timed_out
            outcome.first_error = outcome.first_error or reason
        return outcome

    def close(self) -> None:
        if self.process is not None:
            self.process.close()
