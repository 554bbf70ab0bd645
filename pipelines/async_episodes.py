"""The fully async mode for multi-turn rollouts (rollout.fully_async with environment.name): the
schedule of pipelines/async_schedule.py, with trajectories that go on by rounds of turns in place of
segments of tokens.

Cohort c is the batch step c trains on. At the start of step s:

1. every cohort c <= s + max_staleness not admitted yet is admitted: its rows are drawn and its
   environments reset (roll_lite/environments/episodes.py EpisodeLoop);
2. cohort s is played to its end, with the engine's weights s - 1, and trained on;
3. while step s trains, a thread plays every later cohort rollout.segment_turns rounds further (a
   round: each running trajectory's environment answers its last turn, then it takes its next model
   turn; on_update=finish: to its end), still with weights s - 1. The weight update of step s waits
   for that thread.

So cohort c's first turn is sampled with weights c - 1 - max_staleness or later and trained on with
weights c - 1: no turn of any trajectory is more than max_staleness versions older than the weights
trained on it. Rounds, not timing, decide what is played when: a run repeats bit for bit.
rollout.schedule=greedy plays rounds for as long as the step trains instead (more overlap; the bound
holds; the run does not repeat).

A checkpoint settles the cohorts in flight (every environment answer taken) and saves their episodes,
and for each running environment its seed, row fields and actions. A resumed run rebuilds those
environments by replaying them (EnvironmentRunner.adopt): it goes on exactly as the uninterrupted run,
and an environment whose replay differs (state outside it) ends that trajectory as "lost".
"""

from __future__ import annotations

import pickle
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from roll_lite.environments.episodes import Episode, EpisodeLoop
from roll_lite.rollout import SamplingParams

from .async_schedule import cohorts_to_admit, version_metrics
from .rollout_schedule import DrawPrompts

if TYPE_CHECKING:
    from roll_lite.workers.group import ModelGroup, RolloutClient

    from roll_lite.config.schema import RolloutConfig

EPISODES_IN_FLIGHT = "episodes_in_flight.pkl"  # in a checkpoint: the admitted batches, their episodes so far

# (cohort, its dataset rows, or None for a loop a checkpoint fills) -> the cohort's EpisodeLoop
NewLoop = Callable[[int, "list[int] | None"], EpisodeLoop]


