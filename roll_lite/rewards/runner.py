"""Calling the configured reward functions on a batch: one typed outcome per response (outcomes.py).
A call that raises, returns no finite number or crashes is `failed`, one that runs past
`reward.timeout_s` is `timed_out`; either costs that response only, and the batch goes on.

Cheap built-ins (registry.CHEAP_REWARDS: exact_answer, token_accuracy, format, digits_only) run
inline, in this process: they are pure string rules with bounded time, and a round trip to another
process would cost more than the call. Everything else (math, the user's functions) runs in one
guarded child process (guarded.py) that is killed and started again when a call times out.
"""

from __future__ import annotations

from roll_lite.rewards.calls import call
from roll_lite.rewards.outcomes import Score, failed, scored, timed_out
from roll_lite.rewards.registry import is_cheap, resolve_reward


class RewardRunner:
    def __init__(self, specs: list[str], timeout_s: float):
        from roll_lite.rewards.guarded import GuardedProcess

        self.timeout_s = timeout_s
        self.inline = {spec: resolve_reward(spec) for spec in specs if is_cheap(spec)}
        guarded = [spec for spec in specs if spec not in self.inline]
        self.process = GuardedProcess(guarded) if guarded else None

    def score(self, spec: str, responses: list[str], answers: list[str], extras: list[dict]) -> list[Score]:
        items = list(zip(responses, answers, extras))
        if spec in self.inline:
            results = [(*call(self.inline[spec], *item), False) for item in items]
        else:
            assert self.process is not None  # spec is not inline, so it is one of the guarded process's
            results = self.process.score(spec, items, self.timeout_s)
        return [
            scored(value) if reason is None else timed_out(reason) if late else failed(reason)
            for value, reason, late in results
        ]

    def close(self) -> None:
        if self.process is not None:
            self.process.close()
