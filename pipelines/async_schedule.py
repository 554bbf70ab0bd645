"""The fully async mode's schedule (rollout.fully_async): what the rollout worker generates, for which
step, with which weights, decided by step numbers alone, so a run repeats bit for bit.

Cohort c is the batch step c trains on. The engine holds weight version v (the actor after step v)
from the end of step v. At the start of step s (the engine then has, or will have before anything
queued after it, version s - 1) the schedule queues on the rollout worker, in this order:

1. admit every cohort c <= s + max_staleness not admitted yet (its prompts are drawn now, in order);
2. finish cohort s: generate what its rows still lack, with version s - 1, and take it;
3. advance every later admitted cohort by rollout.segment_tokens tokens (on_update=finish: to its
   end), still with version s - 1, while step s trains.

The weight update of step s queues behind them. So cohort c's first tokens have version
max(0, c - 1 - max_staleness) or later, and step c trains on weights c - 1: no token of any sample is
more than max_staleness versions older than the weights being trained, by construction, whatever the
speed of the engine or the trainer. Timing decides only how long each wait is.

- max_staleness=0: cohort s is admitted and generated whole at the start of step s, one generate
  call with the actor's latest weights: the lockstep on-policy run, bit for bit.
- on_update=finish: a cohort is generated whole when admitted: rollout.async_steps=max_staleness, bit for bit.
- on_update=continue / drop: a cohort in flight at an update goes on under the new weights from its
  tokens so far / starts its unfinished rows again (roll_lite/rollout/partial.py).

rollout.schedule=greedy replaces step 3 with timing: the later cohorts advance a segment at a time for
as long as step s trains (GreedyAdvance). The bound above still holds, since it is set at admission,
but how far a cohort gets before an update depends on speed, so a run does not repeat.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from roll_lite.rollout import Completions, SamplingParams

from .rollout_schedule import IN_FLIGHT, ROLLOUTS_AHEAD, DrawPrompts

if TYPE_CHECKING:
    from roll_lite.workers.group import ModelGroup, RolloutClient

    from roll_lite.config.schema import RolloutConfig


def segment_tokens(rollout: RolloutConfig) -> int | None:
    """Tokens a later cohort advances per step; None: to its end (on_update=finish)."""
    if rollout.on_update == "finish":
        return None
    if rollout.segment_tokens is not None:
        return rollout.segment_tokens
    return math.ceil(rollout.max_new_tokens / 2)


def cohorts_to_admit(admitted_up_to: int, step: int, max_staleness: int, total_steps: int) -> range:
    """The cohorts due at the start of `step` that are not admitted yet (also async_episodes.py's)."""
    return range(max(admitted_up_to, step - 1) + 1, min(step + max_staleness, total_steps) + 1)


def version_metrics(step: int, versions: list[list[int]]) -> dict[str, float]:
    """Per token: how old its weights are; the share of samples whose tokens span several versions.
    `versions`: each sample's sampled tokens' weight versions (also async_episodes.py's)."""
    tokens = [v for row in versions for v in row]
    return {
        "rollout/staleness_token_mean": sum(step - 1 - v for v in tokens) / max(len(tokens), 1),
        "rollout/mixed_version_share": sum(len(set(row)) > 1 for row in versions) / max(len(versions), 1),
    }


def admission_version(cohort: int, max_staleness: int) -> int:
    """The weight version cohort `cohort` is admitted with (its oldest tokens' at most this old)."""
    return max(0, cohort - 1 - max_staleness)


class FullyAsyncSchedule:
    def __init__(self, rollout: RolloutConfig, images_of: Callable[[list[int]], list | None] | None = None):
        # the image inputs of dataset rows (None: text rows): a checkpoint's cohorts get theirs back at load
        self.images_of = images_of
        self.max_staleness = rollout.max_staleness
        self.on_update = "continue" if rollout.on_update == "finish" else rollout.on_update
        self.segment = segment_tokens(rollout)
        self.greedy = rollout.schedule == "greedy"
        self._advancing: GreedyAdvance | None = None  # schedule=greedy: the advances while a step trains
        self.queue: dict[int, list[int]] = {}  # admitted cohorts not trained yet -> their dataset rows
        self.admitted_up_to = 0  # the last cohort admitted
        self.engine: RolloutClient | None = None  # the RolloutClient, once the workers run
        self._pending_sync = None  # the engine's weight update, not confirmed yet
        self._finishing: dict[int, object] = {}  # cohort -> its finish call's object ref
        # admit / advance calls queued and not checked yet; those queued before a finish call have run
        # when it answers, the ones after it run while the step trains (waiting on them would serialize)
        self._advances: list[object] = []
        self._before_finish: dict[int, list[object]] = {}  # step -> the calls queued before its finish
        self.last_metrics: dict[str, float] = {}  # the last collected batch's (metrics())

    def launch(self, step: int, total_steps: int, draw_prompts: DrawPrompts, params: SamplingParams) -> None:
        engine = self._engine()
        for cohort in cohorts_to_admit(self.admitted_up_to, step, self.max_staleness, total_steps):
            drawn = draw_prompts()
            if drawn is None:
                break
            rows, prompt_ids, *images = drawn  # image rows: their image inputs too, kept with the cohort (partial.py)
            self._advances.append(engine.start_call("admit", cohort, prompt_ids, params, self.on_update, *images))
            self.queue[cohort], self.admitted_up_to = rows, cohort
        if step not in self.queue:
            return  # the prompts are used up: collect says so
        self._before_finish[step], self._advances = self._advances, []
        self._finishing[step] = engine.start_call("finish", step)
        later = sorted(c for c in self.queue if c > step)
        if self.greedy:
            self._advancing = GreedyAdvance(engine, later, self.segment)
            return
        for cohort in later:
            self._advances.append(engine.start_call("advance", cohort, self.segment))

    def is_launched(self, step: int) -> bool:
        return step in self.queue

    def collect(self, step: int) -> tuple[list[int], Completions]:
        """(the dataset rows of `step`'s batch, its completions with each token's weight version)."""
        engine = self._engine()
        completions = engine.wait(self._finishing.pop(step), "finish")
        self._check(self._before_finish.pop(step))  # they ran before the finish call: no wait
        behind = step - 1 - completions.weight_version
        if behind > self.max_staleness:  # the schedule's promise; a break here is a bug in this file
            raise RuntimeError(
                f"step {step}: a sample's oldest token has weight version {completions.weight_version}, "
                f"{behind} versions behind the actor (rollout.max_staleness={self.max_staleness})"
            )
        self.last_metrics = self.metrics(step, completions)
        return self.queue.pop(step), completions

    def metrics(self, step: int, completions: Completions) -> dict[str, float]:
        """version_metrics, the tokens dropped at updates, and the engine's generate time."""
        return {
            **version_metrics(step, completions.token_versions or []),
            "rollout/dropped_tokens": completions.dropped_tokens,
            # the engine's generate time since the previous batch: with perf/step_s, its idle share
            "perf/engine_busy_s": completions.engine_s,
        }

    def start_sync(self, actor: ModelGroup, dtype: str, version: int) -> None:
        """The actor's weights to the engine, queued behind this step's advances."""
        self.wait_sync()
        self._stop_advancing()
        self._pending_sync = self._engine().start_sync(actor, dtype, version)

    def wait_sync(self) -> None:
        if self._pending_sync is not None:
            ref, self._pending_sync = self._pending_sync, None
            self._engine().wait(ref, "update_weights")

    def save(self, folder: Path) -> None:
        """The admitted cohorts and the rollout worker's partial rollouts (tokens, log-probs, versions)."""
        self.wait_sync()
        self._stop_advancing()
        self._check_advances()
        state = self._engine().call("partial_state")
        rows = {str(cohort): rows for cohort, rows in self.queue.items()}
        (folder / IN_FLIGHT).write_text(
            json.dumps({"admitted_up_to": self.admitted_up_to, "rows": rows, "partial": state})
        )

    def load(self, folder: Path) -> None:
        if not (folder / IN_FLIGHT).exists():  # a lockstep run's checkpoint
            if (folder / ROLLOUTS_AHEAD).exists() and json.loads((folder / ROLLOUTS_AHEAD).read_text()):
                raise RuntimeError(
                    f"{folder}: its run generated batches ahead with rollout.async_steps; resume it with "
                    "rollout.fully_async=false (the same rollout.async_steps)"
                )
            return
        saved = json.loads((folder / IN_FLIGHT).read_text())
        self.admitted_up_to = int(saved["admitted_up_to"])
        self.queue = {int(cohort): rows for cohort, rows in saved["rows"].items()}
        # image rows: their pixels are the data's, not the checkpoint's (roll_lite/rollout/partial.py)
        images = {c: self.images_of(rows) for c, rows in self.queue.items()} if self.images_of is not None else {}
        self._engine().call("load_partial_state", saved["partial"], {c: i for c, i in images.items() if i is not None})

    def _stop_advancing(self) -> None:
        if self._advancing is not None:
            advancing, self._advancing = self._advancing, None
            advancing.stop()

    def _check_advances(self) -> None:
        self._check(self._advances)
        self._advances = []

    def _check(self, refs: list[object]) -> None:
        """Their answers (an error in one raises here, naming the call)."""
        engine = self._engine()
        for ref in refs:
            engine.wait(ref, "advance")

    def _engine(self) -> RolloutClient:
        assert self.engine is not None  # start_workers() set it
        return self.engine


class GreedyAdvance:
    """schedule=greedy: while a step trains, advance the later cohorts segment by segment, one call at
    a time and round robin, until each has ended or `stop()` (the step's weight update is due). How
    far they get depends on how long the step trains: the run does not repeat bit for bit."""

    def __init__(self, engine: RolloutClient, cohorts: list[int], segment: int | None):
        self.engine, self.segment = engine, segment
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._advance, args=(list(cohorts),), daemon=True)
        self.thread.start()

    def _advance(self, cohorts: list[int]) -> None:
        try:
            while cohorts and not self.stopping.is_set():
                for cohort in list(cohorts):
                    if self.stopping.is_set():
                        return
                    if not self.engine.wait(self.engine.start_call("advance", cohort, self.segment), "advance"):
                        cohorts.remove(cohort)  # ended: nothing was generated
        except BaseException as error:  # noqa: BLE001 (handed to the driver's thread in stop())
            self.error = error

    def stop(self) -> None:
        """Ask for no more advances and wait for the one in flight (a segment at most)."""
        self.stopping.set()
        self.thread.join()
        if self.error is not None:
            raise self.error
