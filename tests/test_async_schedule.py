"""pipelines/async_schedule.py without Ray: the fully async schedule driven like PPOPipeline.step drives
it, against a rollout worker whose sampled tokens depend on the weight version that samples them.

- No sample's oldest token is more than max_staleness versions behind the weights that train on it.
- Timing decides nothing: an engine run on a thread of its own, with random delays on both sides,
  gives the same batches as one that answers at once.
- on_update=finish makes the engine calls of rollout.async_steps; max_staleness=0 those of lockstep."""

import random
import threading
import time
from concurrent.futures import Future
from queue import Queue

import pytest

from pipelines.async_schedule import FullyAsyncSchedule, admission_version
from pipelines.rollout_schedule import RolloutSchedule
from roll_lite.config.schema import RolloutConfig
from roll_lite.rollout import Completions, SamplingParams
from roll_lite.rollout.partial import PartialRollouts

EOS, STEPS, PROMPTS_PER_STEP = 0, 7, 2
PARAMS = SamplingParams(max_new_tokens=6, num_samples=2, temperature=1.0)


class VersionedWorker:
    """The rollout worker's partial-rollout calls; a token depends on its prefix and on the weights."""

    def __init__(self, pause=None):
        self.version, self.pause = 0, pause  # pause: () -> seconds to sleep in each generate call
        self.partial = PartialRollouts(EOS)
        self.generated: list[tuple] = []  # (prompts, max_new_tokens, num_samples, version) per generate call

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Completions:
        if self.pause is not None:
            time.sleep(self.pause())
        self.generated.append(([list(p) for p in prompts], params.max_new_tokens, params.num_samples, self.version))
        rows = []
        for prompt in prompts:
            for _ in range(params.num_samples):
                row = list(prompt)
                for _ in range(params.max_new_tokens):
                    row.append((sum(row) * 6 + len(row) + 3 * self.version) % 11)
                    if row[-1] == EOS:
                        break
                rows.append(row[len(prompt) :])
        return Completions(rows, [[-float(self.version)] * len(r) for r in rows], self.version)

    def admit(self, cohort, prompts, params, on_update):
        self.partial.admit(cohort, prompts, params, on_update)

    def advance(self, cohort, max_tokens):
        return self.partial.advance(cohort, max_tokens, self.version, self.generate)

    def finish(self, cohort):
        self.partial.advance(cohort, None, self.version, self.generate)
        return self.partial.take(cohort)

    def update_weights(self, version):
        self.version = version


class InlineClient:
    """RolloutClient's calls, answered at once (`threaded`: in order, on a thread of their own)."""

    def __init__(self, worker: VersionedWorker, threaded: bool = False):
        self.worker, self.queue = worker, Queue() if threaded else None
        if self.queue is not None:
            threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            future, method, args = self.queue.get()
            future.set_result(getattr(self.worker, method)(*args))

    def start_call(self, method, *args):
        future = Future()
        if self.queue is None:
            future.set_result(getattr(self.worker, method)(*args))
        else:
            self.queue.put((future, method, args))
        return future

    def call(self, method, *args):
        return self.start_call(method, *args).result()

    def wait(self, future, method):
        return future.result(timeout=30)

    def start_generate(self, prompts, params):
        return self.start_call("generate", prompts, params)

    def start_sync(self, actor, dtype, version):
        return self.start_call("update_weights", version)


def prompts_drawn():
    drawn = iter(range(100))

    def draw():
        rows = [next(drawn) for _ in range(PROMPTS_PER_STEP)]
        return rows, [[1 + row % 7, 2 + row % 3] for row in rows]

    return draw


def train(schedule, client, trainer_pause=None) -> list[tuple[list[int], Completions]]:
    """PPOPipeline.step's calls on the schedule, STEPS times (`trainer_pause`: () -> seconds each step
    trains); the batches it trained on."""
    schedule.engine = client
    batches, draw = [], prompts_drawn()
    for step in range(1, STEPS + 1):
        schedule.launch(step, STEPS, draw, PARAMS)
        batches.append(schedule.collect(step))
        if trainer_pause is not None:
            time.sleep(trainer_pause())
        schedule.start_sync(None, "float32", version=step)
    schedule.wait_sync()
    return batches


def fully_async(max_staleness, on_update="continue", segment_tokens=2, schedule="deterministic"):
    return FullyAsyncSchedule(
        RolloutConfig(
            fully_async=True,
            max_staleness=max_staleness,
            on_update=on_update,
            segment_tokens=segment_tokens,
            max_new_tokens=PARAMS.max_new_tokens,
            schedule=schedule,
        )
    )


