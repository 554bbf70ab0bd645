"""workers.node_labels: roles pinned to Ray nodes by node label (`ray start --labels key=value`).

The keys' syntax, and what a pin does to the roles that would share the actor's process or GPU: a role
pinned to other labels than the actor's (`pinned_apart`) cannot run there. Where a default decides that
sharing (workers.one_process_per_rank, rollout.in_actor, reward.in_driver: null), the pin turns it off;
where the config asks for it, or on GPUs where the role has no GPU of its own, it is a ConfigError.
Whether the cluster has such nodes is only known once connected: workers/cluster.py checks it then.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from roll_lite.config.key_checks import check
from roll_lite.rewards.routing import reads_text

if TYPE_CHECKING:
    from roll_lite.config.schema import RunConfig

ROLES = ("actor", "reference", "critic", "rollout", "reward", "teacher")
_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"  # Ray's (Kubernetes') label names and values
LABEL_KEY = re.compile(rf"({_NAME}(\.{_NAME})*/)?{_NAME}")  # a name, with an optional DNS prefix (ray.io/...)
LABEL_VALUE = re.compile(_NAME)


def labels_of(config: RunConfig, role: str) -> dict[str, str]:
    """The labels `role` is pinned to ({}: none)."""
    return dict(config.workers.node_labels.get(role) or {})


def pinned_apart(config: RunConfig, role: str) -> bool:
    """Whether `role` is pinned to other labels than the actor's (a role without labels of its own goes
    wherever it is put: in the actor's process or on its GPU, it follows the actor)."""
    own = labels_of(config, role)
    return bool(own) and own != labels_of(config, "actor")


def validate_node_labels(config: RunConfig) -> None:
    w = config.workers
    for role, labels in w.node_labels.items():
        key = f"workers.node_labels.{role}"
        check(role in ROLES, key, f"'{role}' is not a role; the roles: {', '.join(ROLES)}")
        for label, value in labels.items():
            check(
                LABEL_KEY.fullmatch(label) is not None,
                key,
                f"'{label}' is not a Ray label key (letters, digits, '-', '_', '.', up to 63, with an optional "
                "'prefix/')",
            )
            check(
                LABEL_VALUE.fullmatch(value) is not None,
                f"{key}.{label}",
                f"must be a label value as `ray start --labels` sets it (letters, digits, '-', '_', '.', up to 63), "
                f"got {value!r}: a pin matches the node's value exactly",
            )
    if w.one_process_per_rank:
        for role in ("reference", "critic"):
            check(
                not pinned_apart(config, role),
                f"workers.node_labels.{role}",
                f"workers.one_process_per_rank=true runs the {role} in the actor's processes, on the actor's nodes: "
                "give it the actor's labels or none, or set workers.one_process_per_rank=false (null is false "
                "where a role is pinned apart)",
            )
    check(
        not (config.reward.in_driver and labels_of(config, "reward")),
        "workers.node_labels.reward",
        "reward.in_driver=true scores in the driver, which runs where roll-train started: set reward.in_driver=null "
        "(a reward worker of its own for a pinned reward)",
    )
    if not w.gpus_per_rank:
        return
    for role in ("reference", "critic", "teacher"):
        check(
            not pinned_apart(config, role),
            f"workers.node_labels.{role}",
            f"on GPUs (workers.gpus_per_rank=1) rank i of the {role} shares actor rank i's GPU, so it runs on the "
            "actor's nodes: give it the actor's labels or none",
        )
    check(
        w.rollout_gpus > 0 or not pinned_apart(config, "rollout"),
        "workers.node_labels.rollout",
        "the rollout worker shares actor rank 0's GPU (workers.rollout_gpus=0): give it the actor's labels or none, "
        "or GPUs of its own on the nodes it names (workers.rollout_gpus=N)",
    )
    check(
        w.reward_gpus > 0 or not reads_text(config.reward) or not pinned_apart(config, "reward"),
        "workers.node_labels.reward",
        "the reward worker's reward models and judges share actor rank 0's GPU (workers.reward_gpus=0): give it "
        "the actor's labels or none, or a GPU of its own on the nodes it names (workers.reward_gpus=1)",
    )
