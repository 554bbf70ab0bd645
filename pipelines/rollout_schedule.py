"""The RL pipeline's side of generation: when each step's batch is launched and collected, and the
weight updates queued on the rollout engine between them.

On-policy (rollout.async_steps = 0) a step's batch is launched at its start and generated after the
previous step's weight update. With async_steps = N the batches of the next N steps are launched too,
with the weights the engine holds then (roll_lite/rollout/ahead.py). A weight update queues on the
engine behind the generations in flight; whatever needs the new weights waits for it first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, cast

from roll_lite.rollout import Completions, SamplingParams
from roll_lite.rollout.ahead import RolloutQueue

if TYPE_CHECKING:
    from roll_lite.workers.group import ModelGroup, RolloutClient

ROLLOUTS_AHEAD = "rollouts_ahead.json"  # in a checkpoint: the generations launched for later steps
# in a checkpoint of the fully async mode (pipelines/async_schedule.py): the admitted batches, their tokens so far
IN_FLIGHT = "rollouts_in_flight.json"

# () -> (dataset rows, their prompt ids[, their image inputs]) of the next prompts, or None when they are used up
DrawPrompts = Callable[[], "tuple[list[int], list[list[int]]] | tuple[list[int], list[list[int]], list[dict]] | None"]


class RolloutSchedule:
    def __init__(self, async_steps: int):
        self.queue = RolloutQueue(async_steps)  # generations launched, by step
        self.on_policy = async_steps == 0
        self.engine: RolloutClient | None = None  # the RolloutClient, once the workers run
        self._pending_sync = None  # the engine's weight update, not confirmed yet
        self.last_metrics: dict[str, float] = {}  # the fully async mode's (pipelines/async_schedule.py)

    def launch(self, step: int, total_steps: int, draw_prompts: DrawPrompts, params: SamplingParams) -> None:
        """Start the generations due at the start of `step`: its own and, with async_steps = N, those of
        the next N steps, each on the next prompts, with the weights the engine holds now (the actor's
        after step - 1)."""
        for later in self.queue.steps_to_launch(step, total_steps):
            drawn = draw_prompts()
            if drawn is None:
                break
            rows, prompt_ids, *images = drawn  # image rows: their image inputs too (the hf engine)
            assert self.engine is not None  # the workers run
            self.queue.add(later, rows, self.engine.start_generate(prompt_ids, params, *images))

    def is_launched(self, step: int) -> bool:
        return step in self.queue.launched

    def collect(self, step: int) -> tuple[list[int], Completions]:
        """(the dataset rows of `step`'s batch, what the engine generated for them)."""
        launched = self.queue.pop(step)
        completions = self._fetched(launched.result)
        if self.on_policy:
            self.wait_sync()  # it ran before this generation: its answer is there, and must be a success
        return launched.rows, completions

    def start_sync(self, actor: ModelGroup, dtype: str, version: int) -> None:
        """The actor's weights to the engine. The load queues on the rollout worker and the step goes on;
        the next sync, an evaluation, a checkpoint and, on-policy, the next step's batch wait for it."""
        self.wait_sync()
        assert self.engine is not None  # the workers run
        self._pending_sync = self.engine.start_sync(actor, dtype, version)

    def wait_sync(self) -> None:
        if self._pending_sync is not None:
            ref, self._pending_sync = self._pending_sync, None
            assert self.engine is not None  # it started the pending sync
            self.engine.wait(ref, "update_weights")

    def save(self, folder: Path) -> None:
        """The generations launched ahead, fetched first: a checkpoint keeps them, their weights are gone."""
        self.wait_sync()
        for launched in self.queue.launched.values():
            launched.result = self._fetched(launched.result)
        (folder / ROLLOUTS_AHEAD).write_text(json.dumps(self.queue.state_dict()))

    def load(self, folder: Path) -> None:
        in_flight = folder / IN_FLIGHT
        if in_flight.exists() and json.loads(in_flight.read_text())["rows"]:
            raise RuntimeError(
                f"{folder}: its run had batches in flight in the fully async mode; resume it with "
                "rollout.fully_async=true (the same rollout.max_staleness)"
            )
        # checkpoints written before rollout.async_steps existed have no such file: nothing was ahead
        ahead = folder / ROLLOUTS_AHEAD
        self.queue.load_state_dict(json.loads(ahead.read_text()) if ahead.exists() else [])

    def _fetched(self, result) -> Completions:
        # cast: a generation in flight was started on the engine
        return (
            result if isinstance(result, Completions) else cast("RolloutClient", self.engine).wait(result, "generate")
        )
