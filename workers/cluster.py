"""Starting or joining the Ray cluster, and checking that the requested workers fit on it."""

from __future__ import annotations

import logging
import os
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from roll_lite.config import ConfigError
from roll_lite.runtime.importing import roll_lite_dir
from roll_lite.runtime.signals import restore_signals, stop_on_signals

from .lean_cluster import LOCAL_SYSTEM_CONFIG, lean_local_cluster
from .leftovers import stop_watching, watch_local_cluster
from .process_setup import HOOK

if TYPE_CHECKING:
    from .placement import Pin, Reservation

logger = logging.getLogger(__name__)


def start_ray(
    address: str | None, needed: Reservation, object_store_mb: int = 512, env_vars: dict[str, str] | None = None
) -> str:
    """Join `address` (or $RAY_ADDRESS), else start a local cluster; returns a description. `env_vars`
    (roll_lite/runtime/reproducibility.py) reach the workers of a joined cluster through the job's runtime_env;
    a local cluster's workers inherit this process's environment, which already holds them."""
    address = address or os.environ.get("RAY_ADDRESS")
    # Workers import roll_lite before Ray puts the driver's directory first on their sys.path. Locally
    # only where such a directory holds another roll_lite: a runtime_env costs every worker ~1 s to start.
    hook = {"runtime_env": {"worker_process_setup_hook": HOOK}}
    if address:
        joined = {"runtime_env": {**hook["runtime_env"], **({"env_vars": dict(env_vars)} if env_vars else {})}}
        ray.init(address=address, logging_level=logging.WARNING, **joined)
        where = f"joined the Ray cluster at {address}"
    else:
        with lean_local_cluster():  # without what a run does not use (lean_cluster.py)
            ray.init(
                address="local",
                num_cpus=max(os.cpu_count() or 1, 1),
                include_dashboard=False,
                object_store_memory=object_store_mb * 1024**2,
                logging_level=logging.WARNING,
                _system_config=LOCAL_SYSTEM_CONFIG,
                **(hook if shadowing_directories() else {}),
            )
        watch_local_cluster()  # its raylet's agents go with this process, also when it is killed (leftovers.py)
        where = "started a local Ray cluster"
    stop_on_signals()  # after ray.init: it replaces Ray's SIGTERM handler (a stack dump, then abort)
    resources = ray.cluster_resources()
    available, gpus = resources.get("CPU", 0), resources.get("GPU", 0)
    if needed.cpus > available:
        stop_ray()  # and our signal handlers go too: a caller that goes on (a notebook, a test) gets its own back
        raise ConfigError(
            f"workers.actor_cpus: the workers reserve {needed.cpus:g} CPUs ({needed.cpus_from}) but the cluster has "
            f"{available:g}; lower them"
        )
    if needed.gpus > gpus:
        stop_ray()  # and our signal handlers go too: a caller that goes on (a notebook, a test) gets its own back
        raise ConfigError(
            f"workers.gpus_per_rank: the workers need {needed.gpus:g} GPUs ({needed.gpus_from}) "
            f"but the cluster has {gpus:g}; lower workers.actor_dp, or set workers.gpus_per_rank=0 to run on CPU"
        )
    try:
        check_pins(needed.pins, ray.nodes())
    except ConfigError:
        stop_ray()
        raise
    return f"{where} ({available:g} CPUs, {gpus:g} GPUs)"


def check_pins(pins: tuple[Pin, ...], nodes: list[dict]) -> None:
    """Every pinned role (workers.node_labels) has an alive node with all its labels, and those nodes
    have room for what the role reserves of its own (each role counted alone): else a ConfigError that
    names the key and what the cluster's nodes offer. Ray would otherwise wait, without end, for a node
    that will not come. `nodes`: ray.nodes()."""
    alive = [node for node in nodes if node["Alive"]]
    names = node_names([(node["NodeID"], node["NodeManagerAddress"]) for node in alive])

    def with_labels(labels: dict[str, str]) -> list[dict]:
        return [node for node in alive if all(node["Labels"].get(k) == v for k, v in labels.items())]

    for pin in pins:
        if not with_labels(pin.labels):
            offered = ", ".join(f"{names[node['NodeID']]} ({_labels_text(node['Labels'])})" for node in alive)
            raise ConfigError(
                f"workers.node_labels.{pin.role}: no node of the cluster has {_labels_text(pin.labels)}; its "
                f"node{'s' if len(alive) != 1 else ''}: {offered} (a node's labels: `ray start --labels key=value`)"
            )
    for pin in pins:
        found = with_labels(pin.labels)
        if sum(_room(pin.bundle, node["Resources"]) for node in found) < pin.count:
            have = ", ".join(
                f"{names[node['NodeID']]} ({node['Resources'].get('CPU', 0):g} CPUs, "
                f"{node['Resources'].get('GPU', 0):g} GPUs)"
                for node in found
            )
            raise ConfigError(
                f"workers.node_labels.{pin.role}: the {pin.role} reserves {pin.reserves}, more than the nodes with "
                f"{_labels_text(pin.labels)} have: {have}; label more nodes, or reserve less"
            )


