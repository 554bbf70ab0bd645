"""tests/warm_workers.py's launcher, for the workers of a joined cluster (tests/ray_hosts.py), whose runtime_env
sets variables: the name of the worker_process_setup_hook (workers/cluster.py) and a job supervisor's RAY_*
ones, which Ray's setup_worker.py would put in the worker's environment (and do nothing else). This puts them
there and takes them out of the runtime_env; warm_workers.py then forks the worker (the hook's variable is read
after the fork: warm_workers.READ_AFTER_THE_FORK), which runs the hook. A runtime_env that sets other variables
starts its worker anew, as Ray does. It imports nothing heavy: it runs once per worker."""

import json
import os
import sys

import warm_workers


def take_the_variables() -> None:
    for i, argument in enumerate(sys.argv):
        name, _, value = argument.partition("=")
        if name == "--serialized-runtime-env-context" and value:
            context = json.loads(value)
            env_vars = context.get("env_vars") or {}
            only_ours = all(key == warm_workers.SETUP_HOOK_VARIABLE or key.startswith("RAY_") for key in env_vars)
            if only_ours and "$" not in "".join(env_vars.values()):
                os.environ.update(context.pop("env_vars"))
                sys.argv[i] = name + "=" + json.dumps(context)


if __name__ == "__main__":
    take_the_variables()
    warm_workers.launch()
