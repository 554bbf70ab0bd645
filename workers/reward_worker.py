"""The reward worker: the weighted sum of the configured reward functions per response.

Each function gives each response a typed outcome (roll_lite/rewards/outcomes.py). A response whose
every function scored it `ok` is scored; any other is unscored: with reward.on_failure=zero the
function that did not score it adds 0 (and the response trains on the rest), with drop the pipeline
takes it out of the loss (pipelines/unscored.py). The metrics count each kind per function
(`reward/<name>/failed`, `/timed_out`, `/unparseable`) and the unscored responses (`reward/unscored`);
one warning per batch names the first reason.
"""

from __future__ import annotations

import logging

import torch

from roll_lite.rewards.outcomes import KINDS, Tally
from roll_lite.rewards.runner import RewardRunner
from roll_lite.runtime.importing import enter_import_root

logger = logging.getLogger("roll_lite.rewards")


class RewardWorker:
    def __init__(self, weights: dict[str, float], timeout_s: float = 5.0, import_roots: list[str | None] = (),
                 driver_roll_lite: str | None = None, on_failure: str = "zero"):
        # The directories the driver imported the user's reward modules from, after the installed packages.
        for root in import_roots:
            enter_import_root(root, driver_roll_lite)
        self.weights = {name: float(weight) for name, weight in weights.items()}
        self.on_failure = on_failure
        self.runner = RewardRunner(list(self.weights), timeout_s)

    def score(self, responses: list[str], answers: list[str],
              extras: list[dict] | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(scores [rows], scored [rows] bool: every function gave that row a score, metrics).
        reward/<name> is the function's mean over the rows it scored; reward/<name>/<kind> counts the
        rows it did not score, by kind; reward/unscored counts the rows some function did not score."""
        extras = [{} for _ in responses] if extras is None else [dict(e or {}) for e in extras]
        if not len(responses) == len(answers) == len(extras):
            raise ValueError(f"reward: {len(responses)} responses, {len(answers)} answers, {len(extras)} extras")
        total = torch.zeros(len(responses), dtype=torch.float32)
        scored = torch.ones(len(responses), dtype=torch.bool)
        metrics, tallies = {}, {}
        for name, weight in self.weights.items():
            outcomes = self.runner.score(name, responses, answers, extras)
            tally = tallies[name] = Tally()
            for outcome in outcomes:
                tally.add(outcome)
            values = torch.tensor([outcome.value for outcome in outcomes], dtype=torch.float32)
            ok = torch.tensor([outcome.ok for outcome in outcomes], dtype=torch.bool)
            total += weight * values  # 0 where not ok
            scored &= ok
            metrics[f"reward/{name}"] = values[ok].mean().item() if ok.any() else 0.0
            metrics.update({f"reward/{name}/{kind}": float(tally.counts[kind]) for kind in KINDS if kind != "ok"})
        metrics["reward/unscored"] = float((~scored).sum())
        self._warn(tallies, len(responses), int((~scored).sum()))
        return total, scored, metrics

    def _warn(self, tallies: dict[str, Tally], rows: int, unscored: int) -> None:
        if not unscored:
            return
        counts = "; ".join(f"{name}: " + ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in tally.counts.items()
                                                   if kind != "ok" and n)
                           for name, tally in tallies.items() if tally.not_ok)
        first = next(f"{name}: {tally.first_reason}" for name, tally in tallies.items() if tally.first_reason)
        then = ("scored 0 by those functions (reward.on_failure=zero)" if self.on_failure == "zero" else
                "taken out of the loss and their groups' baselines (reward.on_failure=drop)")
        logger.warning("rewards: %d of %d responses unscored (%s), %s; first: %s", unscored, rows, counts, then, first)

    def close(self) -> None:
        self.runner.close()
