"""DomainSampler: prompts drawn by domain weight (data.domain_weights), deterministic and resumable.

Each prompt of a step comes from domain d with probability w_d / sum(w). The domain of each slot is
drawn from a generator seeded by (seed, the number of draws so far), so it depends on nothing but
the position; within a domain, rows come from a PromptSampler of that domain's rows (a fresh seeded
permutation per epoch of that domain, every row once per epoch). The state is that position and
each domain's sampler state: a resume continues exactly. With weights, each domain cycles through
its rows without end: data.epochs must be null.
"""

from __future__ import annotations

import numpy as np

from roll_lite.data.files import DataError, Table
from roll_lite.data.prompts import PromptData
from roll_lite.data.sampler import PromptSampler

_DOMAIN_STREAM = 7919  # keeps the domain draws' generator apart from the domains' own permutations


class DomainSampler:
    def __init__(self, row_domains: list[str], weights: dict[str, float], seed: int = 0, shuffle: bool = True):
        """`row_domains`: each training row's domain; `weights`: domain -> weight (every domain of the
        rows named, weights >= 0, some > 0)."""
        present = sorted(set(row_domains))
        if unweighted := [d for d in present if d not in weights]:
            raise DataError(
                f"data.domain_weights: the data has domain(s) {', '.join(map(repr, unweighted))} with no "
                f"weight; give each a weight (0 leaves it out)"
            )
        if absent := [d for d in weights if d not in present]:
            raise DataError(f"data.domain_weights: no training row has domain(s) {', '.join(map(repr, absent))}")
        if any(w < 0 for w in weights.values()) or not any(w > 0 for w in weights.values()):
            raise DataError(f"data.domain_weights: weights must be >= 0 and one > 0, got {weights}")
        self.domains = [d for d in present if weights[d] > 0]
        total = sum(weights[d] for d in self.domains)
        self.probabilities = np.array([weights[d] / total for d in self.domains])
        self.rows = {d: [i for i, row_domain in enumerate(row_domains) if row_domain == d] for d in self.domains}
        self.samplers = {d: PromptSampler(len(self.rows[d]), seed + k, shuffle) for k, d in enumerate(self.domains)}
        self.seed, self.draws, self.num_rows = seed, 0, len(row_domains)

    exhausted = False  # every domain cycles without end

    def draw(self, count: int) -> list[int]:
        """The next `count` row indices."""
        generator = np.random.default_rng([self.seed, _DOMAIN_STREAM, self.draws])
        picks = generator.choice(len(self.domains), size=count, p=self.probabilities)
        self.draws += 1
        rows = []
        for pick in picks:
            domain = self.domains[int(pick)]
            rows.append(self.rows[domain][self.samplers[domain].draw(1)[0]])
        return rows

    def state_dict(self) -> dict:
        return {
            "draws": self.draws,
            "seed": self.seed,
            "num_rows": self.num_rows,
            "probabilities": self.probabilities.tolist(),
            "domains": {d: s.state_dict() for d, s in self.samplers.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        if "domains" not in state:
            raise ValueError("DomainSampler.load_state_dict: the checkpoint's sampler drew without data.domain_weights")
        for key in ("seed", "num_rows"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"DomainSampler.load_state_dict: the saved sampler has {key}={state[key]!r}, this one "
                    f"{getattr(self, key)!r} (same data and data.seed needed)"
                )
        if list(state["domains"]) != self.domains or not np.allclose(state["probabilities"], self.probabilities):
            raise ValueError(
                f"DomainSampler.load_state_dict: the saved sampler drew domains {list(state['domains'])} "
                f"with probabilities {state['probabilities']}, this one {self.domains} with "
                f"{self.probabilities.tolist()} (same data.domain_weights needed)"
            )
        self.draws = int(state["draws"])
        for domain, sampler_state in state["domains"].items():
            self.samplers[domain].load_state_dict(sampler_state)


def training_sampler(data, rows: PromptData | list[dict], seed: int) -> PromptSampler | DomainSampler:
    """The RL pipeline's sampler of the training rows: `rows` is a PromptData, or the rows' dicts of a
    multi-turn run (each seeds an environment). By data.domain_weights when set (each row's domain is
    its data.domain_key field), else every row once per epoch."""
    if not data.domain_weights:
        return PromptSampler(len(rows), seed, data.shuffle, data.epochs)
    fields = rows.extras if isinstance(rows, PromptData) else rows
    return DomainSampler([row[data.domain_key] for row in fields], dict(data.domain_weights), seed, data.shuffle)


def check_row_domains(table: Table, data) -> None:
    """Every row of `table` names its domain (data.domain_key), one that data.domain_weights weighs:
    the check of a multi-turn run's training rows (PromptData's rows are checked as they are read,
    roll_lite/data/prompts.py). A DataError names the file, the row and the domain."""
    key = data.domain_key
    for i, row in enumerate(table.rows):
        domain = row.get(key)
        if domain is None:
            raise DataError(
                f"{table.where(i)}: key '{key}' (data.domain_key: data.domain_weights draws each row by it) "
                "is missing or null"
            )
        if domain not in list(data.domain_weights):  # a list: a row's value may be unhashable
            raise DataError(
                f"{table.where(i)}: key '{key}': domain {domain!r} has no weight in data.domain_weights "
                f"({', '.join(data.domain_weights)}); give it one (0 leaves it out) or leave its rows out"
            )
