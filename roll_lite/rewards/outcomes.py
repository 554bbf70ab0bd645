"""A reward source's verdict on one response: a typed outcome, never a silent zero.

`ok` carries a finite score. `failed` (the call raised, returned no finite number or crashed its
process), `timed_out` (no result within reward.timeout_s) and `unparseable` (a judge's reply with no
well-formed verdict) carry the reason instead. What a response that is not `ok` trains on is the
run's choice (reward.on_failure): `zero` scores it 0, `drop` takes it out of the loss and out of its
group's baseline (pipelines/unscored.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

KINDS = ("ok", "failed", "timed_out", "unparseable")


@dataclass(frozen=True)
class Score:
    kind: str
    value: float = 0.0  # the score when ok; 0 otherwise (what on_failure=zero trains on)
    reason: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Score.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "ok" and (not math.isfinite(self.value) or self.reason is not None):
            raise ValueError(f"an ok Score holds a finite value and no reason, got {self.value!r}, {self.reason!r}")
        if self.kind != "ok" and (self.value != 0.0 or not self.reason):
            raise ValueError(f"a {self.kind} Score holds value 0 and a reason, got {self.value!r}, {self.reason!r}")

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def scored(value: float) -> Score:
    return Score("ok", float(value))


def failed(reason: str) -> Score:
    return Score("failed", reason=reason)


def timed_out(reason: str) -> Score:
    return Score("timed_out", reason=reason)


def unparseable(reason: str) -> Score:
    return Score("unparseable", reason=reason)


@dataclass
class Tally:
    """One source's outcomes over a batch: counts by kind and the first reason."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    first_reason: str | None = None

    def add(self, score: Score) -> None:
        self.counts[score.kind] += 1
        if not score.ok and self.first_reason is None:
            self.first_reason = score.reason

    @property
    def not_ok(self) -> int:
        return sum(n for kind, n in self.counts.items() if kind != "ok")
