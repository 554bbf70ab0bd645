"""WorkerError from the errors Ray raises in the driver (no cluster needed: the exceptions are built
as Ray builds them). tests/test_failures.py sees them through real runs."""

import ray
import torch
from roll_lite.workers.calls import WorkerCalls, worker_error
from roll_lite.workers.cluster import node_names

from roll_lite.config import WorkersConfig
from roll_lite.runtime.failures import WorkerError


def task_error(cause: Exception, as_cause: bool = True) -> Exception:
    """What ray.get raises for an exception in an actor method: a RayTaskError that is also an
    instance of the cause's class."""
    traceback = (
        f'Traceback (most recent call last):\n  File "loss.py", line 3, in loss_func\n{type(cause).__name__}: {cause}'
    )
    error = ray.exceptions.RayTaskError("train_step", traceback, cause)
    return error.as_instanceof_cause() if as_cause else error


def test_an_exception_in_a_worker_names_role_rank_method_and_step_and_keeps_the_traceback():
    error = worker_error(task_error(ValueError("bad batch")), "actor", 1, "train_step")
    assert isinstance(error, WorkerError) and error.kind == "raised"
    error.stage = "step 7"
    assert error.headline() == "actor rank 1 raised an error in train_step at step 7"
    assert 'File "loss.py", line 3, in loss_func' in str(error) and "ValueError: bad batch" in str(error)


def test_out_of_memory_from_torch_python_or_ray_names_the_keys_to_lower():
    try:  # a real failed allocation on CPU: torch raises a plain RuntimeError
        torch.empty(10**14, dtype=torch.uint8)
    except RuntimeError as cpu_allocation_failure:
        cpu_oom = task_error(cpu_allocation_failure)
    errors = [
        task_error(torch.OutOfMemoryError("CUDA out of memory")),
        task_error(MemoryError()),
        cpu_oom,
        ray.exceptions.OutOfMemoryError(
            "Memory on the node was 23 GB / 24 GB, which exceeds the memory usage "
            "threshold of 0.95. Ray killed this worker"
        ),
    ]
    for raised in errors:
        error = worker_error(raised, "critic", 0, "train_step")
        assert error.kind == "out of memory", raised
        assert error.headline().startswith(
            "critic rank 0 ran out of memory in train_step: lower rollout.prompts_per_step, "
            "rollout.num_samples, rollout.max_new_tokens; use smaller micro-batches: "
            "raise critic.grad_accum_steps, or with critic.use_packing=true lower "
            "critic.max_tokens_per_micro_batch; or set model.gradient_checkpointing=true"
        )
    rollout = worker_error(task_error(torch.OutOfMemoryError("CUDA out of memory")), "rollout", None, "generate")
    assert rollout.headline() == (
        "rollout ran out of memory in generate: lower rollout.prompts_per_step, "
        "rollout.num_samples, rollout.max_new_tokens"
    )


def test_a_dead_worker_and_one_that_failed_to_start():
    died = worker_error(ray.exceptions.ActorDiedError(), "actor", 0, "state_dict")
    assert died.kind == "died" and died.headline() == "actor rank 0 died during state_dict"
    not_started = worker_error(
        ray.exceptions.ActorDiedError(task_error(ImportError("no module x"), as_cause=False)),
        "rollout",
        None,
        "describe",
    )
    assert not_started.headline() == "rollout raised an error in __init__"
    assert "ImportError: no module x" in str(not_started)


