"""`ray start ARGS`, less what a test's node does not use (tests/raylets.py ray_start):

    RAY_START_HOOK=__main__.lean python tests/lean_ray_start.py start ARGS

Ray's own `ray start`, with its hook for the node's parameters (RAY_START_HOOK, called before the node
starts): no Ray Client server on a head (no client connects with ray://; ~1.5 s of CPU to start, ~1 a
minute after), of the dashboard's modules only those of the job API and of the nodes' states (the others
took ~0.2-0.4 s of CPU each), and, but on a head that runs jobs (`lean_with_agent`), the dashboard agent's
stand-in (workers/lean_cluster.py; the agent took ~1.5 s of CPU to start and ~1 a minute after: a job's
driver and its agent are the head's). `with_forked_workers` also has the raylet start its Python workers
through $ROLL_TEST_SETUP_WORKER (tests/host_launcher.py)."""

import os
import sys

del sys.path[0]  # this folder: its modules are the tests', and none of them is Ray's

import ray._private.ray_constants as ray_constants  # noqa: E402
import ray._private.services as services  # noqa: E402
from ray.scripts.scripts import main  # noqa: E402

DASHBOARD_MODULES = "JobHead,NodeHead"  # the job API (and /api/version), the nodes' states


def lean(ray_params, head: bool, agent: bool = False) -> None:
    del os.environ["RAY_START_HOOK"]  # the node's processes need it not
    ray_params.ray_client_server_port = None
    from roll_lite.workers.lean_cluster import _stand_in

    start_ray_process = services.start_ray_process

    def leaner(command, process_type, **kwargs):
        if process_type == ray_constants.PROCESS_TYPE_RAYLET and not agent:
            command = [_stand_in(argument, command) for argument in command]
        if process_type == ray_constants.PROCESS_TYPE_DASHBOARD and ray_params.include_dashboard is None:
            command = [*command, "--modules-to-load=" + DASHBOARD_MODULES]
        return start_ray_process(command, process_type, **kwargs)

    services.start_ray_process = leaner


def lean_with_agent(ray_params, head: bool) -> None:
    lean(ray_params, head, agent=True)


def with_forked_workers(ray_params, head: bool) -> None:
    ray_params.setup_worker_path = os.environ.pop("ROLL_TEST_SETUP_WORKER")
    lean(ray_params, head, agent=head)


if __name__ == "__main__":
    sys.argv[0] = "ray"
    main()