class FullyAsyncEpisodes:
    def __init__(self, rollout: RolloutConfig, new_loop: NewLoop):
        self.max_staleness = rollout.max_staleness
        self.rounds = None if rollout.on_update == "finish" else rollout.segment_turns
        self.greedy = rollout.schedule == "greedy"
        self.new_loop = new_loop
        self.queue: dict[int, list[int]] = {}  # admitted cohorts not trained yet -> their dataset rows
        self.loops: dict[int, EpisodeLoop] = {}
        self.admitted_up_to = 0
        self.engine: RolloutClient | None = None  # the RolloutClient, once the workers run
        self._pending_sync = None
        self._ahead: RoundsAhead | None = None  # the later cohorts' rounds while a step trains
        self.last_metrics: dict[str, float] = {}

    def launch(self, step: int, total_steps: int, draw_prompts: DrawPrompts, params: SamplingParams) -> None:
        """Admit the cohorts due at the start of `step` (their environments reset meanwhile)."""
        for cohort in cohorts_to_admit(self.admitted_up_to, step, self.max_staleness, total_steps):
            drawn = draw_prompts()
            if drawn is None:
                break
            self.queue[cohort], self.loops[cohort] = drawn[0], self.new_loop(cohort, drawn[0])
            self.admitted_up_to = cohort

    def is_launched(self, step: int) -> bool:
        return step in self.queue

    def collect(self, step: int) -> tuple[list[int], list[Episode]]:
        """(the dataset rows of `step`'s batch, its episodes played to their end); then the later
        cohorts' rounds start, to run while the step trains."""
        loop = self.loops.pop(step)
        loop.play()
        episodes = loop.results()
        oldest = min((v for e in episodes for v in e.turn_versions), default=step - 1)
        if step - 1 - oldest > self.max_staleness:  # the schedule's promise; a break here is a bug in this file
            raise RuntimeError(
                f"step {step}: a trajectory's oldest turn has weight version {oldest}, {step - 1 - oldest} "
                f"versions behind the actor (rollout.max_staleness={self.max_staleness})"
            )
        played = [e for e in episodes if e.trajectory is not None]
        self.last_metrics = version_metrics(step, [[v for v in turn_token_versions(e) if v >= 0] for e in played])
        later = [self.loops[cohort] for cohort in sorted(self.loops)]
        self._ahead = RoundsAhead(later, self.rounds, self.greedy)
        return self.queue.pop(step), episodes

    def start_sync(self, actor: ModelGroup, dtype: str, version: int) -> None:
        """The actor's weights to the engine, once the later cohorts' rounds of this step are played."""
        self.wait_sync()
        self._pending_sync = self._engine().start_sync(actor, dtype, version)

    def wait_sync(self) -> None:
        self._join_ahead()
        if self._pending_sync is not None:
            ref, self._pending_sync = self._pending_sync, None
            self._engine().wait(ref, "update_weights")

    def stop(self) -> None:
        """At the end of a run that failed: no more rounds (the one in flight ends on its own)."""
        if self._ahead is not None:
            self._ahead.stopping.set()

    def save(self, folder: Path) -> None:
        self.wait_sync()
        state = {
            "admitted_up_to": self.admitted_up_to,
            "rows": self.queue,
            "loops": {cohort: loop.state_dict() for cohort, loop in self.loops.items()},
        }
        (folder / EPISODES_IN_FLIGHT).write_bytes(pickle.dumps(state))

    def load(self, folder: Path) -> None:
        if not (folder / EPISODES_IN_FLIGHT).exists():  # a lockstep run's checkpoint: nothing in flight
            return
        state = pickle.loads((folder / EPISODES_IN_FLIGHT).read_bytes())
        self.admitted_up_to, self.queue = state["admitted_up_to"], state["rows"]
        self.loops = {c: self.new_loop(c, None).load_state_dict(saved) for c, saved in state["loops"].items()}

    def _join_ahead(self) -> None:
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            ahead.join(stop=self.greedy)

    def _engine(self) -> RolloutClient:
        assert self.engine is not None  # start_workers() set it
        return self.engine


class RoundsAhead:
    """The later cohorts' rounds in a thread: `rounds` each (None: to their end), or with `greedy`
    round robin until join(stop=True)."""

    def __init__(self, loops: list[EpisodeLoop], rounds: int | None, greedy: bool):
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._play, args=(loops, rounds, greedy), daemon=True)
        self.thread.start()

    def _play(self, loops: list[EpisodeLoop], rounds: int | None, greedy: bool) -> None:
        try:
            if not greedy:  # round by round, so that stop() (a run that failed) ends it between rounds
                for loop in loops:
                    played = 0
                    while not loop.done and (rounds is None or played < rounds) and not self.stopping.is_set():
                        loop.play(1)
                        played += 1
                return
            while not self.stopping.is_set() and not all(loop.done for loop in loops):
                for loop in loops:
                    if self.stopping.is_set():
                        return
                    loop.play(1)
        except BaseException as error:  # noqa: BLE001 (raised in the driver's thread by join())
            self.error = error

    def join(self, stop: bool) -> None:
        if stop:
            self.stopping.set()
        self.thread.join()
        if self.error is not None:
            raise self.error


def turn_token_versions(episode: Episode) -> list[int]:
    """The weight version of each response token of the episode: its model turn's; -1 for the
    environment's tokens."""
    assert episode.trajectory is not None
    versions, turn = [], 0
    for ids, log_probs in episode.trajectory.pieces:
        if log_probs is None:
            versions += [-1] * len(ids)
        else:
            versions += [episode.turn_versions[turn]] * len(ids)
            turn += 1
    return versions