def test_on_a_cluster_of_several_nodes_a_failure_names_its_node_and_what_else_ran_there():
    # What workers/cluster.py where_the_roles_run tells every role's calls; tests/test_several_hosts.py
    # sees it when a host is killed.
    calls = WorkerCalls("actor", WorkersConfig())
    calls.nodes = {
        "actor rank 0": "10.0.0.1",
        "actor rank 1": "10.0.0.2",
        "reference rank 1": "10.0.0.2",
        "rollout": "10.0.0.2",
    }
    died = calls._on_node(worker_error(ray.exceptions.ActorDiedError(), "actor", 1, "train_step"))
    died.stage = "step 2"
    assert died.headline() == (
        "actor rank 1 died during train_step at step 2 on node 10.0.0.2 (which also held: reference rank 1, rollout)"
    )
    alone = calls._on_node(worker_error(task_error(ValueError("bad batch")), "actor", 0, "train_step"))
    assert alone.headline() == "actor rank 0 raised an error in train_step on node 10.0.0.1"
    one_node = WorkerCalls("actor", WorkersConfig())._on_node(
        worker_error(ray.exceptions.ActorDiedError(), "actor", 1, "x")
    )
    assert one_node.headline() == "actor rank 1 died during x"  # one node: where_the_roles_run tells nothing


def test_nodes_that_share_an_address_are_named_by_their_ids_too():
    # Several raylets on one machine (tests/test_several_hosts.py without network namespaces): the
    # failure of one names that node, and what else ran there, not what ran on its neighbours.
    names = node_names([("aaaaaaaa11", "10.0.0.1"), ("bbbbbbbb22", "10.0.0.2"), ("cccccccc33", "10.0.0.2")])
    assert names == {
        "aaaaaaaa11": "10.0.0.1",
        "bbbbbbbb22": "10.0.0.2 (node bbbbbbbb)",
        "cccccccc33": "10.0.0.2 (node cccccccc)",
    }
    calls = WorkerCalls("actor", WorkersConfig())
    calls.nodes = {
        "actor rank 0": names["bbbbbbbb22"],
        "actor rank 1": names["cccccccc33"],
        "rollout": names["cccccccc33"],
    }
    died = calls._on_node(worker_error(ray.exceptions.ActorDiedError(), "actor", 0, "train_step"))
    assert died.headline() == "actor rank 0 died during train_step on node 10.0.0.2 (node bbbbbbbb)"


PEER_DIED = """
import os, time
import ray
from roll_lite.config import WorkersConfig
from roll_lite.config import WorkersConfig
from roll_lite.runtime.failures import WorkerError
from roll_lite.workers.calls import WorkerCalls

@ray.remote(num_cpus=0)
class Rank:
    def call(self, how):
        if how == "raise":
            raise RuntimeError("Connection closed by peer")
        time.sleep(0.5)
        if how == "die":
            os._exit(1)
        return 1

def failure(first, second):
    try:
        WorkerCalls("actor", WorkersConfig()).get([first, second], "train_step")
    except WorkerError as error:
        return error.kind, error.rank

ray.init(address="local", num_cpus=1, include_dashboard=False, object_store_memory=80 * 1024**2)
ranks = [Rank.remote() for _ in range(3)]
ray.get([rank.__ray_ready__.remote() for rank in ranks])
# one write each: Ray's log thread prints to the same stdout, and print("RESULT", x) writes its pieces
# one by one, so the raylet's message landed between "RESULT" and the result (CI run 26)
print(f"RESULT {failure(ranks[0].call.remote('raise'), ranks[1].call.remote('die'))}", flush=True)
print(f"RESULT {failure(ranks[0].call.remote('raise'), ranks[2].call.remote('answer'))}", flush=True)
ray.shutdown()
"""


def test_a_rank_that_raised_because_its_peer_died_is_reported_as_the_peers_death():
    """Rank 0 raises at once (as gloo does when its peer's connection closes); rank 1 dies a moment later
    and Ray reports it after rank 0's error: the failure names rank 1's death, the cause. A plain error
    with a live peer stays rank 0's own. In a process of its own: a fresh local cluster."""
    import os
    import re
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", PEER_DIED],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    # Ray's raylet prints to the same stdout, at times without a newline before ours: find them anywhere.
    results = re.findall(r"RESULT \('[a-z ]+', \d\)", result.stdout)
    assert results == ["RESULT ('died', 1)", "RESULT ('raised', 0)"], result.stdout + result.stderr[-3000:]
