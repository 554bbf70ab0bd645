"""What one reset or step of one environment gave: its checked return, or the fault that ended it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

from roll_lite.environments.contract import Observation

# Why a trajectory ended early. Each ends that trajectory only; the runner goes on.
FAULTS = {
    "raised": "reset or step raised an exception (the error names it)",
    "timed_out": "the call ran past step_timeout_s; its process was killed and started again",
    "bad_return": "reset or step returned something the contract does not allow (the error says what)",
    "bad_image": "an image of the observation cannot be read or encoded, or the policy reads no images "
    "(the error says which)",
    "crashed": "the process died during the call (os._exit, a segfault, the OOM killer)",
    "lost": "its process was restarted for another environment's fault, and replaying this one's actions on "
    "a new instance did not give the same results (a non-deterministic environment) or itself failed",
}


@dataclass
class Result:
    env_id: Hashable
    observation: Observation | None = None  # None when the call faulted
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict = field(default_factory=dict)
    fault: str | None = None  # one of FAULTS
    error: str | None = None  # the fault's text, one line
    seconds: float = 0.0  # the call's time in its process (a timed-out call: the time waited)

    @property
    def done(self) -> bool:
        """The trajectory is over: the environment ended it, or a fault did."""
        return self.terminated or self.truncated or self.fault is not None
