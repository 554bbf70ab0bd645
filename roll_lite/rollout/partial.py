"""Partial rollouts: the generations of the fully async mode (rollout.fully_async), kept between calls.

A cohort is the batch of one training step: its prompts × num_samples rows. The rollout worker
admits it, then advances it a given number of tokens at a time (`advance`), each time with the
weights it holds then, until every row has ended (EOS or rollout.max_new_tokens); the pipeline then
takes it. Every token keeps the weight version that sampled it and the engine's log-prob under those
weights, so the loss can correct each token against its own behaviour policy.

A row continues by resubmitting its prompt and the tokens it has so far (no KV cache survives a
weight update); a vision-language policy's row resubmits its prompt's images with them (`images`: the
processor's pixel_values and image_grid_thw per prompt, kept with the cohort). The state (a checkpoint's)
records which cohorts have images, not their pixels: they are the data rows', handed back at load.
An MoE engine's routing (actor.router_replay) goes with the row: each token keeps the experts of the
forward that first read it (roll_lite/rollout/engine.py merge_routing), so a continued row's earlier tokens keep the
routing of the weights that read them first, not the new weights' prefill's. What happens to the rows in flight
when the weights change is `on_update`:

- `continue`: they go on under the new weights from where they are (AReaL's partial rollout);
- `drop`: their tokens are thrown away and they start again under the new weights (slime's);
- `finish` is not decided here: the schedule then advances a cohort to its end when admitted, so
  no row is ever in flight at an update (pipelines/async_schedule.py).

An advance of a fresh cohort to its end is exactly one `generate(prompts, params)` call, the call an
on-policy step makes, so a schedule that never splits a cohort repeats a lockstep run bit for bit.
Which rows run together in each call is fixed by the cohort and its rows' progress, never by timing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from roll_lite.rollout.engine import Completions, SamplingParams, merge_routing

ON_UPDATE = ("continue", "drop")

Generate = Callable[..., Completions]  # generate(prompts, params[, images=per prompt its image inputs or None])


@dataclass
class Row:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the weight version of each token
    done: bool = False
    experts: torch.Tensor | None = None  # an MoE engine's routing [prompt + tokens, layers, k] (merge_routing)


@dataclass
class Cohort:
    prompts: list[list[int]]
    params: SamplingParams
    on_update: str
    rows: list[Row]  # prompt-major: params.num_samples rows per prompt
    dropped_tokens: int = 0  # thrown away at weight updates (on_update=drop)
    images: list[dict | None] | None = None  # per prompt its image inputs (None: text only)

    @property
    def fresh(self) -> bool:
        return not any(row.tokens or row.done for row in self.rows)

    @property
    def finished(self) -> bool:
        return all(row.done for row in self.rows)


class PartialRollouts:
    def __init__(self, eos_token_id: int):
        self.eos_token_id = eos_token_id
        self.cohorts: dict[int, Cohort] = {}

    def admit(
        self,
        cohort: int,
        prompts: list[list[int]],
        params: SamplingParams,
        on_update: str,
        images: list[dict | None] | None = None,
    ) -> None:
        if cohort in self.cohorts:
            raise RuntimeError(f"partial rollouts: cohort {cohort} was admitted twice")
        if on_update not in ON_UPDATE:
            raise ValueError(f"partial rollouts: on_update must be one of {', '.join(ON_UPDATE)}, got '{on_update}'")
        if params.greedy:
            raise ValueError("partial rollouts sample: greedy decoding has no behaviour log-probs to keep")
        if images is not None and len(images) != len(prompts):
            raise ValueError(f"partial rollouts: {len(images)} image entries for {len(prompts)} prompts")
        rows = [Row(list(p)) for p in prompts for _ in range(params.num_samples)]
        self.cohorts[cohort] = Cohort([list(p) for p in prompts], params, on_update, rows, images=images)

    def advance(self, cohort: int, max_tokens: int | None, version: int, generate: Generate) -> int:
        """Generate up to `max_tokens` more tokens (None: to the end) for every row of `cohort` still in
        flight, with the engine's current weights (`version`). Returns the number of generate calls (0 or 1)."""
        c = self._cohort(cohort)
        if c.on_update == "drop":
            self._drop_older(c, version)
        if c.finished:
            return 0
        budget = c.params.max_new_tokens if max_tokens is None else min(max_tokens, c.params.max_new_tokens)
        if c.fresh:  # prompt-major, num_samples per prompt: the call a lockstep step makes
            result = generate(c.prompts, replace(c.params, max_new_tokens=budget), **_images(c.images))
            self._append(c, c.rows, result, version)
            return 1
        flight = [(i, row) for i, row in enumerate(c.rows) if not row.done]
        left = max(c.params.max_new_tokens - len(row.tokens) for _, row in flight)
        step = min(budget, left)
        images = None if c.images is None else [c.images[i // c.params.num_samples] for i, _ in flight]
        result = generate(
            [row.prompt + row.tokens for _, row in flight],
            replace(c.params, max_new_tokens=step, num_samples=1),
            **_images(images),
        )
        self._append(c, [row for _, row in flight], result, version)
        return 1

    def take(self, cohort: int) -> Completions:
        """The finished cohort, prompt-major, with each token's log-prob and weight version; it leaves."""
        c = self._cohort(cohort)
        if not c.finished:
            raise RuntimeError(f"partial rollouts: cohort {cohort} is not finished ({self.describe(cohort)})")
        del self.cohorts[cohort]
        versions = [row.versions for row in c.rows]
        routed = [row.experts for row in c.rows]
        return Completions(
            [row.tokens for row in c.rows],
            [row.log_probs for row in c.rows],
            weight_version=min((v for row in versions for v in row), default=-1),
            token_versions=versions,
            dropped_tokens=c.dropped_tokens,
            routed_experts=routed if all(r is not None for r in routed) else None,
        )

    def describe(self, cohort: int) -> str:
        c = self._cohort(cohort)
        done = sum(row.done for row in c.rows)
        return f"{done}/{len(c.rows)} rows ended, {sum(len(row.tokens) for row in c.rows)} tokens"

    def _cohort(self, cohort: int) -> Cohort:
        if cohort not in self.cohorts:
            raise RuntimeError(f"partial rollouts: no cohort {cohort} in flight (in flight: {sorted(self.cohorts)})")
        return self.cohorts[cohort]

    def _drop_older(self, c: Cohort, version: int) -> None:
        for row in c.rows:
            if not row.done and row.versions and row.versions[-1] != version:
                c.dropped_tokens += len(row.tokens)
                row.tokens, row.log_probs, row.versions, row.experts = [], [], [], None

    def _append(self, c: Cohort, rows: list[Row], result: Completions, version: int) -> None:
        """Each row's new tokens, cut to what its max_new_tokens leaves (one call runs rows of different
        lengths to the longest budget)."""
        if len(result.token_ids) != len(rows) or result.log_probs is None:
            raise RuntimeError(
                f"partial rollouts: the engine returned {len(result.token_ids)} rows "
                f"{'without' if result.log_probs is None else 'with'} log-probs for {len(rows)} sampled rows"
            )
        limit = c.params.max_new_tokens
        for i, (row, tokens, log_probs) in enumerate(zip(rows, result.token_ids, result.log_probs)):
            room = limit - len(row.tokens)
            if result.routed_experts is not None:
                context = len(row.prompt) + len(row.tokens)
                row.experts = merge_routing(row.experts, result.routed_experts[i], context, len(tokens[:room]))
            row.tokens += tokens[:room]
            row.log_probs += log_probs[:room]
            row.versions += [version] * len(tokens[:room])
            row.done = len(row.tokens) == limit or (bool(row.tokens) and row.tokens[-1] == self.eos_token_id)

    def state_dict(self) -> dict:
        return {
            str(number): {
                "prompts": c.prompts,
                "params": vars(c.params),
                "on_update": c.on_update,
                "dropped_tokens": c.dropped_tokens,
                "rows": [{**vars(row), "experts": _listed(row.experts)} for row in c.rows],
                "with_images": c.images is not None,  # the pixels come back from the data rows at load
            }
            for number, c in self.cohorts.items()
        }

    def load_state_dict(self, state: dict, images: dict[int, list[dict | None]] | None = None) -> None:
        """`images`: per cohort with images, its prompts' image inputs (its data rows', as admitted)."""
        images = images or {}
        for number, c in state.items():
            if c.get("with_images") and int(number) not in images:
                raise RuntimeError(f"partial rollouts: cohort {number} was admitted with images; none given to load")
            if c.get("with_images") and len(images[int(number)]) != len(c["prompts"]):
                raise RuntimeError(
                    f"partial rollouts: cohort {number}: {len(images[int(number)])} image entries for "
                    f"{len(c['prompts'])} prompts"
                )
        self.cohorts = {
            int(number): Cohort(
                c["prompts"],
                SamplingParams(**c["params"]),
                c["on_update"],
                [Row(**{**row, "experts": _tensor(row.get("experts"))}) for row in c["rows"]],
                int(c["dropped_tokens"]),
                images=images[int(number)] if c.get("with_images") else None,
            )
            for number, c in state.items()
        }


def _images(images: list[dict | None] | None) -> dict:
    """generate's keyword for the prompts' images: none for a text cohort (a text engine takes no images)."""
    return {} if images is None else {"images": images}


def _listed(experts: torch.Tensor | None) -> list | None:  # the state is JSON (pipelines/async_schedule.py)
    return None if experts is None else experts.tolist()


def _tensor(experts: list | None) -> torch.Tensor | None:
    return None if experts is None else torch.tensor(experts, dtype=torch.int16)
