"""The reward worker: the weighted sum of the configured reward functions per response.

A call that raises, returns no finite number or runs past `reward.timeout_s` gives that response 0;
the metrics count them (`reward/<name>/failed`, `reward/<name>/timed_out`) and one warning per batch
and function names the first error (roll_lite/rewards/runner.py).
"""

from __future__ import annotations

import logging

import torch

from roll_lite.runtime.importing import enter_import_root
from roll_lite.rewards.runner import RewardRunner

logger = logging.getLogger("roll_lite.rewards")


class RewardWorker:
    def __init__(self, weights: dict[str, float], timeout_s: float = 5.0, import_roots: list[str | None] = (),
                 driver_roll_lite: str | None = None):
        # The directories the driver imported the user's reward modules from, after the installed packages.
        for root in import_roots:
            enter_import_root(root, driver_roll_lite)
        self.weights = {name: float(weight) for name, weight in weights.items()}
        self.runner = RewardRunner(list(self.weights), timeout_s)

    def score(self, responses: list[str], answers: list[str],
              extras: list[dict] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """(scores [rows], metrics): reward/<name> is that function's mean over the rows (0 for failed
        calls), reward/<name>/failed and reward/<name>/timed_out count the calls that gave 0 for that."""
        extras = [{} for _ in responses] if extras is None else [dict(e or {}) for e in extras]
        if not len(responses) == len(answers) == len(extras):
            raise ValueError(f"reward: {len(responses)} responses, {len(answers)} answers, {len(extras)} extras")
        total = torch.zeros(len(responses), dtype=torch.float32)
        metrics = {}
        for name, weight in self.weights.items():
            outcome = self.runner.score(name, responses, answers, extras)
            values = torch.tensor(outcome.scores, dtype=torch.float32)
            total += weight * values
            metrics[f"reward/{name}"] = values.mean().item() if len(values) else 0.0
            metrics[f"reward/{name}/failed"] = float(outcome.failed)
            metrics[f"reward/{name}/timed_out"] = float(outcome.timed_out)
            if outcome.first_error is not None:
                logger.warning("reward %s: %d of %d responses scored 0 (%d failed, %d timed out); first: %s", name,
                               outcome.failed + outcome.timed_out, len(responses), outcome.failed, outcome.timed_out,
                               outcome.first_error)
        return total, metrics

    def close(self) -> None:
        self.runner.close()
