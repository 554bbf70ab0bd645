"""PromptSampler: which dataset rows a step gets, epoch after epoch, with a state to save and restore.

Epoch e visits every row exactly once, in an order that depends only on (seed, e): a fresh
permutation per epoch when `shuffle`, the file order otherwise. `draw(n)` hands out the next n rows,
running on into the next epoch when the current one ends (a batch may span two epochs; no row is
skipped). With `epochs` set, the sampler is exhausted after that many epochs and `draw` returns
fewer rows, then none. `state_dict()` is the position (epoch, rows already drawn from it);
`load_state_dict` continues exactly where the saved sampler stopped.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


class PromptSampler:
    def __init__(self, num_rows: int, seed: int = 0, shuffle: bool = True, epochs: Optional[int] = None):
        if num_rows < 1:
            raise ValueError(f"PromptSampler: need at least one row, got {num_rows}")
        if epochs is not None and epochs < 1:
            raise ValueError(f"PromptSampler: epochs must be >= 1 or None (unbounded), got {epochs}")
        self.num_rows, self.seed, self.shuffle, self.epochs = num_rows, seed, shuffle, epochs
        self.epoch, self.position = 0, 0
        self._order = self.epoch_order(0)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The row indices of `epoch`, in the order they are drawn."""
        if not self.shuffle:
            return np.arange(self.num_rows)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)

    @property
    def exhausted(self) -> bool:
        return self.epochs is not None and self.epoch >= self.epochs

    def draw(self, count: int) -> list[int]:
        """The next `count` row indices (fewer only when the last epoch ends)."""
        rows: list[int] = []
        while len(rows) < count and not self.exhausted:
            take = min(count - len(rows), self.num_rows - self.position)
            rows.extend(int(i) for i in self._order[self.position : self.position + take])
            self.position += take
            if self.position == self.num_rows:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self.epoch_order(self.epoch)
        return rows

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_rows": self.num_rows,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "num_rows", "shuffle"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"PromptSampler.load_state_dict: the saved sampler has {key}={state[key]!r}, "
                    f"this one {getattr(self, key)!r} (same data and data.seed / data.shuffle needed)"
                )
        if not 0 <= state["position"] < self.num_rows:
            raise ValueError(
                f"PromptSampler.load_state_dict: position {state['position']} is outside 0..{self.num_rows - 1}"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self.epoch_order(self.epoch)
