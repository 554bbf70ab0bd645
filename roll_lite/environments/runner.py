"""Running the environments of many trajectories at once, each call bounded in time, so that a fault
costs one trajectory, never the run.

    with EnvironmentRunner("guess_the_number", {"hi": 50}, max_concurrent=4, step_timeout_s=5) as runner:
        first = runner.reset_many([(i, seed + i, row) for i, row in enumerate(rows)])
        results = runner.step_many([(i, reply) for i, reply in replies.items()])  # every running trajectory

The environments live in `max_concurrent` processes (child.py), each hosting its share; a process
serves one call at a time, the processes run in parallel, and the caller's thread only waits (or,
with submit_step / submit_reset and the futures they return, goes on generating and collects each
result as it comes). Every call has `step_timeout_s` from when its process starts it. A trajectory
stays in the process its reset put it in (the one hosting the fewest running trajectories then).

A call that raises or returns what the contract forbids ends that trajectory ("raised",
"bad_return"). One that hangs or kills its process ("timed_out", "crashed") also takes down the
other environments of that process: it is killed and started again, and each of them is rebuilt
before its next step by replaying its reset and actions on a new instance. When the replay gives the
recorded results the trajectory goes on unaware; when it does not (a non-deterministic environment),
that trajectory ends too, as "lost". The runner keeps working after any of these.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Hashable, Iterable

from roll_lite.environments.process import CallTimedOut, EnvironmentProcess, ProcessDied
from roll_lite.environments.results import Result
from roll_lite.rewards.calls import describe

logger = logging.getLogger(__name__)


@dataclass
class _Record:
    """The parent's account of one trajectory's environment: where it lives and what it did."""

    process: int
    seed: int | None
    fields: dict
    state: str = "starting"  # starting -> running -> done
    busy: bool = True  # a call is queued or in flight
    generation: int = 0  # of its process, when its instance was built there
    actions: list = field(default_factory=list)
    recorded: list = field(
        default_factory=list
    )  # reset's observation, then (observation, reward, terminated, truncated)


@dataclass
class _Call:
    kind: str  # reset | step | release
    env_id: Hashable
    record: _Record
    action: str | None = None
    future: Future | None = None


class EnvironmentRunner:
    def __init__(self, name: str, kwargs: dict | None = None, *, max_concurrent: int = 4, step_timeout_s: float = 10.0):
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be a whole number >= 1, got {max_concurrent!r}")
        self.name, self.step_timeout_s = name, step_timeout_s
        self.processes = [EnvironmentProcess(name, dict(kwargs or {})) for _ in range(max_concurrent)]
        try:
            for process in self.processes:
                process.launch()
            for process in self.processes:
                process.wait_ready()
        except BaseException:
            for process in self.processes:
                process.close()
            raise
        self.reset_fields = self.processes[0].reset_fields
        self.stats: Counter = Counter()  # calls, seconds, restarts, replays, faults/<reason>
        self._records: dict[Hashable, _Record] = {}
        self._hosted = [0] * max_concurrent  # trajectories not done, per process
        self._lock = threading.Lock()
        self._warned_fields: set[str] = set()
        self._queues: list[queue.SimpleQueue[_Call | None]] = [queue.SimpleQueue() for _ in self.processes]
        self._threads = [
            threading.Thread(target=self._serve_forever, args=(index,), daemon=True, name=f"environment-{index}")
            for index in range(max_concurrent)
        ]
        for thread in self._threads:
            thread.start()

    @classmethod
    def from_config(cls, config) -> "EnvironmentRunner":
        """From an EnvironmentConfig (config.py)."""
        return cls(
            config.name, dict(config.kwargs), max_concurrent=config.max_concurrent, step_timeout_s=config.step_timeout_s
        )

    # -- the caller's side --------------------------------------------------------------------

    def submit_reset(self, env_id: Hashable, seed: int | None = None, fields: dict | None = None) -> Future:
        """Start a trajectory: a new episode of an environment (an instance is built or reused)."""
        with self._lock:
            record = self._records.get(env_id)
            if record is not None and record.state != "done":
                raise ValueError(f"environment {env_id!r} is still running; release it before resetting it")
            record = self._records[env_id] = _Record(self._least_busy(), seed, self._passed_fields(fields or {}))
        return self._submit(_Call("reset", env_id, record))

    def submit_step(self, env_id: Hashable, action: str) -> Future:
        if not isinstance(action, str):
            raise TypeError(f"an action is a str, got a {type(action).__name__}")
        with self._lock:
            record = self._records.get(env_id)
            if record is None or record.state != "running":
                raise ValueError(f"environment {env_id!r} is not running ({record.state if record else 'never reset'})")
            if record.busy:
                raise ValueError(f"environment {env_id!r} has a call in flight; collect its result first")
            record.busy = True
        return self._submit(_Call("step", env_id, record, action))

    def reset_many(self, items: Iterable[tuple[Hashable, int | None, dict | None]]) -> list[Result]:
        """(env_id, seed, row fields) each; the results in the same order."""
        futures = [self.submit_reset(env_id, seed, fields) for env_id, seed, fields in items]
        return [future.result() for future in futures]

    def step_many(self, items: Iterable[tuple[Hashable, str]]) -> list[Result]:
        """(env_id, action) each, all at once; the results in the same order."""
        futures = [self.submit_step(env_id, action) for env_id, action in items]
        return [future.result() for future in futures]

    def release(self, env_id: Hashable) -> None:
        """End a running trajectory from the caller's side (its turn or token budget is spent); its
        instance goes back to be reused. Nothing happens for a trajectory already done."""
        with self._lock:
            record = self._records.get(env_id)
            if record is None or record.state == "done":
                return
            if record.busy:
                raise ValueError(f"environment {env_id!r} has a call in flight; collect its result first")
            self._finish(record)
        self._queues[record.process].put(_Call("release", env_id, record))

    def record_of(self, env_id: Hashable) -> dict:
        """What rebuilds a running environment elsewhere (adopt): its seed, row fields, actions and results."""
        with self._lock:
            record = self._records[env_id]
            if record.busy or record.state != "running":
                raise ValueError(f"environment {env_id!r} is {'busy' if record.busy else record.state}, not settled")
            return {
                "seed": record.seed,
                "fields": record.fields,
                "actions": record.actions,
                "recorded": record.recorded,
            }

    def adopt(self, env_id: Hashable, saved: dict) -> None:
        """A running environment from record_of (a checkpoint's): rebuilt by replaying its reset and
        actions before its next step; when the replay differs, that step ends it as "lost"."""
        with self._lock:
            self._records[env_id] = _Record(
                self._least_busy(),
                saved["seed"],
                saved["fields"],
                state="running",
                busy=False,
                generation=-1,  # no process hosts it yet: its next step replays it first
                actions=list(saved["actions"]),
                recorded=list(saved["recorded"]),
            )

    def running(self) -> list[Hashable]:
        with self._lock:
            return [env_id for env_id, record in self._records.items() if record.state == "running"]

    def close(self) -> None:
        for calls in self._queues:
            calls.put(None)
        for thread in self._threads:
            thread.join()
        for process in self.processes:
            process.shutdown()

    def __enter__(self) -> "EnvironmentRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _submit(self, call: _Call) -> Future:
        call.future = Future()
        self._queues[call.record.process].put(call)
        return call.future

    def _passed_fields(self, fields: dict) -> dict:
        if self.reset_fields is None:
            return dict(fields)
        ignored = set(fields) - self.reset_fields
        if ignored - self._warned_fields:
            self._warned_fields |= ignored
            logger.warning(
                f"environment '{self.name}': its reset takes no {', '.join(sorted(ignored))}; "
                "those row fields are not passed"
            )
        return {key: value for key, value in fields.items() if key in self.reset_fields}

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _least_busy(self) -> int:
        """Under the lock: the process hosting the fewest running trajectories, counted as hosting one more."""
        index = min(range(len(self.processes)), key=self._hosted.__getitem__)
        self._hosted[index] += 1
        return index

    def _finish(self, record: _Record) -> None:
        """Under the lock."""
        record.state = "done"
        self._hosted[record.process] -= 1

    # -- the process threads ------------------------------------------------------------------

    def _serve_forever(self, index: int) -> None:
        process, calls = self.processes[index], self._queues[index]
        while (call := calls.get()) is not None:
            if call.kind == "release":
                if call.record.generation == process.generation:
                    process.post(("release", call.env_id))
                continue
            assert call.future is not None  # every call but a release has one
            try:
                result = self._serve(process, call)
            except BaseException as error:  # the runner's own failure (a process that no longer starts)
                with self._lock:
                    call.record.busy = False
                    self._finish(call.record)
                call.future.set_exception(error)
                continue
            with self._lock:
                self.stats["calls"] += 1
                # typeshed's Counter holds ints; Python's sums any number, as these seconds
                self.stats["seconds"] += result.seconds  # type: ignore[assignment]
                if result.fault is not None:
                    self.stats[f"faults/{result.fault}"] += 1
                record = call.record
                record.busy = False
                if result.done:
                    self._finish(record)
                else:
                    record.state = "running"
            call.future.set_result(result)

    def _serve(self, process: EnvironmentProcess, call: _Call) -> Result:
        record = call.record
        if not process.is_alive():  # died between calls (or a restart failed): rebuilt as after a restart
            self._restart(process, "its environment process is not running")
        if call.kind == "reset":
            result = self._call(process, call.env_id, ("reset", call.env_id, record.seed, record.fields))
            if result.fault is None:
                record.generation = process.generation
                record.recorded = [result.observation]
            return result
        if record.generation != process.generation:
            lost = self._replay(process, call.env_id, record)
            if lost is not None:
                return Result(call.env_id, fault="lost", error=lost)
        result = self._call(process, call.env_id, ("step", call.env_id, call.action))
        if result.fault is None:
            record.actions.append(call.action)
            record.recorded.append((result.observation, result.reward, result.terminated, result.truncated))
        return result

    def _call(self, process: EnvironmentProcess, env_id: Hashable, message: tuple) -> Result:
        try:
            status, payload, seconds = process.call(message, self.step_timeout_s)
        except CallTimedOut:
            self._restart(process, f"environment {env_id!r} timed out")
            return Result(
                env_id,
                fault="timed_out",
                error=f"no result within step_timeout_s={self.step_timeout_s:g} s",
                seconds=self.step_timeout_s,
            )
        except ProcessDied as death:
            self._restart(process, f"environment {env_id!r} crashed it")
            return Result(env_id, fault="crashed", error=str(death))
        except Exception as error:  # the reply did not unpickle here
            process.post(("release", env_id))
            return Result(env_id, fault="bad_return", error=f"its return does not unpickle here: {describe(error)}")
        if status != "ok":
            return Result(env_id, fault=status, error=payload, seconds=seconds)
        if message[0] == "reset":
            observation, info = payload
            return Result(env_id, observation, info=info, seconds=seconds)
        observation, reward, terminated, truncated, info = payload
        return Result(env_id, observation, reward, terminated, truncated, info, seconds=seconds)

    def _replay(self, process: EnvironmentProcess, env_id: Hashable, record: _Record) -> str | None:
        """Rebuild `env_id` in its restarted process; the reason it is lost, or None."""
        self._count("replays")
        timeout_s = self.step_timeout_s * (1 + len(record.actions))
        message = ("replay", env_id, record.seed, record.fields, record.actions, record.recorded)
        try:
            status, problem, _ = process.call(message, timeout_s)
        except (CallTimedOut, ProcessDied) as error:
            self._restart(process, f"replaying environment {env_id!r} failed")
            return (
                f"its process was restarted for another environment's fault; replaying it then failed: "
                f"{'timed out' if isinstance(error, CallTimedOut) else error}"
            )
        if status != "ok":
            return f"its process was restarted for another environment's fault; {problem}"
        record.generation = process.generation
        return None

    def _restart(self, process: EnvironmentProcess, why: str) -> None:
        self._count("restarts")
        logger.warning(
            f"environment '{self.name}': {why}; restarting its process (its other environments are "
            "replayed before their next step)"
        )
        process.restart()
