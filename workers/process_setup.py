"""Runs first in every Ray worker process of a run (Ray's runtime_env `worker_process_setup_hook`).

Before a worker process runs its first task, Ray puts the driver's working directory at the front of
its sys.path. If that directory holds another roll_lite checkout, every roll_lite module the worker
had not imported yet would come from there, next to roll_lite.workers from the installed tree.
Ray imports this module before that happens, and importing it imports roll_lite: the worker stays
on the installed tree, the one the driver runs, for the rest of its life. A local cluster gets the
hook only when such a directory exists (workers/cluster.py shadowing_directories): a runtime_env
makes every worker slower to start.
"""

HOOK = "roll_lite.workers.process_setup.bind_roll_lite"


def bind_roll_lite() -> None:
    """Nothing left to do: importing roll_lite.workers (to get here) imported roll_lite."""