def assert_within_the_bound(batches, max_staleness) -> int:
    """Every prompt, in order; each sample's tokens no older than the bound. Returns the samples whose
    tokens span several weight versions."""
    assert [rows for rows, _ in batches] == [[2 * s, 2 * s + 1] for s in range(STEPS)]
    mixed = 0
    for step, (_, completions) in enumerate(batches, start=1):
        for versions in completions.token_versions:
            assert versions == sorted(versions) and versions
            assert step - 1 - versions[0] <= max_staleness  # the oldest token, per sample
            assert versions[0] >= admission_version(step, max_staleness)
            assert versions[-1] <= step - 1  # nothing from the future
            mixed += len(set(versions)) > 1
    return mixed


@pytest.mark.parametrize("on_update", ["continue", "drop"])
@pytest.mark.parametrize("max_staleness", [0, 1, 2, 3])
@pytest.mark.parametrize("segment_tokens", [1, 2, 6])
def test_no_token_of_any_sample_is_more_than_max_staleness_versions_behind(max_staleness, on_update, segment_tokens):
    batches = train(fully_async(max_staleness, on_update, segment_tokens), InlineClient(VersionedWorker()))
    mixed = assert_within_the_bound(batches, max_staleness)
    if max_staleness == 0:
        assert mixed == 0
    elif on_update == "continue" and segment_tokens < PARAMS.max_new_tokens:
        assert mixed > 0  # partial rollouts did go on across weight updates


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_timing_decides_nothing(max_staleness):
    inline = train(fully_async(max_staleness), InlineClient(VersionedWorker()))
    for seed in range(3):
        engine, trainer = random.Random(seed + 100), random.Random(seed)
        threaded = InlineClient(VersionedWorker(pause=lambda: engine.uniform(0, 0.004)), threaded=True)
        assert train(fully_async(max_staleness), threaded, lambda: trainer.uniform(0, 0.004)) == inline, seed


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_finish_makes_the_engine_calls_of_async_steps_and_zero_staleness_those_of_lockstep(max_staleness):
    async_steps = VersionedWorker()
    train(RolloutSchedule(max_staleness), InlineClient(async_steps))
    for on_update in ("finish",) + (("continue", "drop") if max_staleness == 0 else ()):
        fully = VersionedWorker()
        batches = train(fully_async(max_staleness, on_update), InlineClient(fully))
        assert fully.generated == async_steps.generated, on_update
        assert all(c.token_ids and c.weight_version == max(0, s - max_staleness) for s, (_, c) in enumerate(batches))


@pytest.mark.parametrize("trainer_s, engine_s", [(0.0, 0.004), (0.004, 0.0), (0.002, 0.002)])
@pytest.mark.parametrize("max_staleness", [1, 3])
def test_greedy_keeps_the_bound_whether_the_engine_is_much_faster_or_much_slower_than_the_trainer(
    max_staleness, trainer_s, engine_s
):
    for seed in range(2):
        engine, trainer = random.Random(seed), random.Random(seed + 10)
        worker = VersionedWorker(pause=lambda: engine.uniform(0, engine_s))
        schedule = fully_async(max_staleness, segment_tokens=1, schedule="greedy")
        batches = train(schedule, InlineClient(worker, threaded=True), lambda: trainer.uniform(0, trainer_s))
        assert_within_the_bound(batches, max_staleness)


def test_greedy_with_a_slow_trainer_generates_the_later_batches_whole_before_the_update():
    """A step that trains 50 ms against an engine that answers at once: each later cohort ends while
    the step trains, so every token of it comes from its admission's weights."""
    schedule = fully_async(1, segment_tokens=1, schedule="greedy")
    batches = train(schedule, InlineClient(VersionedWorker(), threaded=True), lambda: 0.05)
    for step, (_, completions) in enumerate(batches, start=1):
        assert {v for row in completions.token_versions for v in row} == {max(0, step - 2)}, step


def test_a_step_does_not_wait_for_the_advances_of_later_batches():
    """The advances queued after step 1's batch run while step 1 trains: collect returns first."""
    release, worker = threading.Event(), VersionedWorker()
    advance = worker.advance
    worker.advance = lambda cohort, max_tokens: release.wait(10) and advance(cohort, max_tokens)
    schedule = fully_async(1)
    schedule.engine = InlineClient(worker, threaded=True)
    schedule.launch(1, STEPS, prompts_drawn(), PARAMS)
    start = time.monotonic()
    rows, _ = schedule.collect(1)
    assert rows == [0, 1] and time.monotonic() - start < 5 and not release.is_set()
    release.set()
    schedule.start_sync(None, "float32", version=1)
    schedule.wait_sync()
    assert worker.partial.cohorts[2].rows[0].tokens  # cohort 2 advanced before the update
