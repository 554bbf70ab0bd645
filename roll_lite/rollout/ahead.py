"""Generations launched ahead of training (rollout.async_steps = N).

At the start of step s the controller launches the generations of every step up to s + N that is not
launched yet, with the weights the rollout worker holds then (the actor's after step s - 1). So the
batch of step s is sampled with the actor's weights after step max(0, s - 1 - N), at most N steps
older than the actor that trains on it, and while step s trains the rollout worker is already
generating for the steps after it. N = 0 launches step s's generation at the start of step s: strictly on-policy.

The queue only keeps the books: which step's prompts (dataset rows) went out, and the handle of its
generation (a Ray object ref, or the Completions once fetched). What the queue holds is part of a
checkpoint: the prompts of those steps are already drawn from the sampler, and the weights they were
sampled with are gone, so the fetched completions themselves are saved (`state_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from roll_lite.rollout.engine import Completions


@dataclass
class LaunchedRollout:
    step: int
    rows: list[int]  # the dataset rows of the step's prompts
    result: Any  # a handle to wait on (the generate call's object ref), or the Completions once fetched


class RolloutQueue:
    def __init__(self, async_steps: int):
        if async_steps < 0:
            raise ValueError(f"RolloutQueue: async_steps must be >= 0, got {async_steps}")
        self.async_steps = async_steps
        self.launched: dict[int, LaunchedRollout] = {}  # by step, in launch order

    def steps_to_launch(self, step: int, last_step: int) -> range:
        """The steps whose generations are due at the start of `step` and not launched yet."""
        first = max(self.launched) + 1 if self.launched else step
        return range(first, min(step + self.async_steps, last_step) + 1)

    def add(self, step: int, rows: list[int], result: Any) -> None:
        if step in self.launched:
            raise RuntimeError(f"the generation of step {step} was launched twice")
        self.launched[step] = LaunchedRollout(step, rows, result)

    def pop(self, step: int) -> LaunchedRollout:
        if step not in self.launched:
            raise RuntimeError(f"no generation was launched for step {step} (launched: {sorted(self.launched)})")
        return self.launched.pop(step)

    def __len__(self) -> int:
        return len(self.launched)

    def state_dict(self) -> list[dict]:
        """The launched generations; every one must be fetched (its result a Completions)."""
        state = []
        for launched in self.launched.values():
            if not isinstance(launched.result, Completions):
                raise RuntimeError(f"the generation of step {launched.step} is not fetched yet; fetch it before saving")
            result = launched.result
            state.append(
                {
                    "step": launched.step,
                    "rows": launched.rows,
                    "token_ids": result.token_ids,
                    "log_probs": result.log_probs,
                    "weight_version": result.weight_version,
                    # an MoE engine's routing (router replay): per row [tokens, layers, k] as nested lists
                    "routed_experts": None
                    if result.routed_experts is None
                    else [r.tolist() for r in result.routed_experts],
                }
            )
        return state

    def load_state_dict(self, state: list[dict]) -> None:
        self.launched = {}
        for item in state:
            completions = Completions(item["token_ids"], item["log_probs"], item["weight_version"])
            if item.get("routed_experts") is not None:
                completions.routed_experts = [torch.tensor(r, dtype=torch.int16) for r in item["routed_experts"]]
            self.add(int(item["step"]), list(item["rows"]), completions)


def staleness(step: int, completions: Completions) -> int:
    """How many optimizer steps the weights that sampled step `step`'s batch are behind the actor
    that trains on it (the actor holds version step - 1 when step `step` begins)."""
    return step - 1 - completions.weight_version
