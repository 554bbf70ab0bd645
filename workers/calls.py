"""Waiting for workers' answers: WorkerCalls gets a call's results with a timeout and a stall warning,
and worker_error turns what Ray raised into a WorkerError naming the role, the rank and what happened
(raised, died, out of memory, stopped), the death of a peer preferred over the error it caused. Under
workers.backend=local the calls have run already (workers/local.py): their values, or the first error."""

from __future__ import annotations

import logging
import time

import torch

from roll_lite.config import WorkersConfig
from roll_lite.runtime.failures import WorkerError
from roll_lite.strategy.non_finite import NonFiniteStepsError

from .local import LocalCallError, is_finished

logger = logging.getLogger("roll_lite")

WAIT_S = 1.0  # ray.wait in short slices: a signal to the driver is handled within this time
DEATH_GRACE_S = 5.0  # after a rank raised: how long its peers may take to be reported dead
# The start of a worker (its process, imports, model build or load) may take long by design: these
# calls wait at least STARTUP_TIMEOUT_S, whatever workers.call_timeout_s says.
STARTUP_CALLS = ("address", "setup", "describe")
STARTUP_TIMEOUT_S = 1800.0


class WorkerCalls:
    """Waiting for the calls to one role's workers (one call per rank, or a single one). The first call
    that fails raises WorkerError naming the role, the rank and the method, with the worker's
    traceback; Ray reports a dead worker process as soon as it is gone. A worker that is alive but
    does not answer (a hang, e.g. in a collective another rank never joined) is named in a warning
    every workers.stall_warning_s, and stops the run after workers.call_timeout_s."""

    def __init__(self, role: str, workers: WorkersConfig):
        self.role, self.timeout_s, self.warn_every_s = role, workers.call_timeout_s, workers.stall_warning_s
        # On a cluster of several nodes, each worker's node address, of every role ("actor rank 1" ->
        # "10.0.0.2"; workers/cluster.py where_the_roles_run): a failure names its node and who else ran there
        self.nodes: dict[str, str] = {}

    def get(self, refs, method: str):
        if is_finished(refs):  # workers.backend=local: the calls have run (workers/local.py)
            return self._finished(refs, method)
        import ray

        single = isinstance(refs, ray.ObjectRef)
        ranks = {ref: (None if single else rank) for rank, ref in enumerate([refs] if single else refs)}
        answered: dict[ray.ObjectRef, float]  # ref -> when it answered
        pending, values, answered = list(ranks), {}, {}
        timeout_s, limit = self.timeout_s, "workers.call_timeout_s"
        if method in STARTUP_CALLS and self.timeout_s < STARTUP_TIMEOUT_S:
            timeout_s, limit = STARTUP_TIMEOUT_S, "the limit for the start of a worker"
        start = time.monotonic()
        warn_at = start + self.warn_every_s
        while pending:
            now = time.monotonic()
            if now - start > timeout_s:
                raise self._on_node(
                    WorkerError(
                        self.role,
                        ranks[pending[0]],
                        method,
                        "timed out",
                        f"no answer from {self._names(ranks, pending)} within {timeout_s:g} s ({limit}): alive but "
                        f"stuck{self._others(ranks, answered, start)}. If its calls are this slow by design, raise "
                        "workers.call_timeout_s",
                    )
                )
            if now >= warn_at:
                logger.warning(
                    "still waiting for %s to answer %s after %.0f s%s; the run stops after %g s (%s)",
                    self._names(ranks, pending),
                    method,
                    now - start,
                    self._others(ranks, answered, start),
                    timeout_s,
                    limit,
                )
                warn_at += self.warn_every_s
            ready, pending = ray.wait(pending, num_returns=1, timeout=WAIT_S)
            for ref in ready:
                answered[ref] = time.monotonic()
                try:
                    values[ref] = ray.get(ref)
                except ray.exceptions.RayError as error:
                    failure = self._root_cause(
                        worker_error(error, self.role, ranks[ref], method), ranks, pending, method
                    )
                    raise self._on_node(failure) from None
        return values[refs] if single else [values[ref] for ref in refs]

    def _finished(self, refs, method: str):
        """The values of local calls (workers/local.py Finished), or the first one's error as WorkerError."""
        single = not isinstance(refs, list)
        for rank, ref in enumerate([refs] if single else refs):
            if ref.error is not None:
                raise worker_error(ref.error, self.role, None if single else rank, method) from None
        return refs.value if single else [ref.value for ref in refs]

    def _on_node(self, failure: WorkerError) -> WorkerError:
        """The failed worker's node, and the workers of every role that ran there too (a node that is
        gone took them all), where the run knows them (a cluster of several nodes)."""
        failure.node = self.nodes.get(failure.worker)
        failure.node_also = [
            worker for worker, node in self.nodes.items() if node == failure.node and worker != failure.worker
        ]
        return failure

    def _root_cause(self, failure: WorkerError, ranks: dict, pending: list, method: str) -> WorkerError:
        """A rank that raised in a collective has often only seen another rank die (gloo: 'Connection
        closed by peer'), and Ray may report that death a moment later: wait briefly for the other ranks
        and name the death, the error to look at, instead."""
        if failure.kind != "raised" or not pending:
            return failure
        import ray

        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=DEATH_GRACE_S)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as error:
                other = worker_error(error, self.role, ranks[ref], method)
                if other.kind in ("died", "out of memory"):
                    return other
        return failure

    def _names(self, ranks: dict, refs: list) -> str:
        if ranks[refs[0]] is None:
            return self.role
        return f"{self.role} rank{'s' if len(refs) > 1 else ''} {', '.join(str(ranks[ref]) for ref in refs)}"

    def _others(self, ranks: dict, answered: dict, start: float) -> str:
        """What the ranks that did answer say about the stuck one: they were done, it was not."""
        if not answered:
            return ""
        first = min(answered.values())
        return f" ({self._names(ranks, list(answered))} answered after {first - start:.1f} s)"


# torch's CPU allocator reports a failed allocation as a plain RuntimeError with this text.
CPU_ALLOCATION_FAILED = "DefaultCPUAllocator: can't allocate memory"


def worker_error(error: Exception, role: str, rank: int | None, method: str) -> WorkerError:
    """What Ray raised for a call (or workers/local.py's LocalCallError for a local one) as WorkerError."""
    cause, text = getattr(error, "cause", None), str(error)
    if isinstance(cause, NonFiniteStepsError):  # a stop on purpose: its reason, no traceback
        return WorkerError(role, rank, method, "stopped", cause.describe(f"{role}."))
    on_ray = not isinstance(error, LocalCallError)
    if on_ray:
        import ray
    if (
        (on_ray and isinstance(error, ray.exceptions.OutOfMemoryError))
        or isinstance(cause, (torch.OutOfMemoryError, MemoryError))
        or "memory usage threshold" in text  # Ray's memory monitor killed it (its message on an actor's death)
        or CPU_ALLOCATION_FAILED in text
    ):
        kind = "out of memory"
    elif getattr(error, "actor_init_failed", False):  # raised in its constructor; Ray reports the actor dead
        kind, method = "raised", "__init__"
    elif on_ray and isinstance(error, ray.exceptions.RayActorError):
        kind = "died"
    else:
        kind = "raised"
    return WorkerError(role, rank, method, kind, text)
