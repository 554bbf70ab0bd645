"""The reward worker: weighted sum of registered rule rewards per response."""

from __future__ import annotations

import torch

from roll_lite.rewards import get_reward


class RewardWorker:
    def __init__(self, weights: dict[str, float]):
        self.functions = {name: (get_reward(name), float(weight)) for name, weight in weights.items()}

    def score(self, responses: list[str], answers: list[str]) -> tuple[torch.Tensor, dict[str, float]]:
        """(scores [rows], {reward/<name>: mean of that function}) for the responses."""
        if len(responses) != len(answers):
            raise ValueError(f"reward: {len(responses)} responses but {len(answers)} answers")
        total = torch.zeros(len(responses), dtype=torch.float32)
        means = {}
        for name, (fn, weight) in self.functions.items():
            values = torch.tensor([fn(r, a) for r, a in zip(responses, answers)], dtype=torch.float32)
            total += weight * values
            means[f"reward/{name}"] = values.mean().item() if len(values) else 0.0
        return total, means
