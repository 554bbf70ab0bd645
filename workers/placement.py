"""Where each worker runs: Ray resource requests and placement groups.

On CPU (`workers.gpus_per_rank=0`, the default) the actor's ranks reserve `workers.actor_cpus` each
in a placement group of their own; the reference, the critic and the rollout worker take what is left.

On GPUs (`workers.gpus_per_rank=1`) the roles are colocated, as in verl's hybrid engine: one placement
group of `workers.actor_dp` bundles, one GPU each, packed onto as few nodes as possible
(`workers.placement=pack`) or one bundle per node where it can (`spread`). Rank i of the actor, the
reference and the critic all run on bundle i, and the rollout worker on bundle 0; each takes an equal
share of the bundle's GPU, so Ray gives them the same GPU (CUDA_VISIBLE_DEVICES) and no two ranks of
one group share a GPU (nccl needs one device per rank). With `workers.rollout_gpus=N` the rollout worker
instead gets N whole GPUs of its own, on one node (a placement group of its own): the disaggregated
layout, where vLLM can generate with tensor parallelism while the actor trains elsewhere. The reward
worker, when it loads reward models or judges, takes a share of actor rank 0's GPU as well, or with
`workers.reward_gpus=1` a GPU of its own; with rule rewards only it takes none.

`workers.node_labels` pins a role to the Ray nodes with those labels: a placement group of the role's
own gets them as each bundle's label selector (the actor's, the rollout's and the reward's GPUs of their
own), a worker outside any placement group as its actor's label selector. A role that shares the
actor's bundles or process has the actor's labels or none (roll_lite/config/node_labels.py checks it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from roll_lite.config import RunConfig
from roll_lite.rewards.routing import reads_text


@dataclass(frozen=True)
class Pin:
    """A role pinned by workers.node_labels, with what it reserves there: `count` × `bundle` (each on one
    node), described with its keys in `reserves`, for the check against the cluster (workers/cluster.py)."""

    role: str
    labels: dict[str, str]
    bundle: dict[str, float]  # {}: the role reserves nothing of its own there (or shares the actor's bundles)
    count: int = 1
    reserves: str = ""


@dataclass(frozen=True)
class Reservation:
    cpus: float
    gpus: float
    cpus_from: str  # how the CPUs add up, with the config keys, for error messages
    gpus_from: str = "workers.gpus_per_rank × workers.actor_dp"
    pins: tuple[Pin, ...] = ()


def reservation(config: RunConfig, with_rollout: bool = True) -> Reservation:
    """What the workers ask Ray for (`Placement` below), for the capacity checks: preflight on this
    machine, start_ray on a joined cluster. On GPUs the reference, the critic and the rollout worker
    take GPU shares of the actor's bundles and no CPU."""
    w = config.workers
    cpus, cpus_from = w.actor_cpus * w.actor_dp, f"workers.actor_cpus {w.actor_cpus:g} × workers.actor_dp {w.actor_dp}"
    if with_rollout and not w.gpus_per_rank and not config.rollout.in_actor:  # in_actor: no rollout process
        cpus, cpus_from = cpus + w.rollout_cpus, f"{cpus_from} + workers.rollout_cpus {w.rollout_cpus:g}"
    gpus, gpus_from = w.gpus_per_rank * w.actor_dp, "workers.gpus_per_rank × workers.actor_dp"
    if with_rollout and w.rollout_gpus:
        gpus, gpus_from = gpus + w.rollout_gpus, f"{gpus_from} + workers.rollout_gpus"
    if with_rollout and w.gpus_per_rank and w.reward_gpus and reads_text(config.reward):
        gpus, gpus_from = gpus + w.reward_gpus, f"{gpus_from} + workers.reward_gpus"
    return Reservation(cpus, gpus, cpus_from, gpus_from, pins(config, with_rollout))


def pins(config: RunConfig, with_rollout: bool = True) -> tuple[Pin, ...]:
    """Every pinned role (also one this run does not start: a label is checked all the same), with what
    it reserves of its own where it is pinned."""
    w, found = config.workers, []
    for role, labels in w.node_labels.items():
        if not labels:
            continue
        bundle, count, reserves = {}, 1, ""
        if role == "actor":
            bundle, count = {"CPU": w.actor_cpus, "GPU": w.gpus_per_rank}, w.actor_dp
            reserves = f"workers.actor_dp {w.actor_dp} × (workers.actor_cpus {w.actor_cpus:g} CPU"
            reserves += f" + workers.gpus_per_rank {w.gpus_per_rank:g} GPU)" if w.gpus_per_rank else ")"
        elif role == "rollout" and with_rollout and not config.rollout.in_actor:
            if not w.gpus_per_rank:
                bundle, reserves = {"CPU": w.rollout_cpus}, f"workers.rollout_cpus {w.rollout_cpus:g} CPU"
            elif w.rollout_gpus:
                bundle, reserves = {"GPU": w.rollout_gpus}, f"workers.rollout_gpus {w.rollout_gpus} GPU on one node"
        elif role == "reward" and with_rollout and w.gpus_per_rank and w.reward_gpus and reads_text(config.reward):
            bundle, reserves = {"GPU": 1}, "workers.reward_gpus 1 GPU"
        found.append(Pin(role, dict(labels), {k: v for k, v in bundle.items() if v > 0}, count, reserves))
    return tuple(found)