def _labels_text(labels: dict[str, str]) -> str:
    """key=value, ..., without the node id label that Ray gives every node; "no labels" for none."""
    shown = [f"{key}={value}" for key, value in sorted(labels.items()) if key != "ray.io/node-id"]
    return ", ".join(shown) or "no labels"


def _room(bundle: dict[str, float], resources: dict[str, float]) -> float:
    """How many `bundle`s a node with `resources` holds (any number of an empty one)."""
    return min((int(resources.get(name, 0) / amount + 1e-9) for name, amount in bundle.items()), default=float("inf"))


def where_the_roles_run(roles: dict[str, Any]) -> str | None:
    """On a cluster of several nodes, one line with the node (node_names) of the driver and of each role's
    processes; None on one node, where everything runs. `roles`: name -> its ModelGroup, RolloutClient
    or RewardClient (workers/group.py), or None where the run has no such role. Their calls learn the
    node of every worker: a failure then names its node and what else ran there."""
    nodes = node_names([(node["NodeID"], node["NodeManagerAddress"]) for node in ray.nodes() if node["Alive"]])
    if len(nodes) < 2:
        return None

    def name_of(where: dict) -> str:
        return nodes.get(where["node_id"], where["node_id"])

    parts = [f"driver on {name_of({'node_id': ray.get_runtime_context().get_node_id()})}"]
    held: dict[str, str] = {}  # "actor rank 1" -> its node's name, shared by every role's WorkerCalls
    for name, role in roles.items():
        if role is None:
            continue
        role.calls.nodes = held
        if getattr(role, "local", None) is not None:  # a RewardClient that scores in the driver
            parts.append(f"{name} in the driver")
            continue
        found = role.where()
        if isinstance(found, list):  # a ModelGroup: one per rank
            held.update({f"{name} rank {i}": name_of(rank) for i, rank in enumerate(found)})
            parts.append(f"{name} " + ", ".join(f"rank {i} on {name_of(rank)}" for i, rank in enumerate(found)))
        else:
            held[name] = name_of(found)
            parts.append(f"{name} on {name_of(found)}")
    return f"placement on {len(nodes)} nodes: " + "; ".join(parts)


def node_names(nodes: list[tuple[str, str]]) -> dict[str, str]:
    """{node id: its name in the log} for the (node id, address) of the alive nodes: the address, and
    where several nodes share one (raylets on one machine) the start of the id too, so that a failure
    names the node it lost and only the workers that ran on that node."""
    shared = Counter(address for _, address in nodes)
    return {
        node_id: address if shared[address] == 1 else f"{address} (node {node_id[:8]})" for node_id, address in nodes
    }


def shadowing_directories() -> list[str]:
    """The directories Ray puts first on a worker's sys.path (the driver's script directory when it is
    on the driver's sys.path, and its working directory) that hold a roll_lite other than the driver's."""
    candidates = [os.path.abspath(os.path.curdir)]
    script_directory = os.path.dirname(os.path.realpath(sys.argv[0]))
    if script_directory in sys.path:
        candidates.append(script_directory)
    driver = Path(roll_lite_dir())

    def holds_another_roll_lite(directory: str) -> bool:
        module, package = Path(directory) / "roll_lite.py", Path(directory) / "roll_lite"
        return module.exists() or (package.exists() and package.resolve() != driver)

    return [d for d in candidates if holds_another_roll_lite(d)]


def stop_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()
    stop_watching()
    restore_signals()
