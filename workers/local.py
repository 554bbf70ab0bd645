"""workers.backend=local: every worker an object in the driver's process, no Ray.

The controller's code (workers/group.py, pipelines/) is the same under both backends: a worker is
called as a Ray actor is, `worker.method.remote(*args)`, and WorkerCalls (workers/calls.py) waits
for the handle it returns. Here `.remote` runs the call at once and returns a `Finished` handle,
holding the value or the exception. The calls run in the order they are made, as a Ray actor runs a
caller's calls, so a generation queued before a weight update samples with the weights before it.

Each LocalActor keeps what a process of its own would keep apart from the driver's: the random
generators (Python's, NumPy's, torch's; they start as a fresh process's do) and torch's thread
count, swapped in for each of its calls and out after it. Arguments and answers are copied, as Ray's
serialisation copies them, except the weights on the wire (FlatWeights), which no one writes into.
The model workers share one torch.distributed group of one process, made by the first of them and
destroyed by stop_local() (a caller's own group of one process is used instead, and left to it), which
also closes the workers (the reward worker's child processes).

What a process of its own gave and this does not: a call that hangs hangs the run (no
workers.call_timeout_s), and a worker that kills its process (a crash in native code, the OOM killer)
takes the run with it (docs/gpus-and-clusters.md, "One process, no Ray").
"""

from __future__ import annotations

import copy
import logging
import random
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch

from roll_lite.checkpoint.rng import capture_rng, restore_rng
from roll_lite.config import ConfigError, RunConfig
from roll_lite.model.weights import FlatWeights
from roll_lite.runtime.signals import restore_signals, stop_on_signals
from roll_lite.strategy.distributed import close_one_process_group, process_group

logger = logging.getLogger("roll_lite")


def is_local(config: RunConfig) -> bool:
    return config.workers.backend == "local"


def start_worker(config: RunConfig, cls: type, options: Callable[[], dict], *args: Any) -> Any:
    """A worker of class `cls` built with `args`: a Ray actor placed by `options()` (workers/placement.py),
    or with workers.backend=local a LocalActor in this process."""
    if is_local(config):
        return LocalActor(cls, *args)
    import ray

    return ray.remote(cls).options(**options()).remote(*args)


class LocalCallError(Exception):
    """What a local worker's call raised, as Ray reports a remote one: `cause` the exception, str() its
    traceback; `actor_init_failed` when it was the worker's constructor (workers/calls.py worker_error)."""

    def __init__(self, cause: Exception, actor_init_failed: bool = False):
        self.cause, self.actor_init_failed = cause, actor_init_failed
        super().__init__("".join(traceback.format_exception(cause)).rstrip())


@dataclass
class Finished:
    """A call that has run: its value, or the error it raised."""

    value: Any = None
    error: LocalCallError | None = None


def is_finished(refs: Any) -> bool:
    """Whether `refs` (one handle, or one per rank) are local calls' (else Ray's object refs)."""
    return isinstance(refs, Finished) or (isinstance(refs, list) and any(isinstance(ref, Finished) for ref in refs))


def by_value(value: Any) -> Any:
    """A copy, as a call's argument or answer crosses to or from a Ray worker; the weights as they are."""
    return value if isinstance(value, FlatWeights) else copy.deepcopy(value)


def arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return tuple(by_value(arg) for arg in args), {name: by_value(arg) for name, arg in kwargs.items()}


class ProcessState:
    """What a worker in a process of its own would not share with the driver: the random generators and
    torch's thread count."""

    def __init__(self) -> None:
        # a fresh process's: torch's default seed, Python's and NumPy's from the OS's entropy
        self.rng = {
            "python": random.Random().getstate(),
            "numpy": np.random.RandomState().get_state(),
            "torch": torch.Generator().get_state(),
        }
        self.threads = torch.get_num_threads()

    @contextmanager
    def entered(self) -> Iterator[None]:
        theirs, their_threads = capture_rng(), torch.get_num_threads()
        restore_rng(self.rng)
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            self.rng, self.threads = capture_rng(), torch.get_num_threads()
            restore_rng(theirs)
            torch.set_num_threads(their_threads)


_started: list[LocalActor] = []  # this run's, closed by stop_local()
_made_group = [False]  # whether this run made the process group (a caller's group of one is used, and kept)


class LocalActor:
    """An object of `cls` in this process, called as a Ray actor: `actor.method.remote(*args)`. A
    constructor that raises is reported at the first call, as Ray reports it. (Its own attributes start
    with `_`: every other name is a method of the object.)"""

    def __init__(self, cls: type, *args: Any):
        self._name, self._state = cls.__name__, ProcessState()
        self._instance: Any = None
        self._init_error: LocalCallError | None = None
        try:
            with self._state.entered():
                self._instance = cls(*arguments(args, {})[0])
        except Exception as error:  # KeyboardInterrupt (a stop on a signal) goes on up
            self._init_error = LocalCallError(error, actor_init_failed=True)
        _started.append(self)

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self, method)

    def _call(self, method: str, args: tuple, kwargs: dict) -> Finished:
        if self._init_error is not None:
            return Finished(error=self._init_error)
        if self._instance is None:
            return Finished(error=LocalCallError(RuntimeError(f"{self._name}: the run's workers were stopped")))
        args, kwargs = arguments(args, kwargs)
        try:
            with self._state.entered():
                value = getattr(self._instance, method)(*args, **kwargs)
        except Exception as error:
            return Finished(error=LocalCallError(error))
        return Finished(by_value(value))

    def _close(self) -> None:
        """The end of the run, as the end of a worker's process: its close() (child processes, threads), if any."""
        instance, self._instance = self._instance, None
        if instance is not None and callable(getattr(instance, "close", None)):
            with self._state.entered():
                instance.close()


class _Method:
    def __init__(self, actor: LocalActor, name: str):
        self.actor, self.name = actor, name

    def remote(self, *args: Any, **kwargs: Any) -> Finished:
        return self.actor._call(self.name, args, kwargs)


def start_local() -> str:
    """Instead of start_ray: nothing to start; the stop signals handled as on Ray (roll_lite/runtime/signals.py).
    The model workers train in a torch.distributed group of this one process on the CPU: a group the
    calling process already has is used if it is one (a test's, a notebook's), else refused."""
    existing = process_group()
    if existing is not None and (existing[0] != 1 or "gloo" not in existing[1]):
        raise ConfigError(
            f"workers.backend: local trains in a torch.distributed group of this one process (gloo), but this "
            f"process already has a group of {existing[0]} process(es) ({existing[1]}); run it in a process "
            "without one, or set workers.backend=ray"
        )
    _made_group[0] = existing is None
    stop_on_signals()
    return "workers.backend=local: every worker in this process, no Ray"


def stop_local() -> None:
    """Instead of stop_ray: close the workers, destroy the process group the run made, put back the signal
    handlers."""
    try:
        while _started:
            actor = _started.pop()
            try:
                actor._close()
            except Exception as error:  # the others still close
                logger.warning("%s: its close() raised %s", actor._name, error)
        if _made_group[0]:
            close_one_process_group()
            _made_group[0] = False
    finally:
        restore_signals()