class Placement:
    def __init__(self, config: RunConfig, roles_on_a_gpu: int):
        """`roles_on_a_gpu`: how many workers share the busiest GPU (actor + reference + critic + rollout)."""
        w = config.workers
        self.gpus = w.gpus_per_rank > 0
        self.gpu_share = 1.0 / roles_on_a_gpu
        self.actor_cpus, self.rollout_cpus = w.actor_cpus, w.rollout_cpus
        self.labels = {role: dict(labels) for role, labels in w.node_labels.items() if labels}
        bundle = {
            name: amount for name, amount in (("GPU", 1.0 if self.gpus else 0), ("CPU", w.actor_cpus)) if amount > 0
        }
        self.group = self._group("actor", [bundle] * w.actor_dp, w.placement.upper()) if bundle else None
        # disaggregated: the rollout worker's GPUs, all on one node (tensor parallelism)
        self.rollout_gpus = w.rollout_gpus if self.gpus else 0
        self.rollout_group = (
            self._group("rollout", [{"GPU": self.rollout_gpus}], "STRICT_PACK") if self.rollout_gpus else None
        )
        # the reward worker loads reward models or judges (reads_text): on GPUs it takes one
        self.reward_on_gpu = self.gpus and reads_text(config.reward)
        self.reward_group = (
            self._group("reward", [{"GPU": 1}], "PACK") if self.reward_on_gpu and w.reward_gpus else None
        )

    def _group(self, role: str, bundles: list[dict], strategy: str) -> PlacementGroup:
        """A placement group of `role`'s own, each bundle on a node with the role's labels (if pinned)."""
        labels = self.labels.get(role)
        return placement_group(
            bundles, strategy=strategy, bundle_label_selector=[labels] * len(bundles) if labels else None
        )

    def _pinned(self, role: str, options: dict) -> dict:
        """Options of a worker outside any placement group, on a node with `role`'s labels (if pinned)."""
        return {**options, "label_selector": self.labels[role]} if role in self.labels else options

    def model_rank(self, role: str, rank: int) -> dict:
        """Ray actor options for rank `rank` of a model group."""
        if not self.gpus:
            if role != "actor" or self.group is None:
                return self._pinned(role, {"num_cpus": 0})
            return {"num_cpus": self.actor_cpus, "scheduling_strategy": self._bundle(rank)}
        cpus = self.actor_cpus if role == "actor" else 0
        return {"num_cpus": cpus, "num_gpus": self.gpu_share, "scheduling_strategy": self._bundle(rank)}

    def rollout(self) -> dict:
        if not self.gpus:
            return self._pinned("rollout", {"num_cpus": self.rollout_cpus})
        if self.rollout_group is not None:
            return {
                "num_cpus": 0,
                "num_gpus": self.rollout_gpus,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self.rollout_group, placement_group_bundle_index=0
                ),
            }
        return {"num_cpus": 0, "num_gpus": self.gpu_share, "scheduling_strategy": self._bundle(0)}

    def reward(self) -> dict:
        """Ray actor options for the reward worker: on GPUs, with reward models or judges, a share of actor
        rank 0's GPU (colocated) or, with workers.reward_gpus=1, a GPU of its own; otherwise no GPU."""
        if not self.reward_on_gpu:
            return self._pinned("reward", {"num_cpus": 0})
        if self.reward_group is not None:
            return {
                "num_cpus": 0,
                "num_gpus": 1,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self.reward_group, placement_group_bundle_index=0
                ),
            }
        return {"num_cpus": 0, "num_gpus": self.gpu_share, "scheduling_strategy": self._bundle(0)}

    def _bundle(self, index: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index)

    def remove(self) -> None:
        for group in (self.group, self.rollout_group, self.reward_group):
            if group is not None:
                remove_placement_group(group)
        self.group = self.rollout_group = self.reward_group = None


def local_gpu_index(gpus_per_rank: float) -> int:
    """The index, among the GPUs this process sees, of the one Ray assigned it (Ray sets
    CUDA_VISIBLE_DEVICES to the assigned ids, so it is 0 unless something else widened it)."""
    if gpus_per_rank == 0:
        return 0
    assigned = [str(i) for i in ray.get_gpu_ids()]
    if not assigned:
        raise RuntimeError("workers.gpus_per_rank > 0 but Ray assigned this worker no GPU")
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return visible.index(assigned[0]) if assigned[0] in visible else 0


def where_am_i() -> dict:
    """In a worker: the node and the GPU ids Ray assigned it (logical ids on a machine without CUDA)."""
    context = ray.get_runtime_context()
    return {"node_id": context.get_node_id(), "gpu_ids": [str(i) for i in ray.get_gpu_ids()]}
