"""The fully async schedule of multi-turn batches (pipelines/async_episodes.py) driven as PPOPipeline.step
drives it, with the real environment runner and an engine that plays guess-the-number: no turn of any
trajectory is more than max_staleness weight versions older than the weights trained on it, in every
setting, greedy included; the deterministic schedule makes the same engine calls run after run."""

from __future__ import annotations

import threading
import time

import pytest
from roll_lite.pipelines.async_episodes import FullyAsyncEpisodes
from test_episode_rounds import GAME, LIMITS, PARAMS, VersionedEngine
from test_episodes import TOKENIZER

from roll_lite.config import RolloutConfig
from roll_lite.environments import EnvironmentRunner
from roll_lite.environments.episodes import EpisodeLoop, EpisodeStart

STEPS, ROWS_PER_STEP = 6, 2


class Client(VersionedEngine):
    """The rollout client as the schedule and the loops see it: a weight update sets the version."""

    def start_sync(self, actor, dtype, version):
        self.version = version
        return None

    def wait(self, ref, method):
        return ref


def run(max_staleness: int, on_update="continue", segment_turns=1, schedule="deterministic", train_s=0.0, engine=None):
    """Every step's episodes, and the engine's calls."""
    rollout = RolloutConfig(
        fully_async=True,
        max_staleness=max_staleness,
        on_update=on_update,
        segment_turns=segment_turns,
        schedule=schedule,
        num_samples=2,
    )
    engine, secrets = engine or Client(), iter(range(1, 17))
    with EnvironmentRunner("guess_the_number", GAME, max_concurrent=2, step_timeout_s=10) as runner:

        def new_loop(cohort, rows):
            starts = [EpisodeStart((row, sample, cohort), row, {"secret": row}) for row in rows for sample in range(2)]
            return EpisodeLoop(engine, runner, TOKENIZER, PARAMS, LIMITS).start(starts)

        schedule, episodes = FullyAsyncEpisodes(rollout, new_loop), {}
        schedule.engine = engine
        draw = lambda: ([next(secrets) for _ in range(ROWS_PER_STEP)], [])  # noqa: E731
        for step in range(1, STEPS + 1):
            schedule.launch(step, STEPS, draw, PARAMS)
            episodes[step] = schedule.collect(step)[1]
            time.sleep(train_s)  # the step trains while the later batches play
            schedule.start_sync(None, "float32", version=step)
        schedule.wait_sync()
    return episodes, engine.calls


@pytest.mark.parametrize(
    "max_staleness, on_update, segment_turns, schedule",
    [
        (0, "continue", 1, "deterministic"),
        (1, "continue", 1, "deterministic"),
        (2, "continue", 2, "deterministic"),
        (1, "finish", 1, "deterministic"),
        (2, "continue", 1, "greedy"),
    ],
)
def test_no_turn_is_more_than_max_staleness_versions_behind(max_staleness, on_update, segment_turns, schedule):
    episodes, _ = run(max_staleness, on_update, segment_turns, schedule, train_s=0.05 if schedule == "greedy" else 0)
    versions = {step: [v for e in batch for v in e.turn_versions] for step, batch in episodes.items()}
    for step, seen in versions.items():
        assert seen and all(step - 1 - max_staleness <= v <= step - 1 for v in seen), (step, seen)
    if max_staleness and on_update == "continue":  # later batches played ahead: older turns were trained on
        assert any(v < step - 1 for step, seen in versions.items() for v in seen)


def test_the_deterministic_schedule_makes_the_same_engine_calls_whatever_the_training_time():
    assert run(2, train_s=0.0)[1] == run(2, train_s=0.05)[1]


class DiesWhileAStepTrains(Client):
    """Raises on its first call from the thread that plays the later batches."""

    def start_generate(self, prompts, params):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("the rollout worker died")
        return super().start_generate(prompts, params)


def test_an_engine_failure_while_a_step_trains_stops_the_step_at_its_weight_update():
    with pytest.raises(RuntimeError, match="the rollout worker died"):
        run(1, engine=DiesWhileAStepTrains())
