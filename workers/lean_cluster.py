"""What a local Ray cluster (one node, this run's alone: workers/cluster.py start_ray) is spared of what
ray.init starts, and the stand-in for the dashboard agent. docs/gpus-and-clusters.md lists what it starts.

A run reads nothing from Ray's dashboard: no state API, no job API, no metrics. ray.init still starts
- the dashboard's API server, with include_dashboard=False too (~0.8 s of CPU, and ray.init waits for it):
  it then loads only the usage-stats module, and ray.init turns usage stats off. Where it fails to start,
  Ray goes on without it (node.py start_head_processes); a run's node does not try;
- the dashboard agent (~0.9 s of CPU: its modules report metrics, events and logs to the API server,
  and run `ray job submit`'s jobs, which go to a cluster started with `ray start`). The raylet will not
  start without an agent: it waits for the agent's ports, and exits when the agent does. The stand-in
  (this file, stdlib only) gives the raylet what Ray's own agent gives it where Ray is installed without
  its dashboard (`pip install ray`, no [default]): no ports (-1, "not in use"). Then it waits, and ends
  with its raylet;
- the autoscaler's monitor (~0.5 s of CPU, then a poll every second, and ray.shutdown waited a second
  for it: it sleeps through its SIGTERM), for a cluster of one node that has none to add.
What stays: the GCS, the raylet, the runtime-env agent (the raylet exits without one, and starts each
worker of a job that has a runtime_env through it) and the log monitor (it sends what the workers print,
their warnings and tracebacks too, to the driver's log, with the `(ModelWorker pid=...)` prefix).

Ray is pinned in pyproject.toml; tests/test_pipeline_ray.py checks that what is spared stays out, so a
Ray that starts its processes otherwise fails there (and a raylet that waits for files the stand-in does
not write fails to start).

This file is also the stand-in's script: `python -I -S lean_cluster.py SESSION_DIR`, stdlib only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# ray.init takes `_system_config` only when it starts the cluster: a joined cluster is the user's as it was.
LOCAL_SYSTEM_CONFIG = {
    # Ray starts idle workers when the first driver connects, for tasks to come. A run's workers are
    # actors, made a few at a time: each now starts its own process then, and no idle one is left
    # over (~0.5 s of CPU each, and on a many-core node several).
    "prestart_worker_first_driver": False,
    # Ray's own metrics (every worker exports them, the dashboard agent collects them): read only through
    # the dashboard or Prometheus, neither of which a run's cluster has; the run logs its own.
    "enable_metrics_collection": False,
}
# The ports Ray's dashboard agent writes for its raylet (ray/dashboard/agent.py, persist_port): a file
# <name>_<node id> in the session directory, -1 where the service is not there.
AGENT_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port")


@contextmanager
def lean_local_cluster() -> Iterator[None]:
    """For the ray.init call that starts the local cluster: a Node without the API server and the monitor
    (RayParams.no_monitor, the switch of `ray start --no-monitor` for a head whose autoscaler runs elsewhere,
    as under KubeRay; ray.init does not pass it on), and a raylet whose dashboard agent is the stand-in."""
    import ray._private.node
    import ray._private.ray_constants
    import ray._private.services

    make_node, start_ray_process = ray._private.node.Node, ray._private.services.start_ray_process

    class LeanNode(ray._private.node.Node):
        def __init__(self, *args: Any, ray_params: Any, **kwargs: Any) -> None:
            ray_params.no_monitor = True
            super().__init__(*args, ray_params=ray_params, **kwargs)

        def start_api_server(self, **_: Any) -> None:
            pass

    def with_stand_in(command: list[str], process_type: str, **kwargs: Any) -> Any:
        if process_type == ray._private.ray_constants.PROCESS_TYPE_RAYLET:
            command = [_stand_in(argument, command) for argument in command]
        return start_ray_process(command, process_type, **kwargs)

    ray._private.node.Node, ray._private.services.start_ray_process = LeanNode, with_stand_in
    try:
        yield
    finally:
        ray._private.node.Node, ray._private.services.start_ray_process = make_node, start_ray_process


def _stand_in(argument: str, raylet: list[str]) -> str:
    """The raylet's `argument`, with the stand-in's command for the dashboard agent's."""
    if not argument.startswith("--dashboard_agent_command="):
        return argument
    session_dir = next(a.split("=", 1)[1] for a in raylet if a.startswith("--session_dir="))
    stand_in = [sys.executable, "-I", "-S", os.path.abspath(__file__), session_dir]
    return "--dashboard_agent_command=" + subprocess.list2cmdline(stand_in)  # as Ray writes the agent's


def main(session_dir: str) -> None:
    """The stand-in: no ports, then wait until the raylet (this process's parent) is gone, or stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the raylet decides
    node, raylet = os.environ["RAY_NODE_ID"], int(os.environ["RAY_RAYLET_PID"])
    for name in AGENT_PORTS:
        path = os.path.join(session_dir, f"{name}_{node}")
        with open(path + ".part", "w") as f:
            f.write("-1")
        os.replace(path + ".part", path)  # whole, for a raylet that reads it as soon as it is there
    while os.getppid() == raylet:
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1])  # the raylet appends options of its own (--disable-metrics-collection)
