"""workers.node_labels (roll_lite/config/node_labels.py, workers/placement.py, workers/cluster.py): the keys'
checks, what a pin does to the roles that share the actor's process or GPU, and the check at start-up of
the pins against the cluster's nodes (here a list as ray.nodes() gives it). On Ray: tests/test_placement.py
(two raylets with labels) and tests/test_several_hosts.py (three hosts)."""

import pytest
from test_pipeline_ray import REPO
from test_placement import GPUS

from roll_lite.config import ConfigError, load_config


def test_node_labels_are_checked_with_the_key_named_and_a_pin_apart_turns_sharing_off():
    ppo = REPO / "configs/ppo.yaml"  # on CPU: one rank of each role, in one process with the engine
    refused = {
        "workers.node_labels.trainer.zone=a": "workers.node_labels.trainer: 'trainer' is not a role; the roles: "
        "actor, reference, critic, rollout, reward, teacher",
        "workers.node_labels.actor.-zone=a": "workers.node_labels.actor: '-zone' is not a Ray label key",
        "workers.node_labels.actor.zone=in(a,b)": "workers.node_labels.actor.zone: must be a label value as "
        "`ray start --labels` sets it",
    }
    for override, expected in refused.items():
        with pytest.raises(ConfigError) as error:
            load_config(ppo, [override])
        assert str(error.value).startswith(expected), str(error.value)
    # Pinned apart from the actor, a role leaves the actor's process (and the reward the driver) where a
    # default put it there; asked for explicitly, that sharing and the pin contradict each other
    config = load_config(ppo, ["workers.node_labels={reference: {zone: b}, rollout: {zone: b}, reward: {zone: b}}"])
    assert (config.workers.one_process_per_rank, config.rollout.in_actor, config.reward.in_driver) == (False,) * 3
    config = load_config(ppo, ["workers.node_labels={actor: {zone: a}, reference: {zone: a}, critic: {zone: a}}"])
    assert (config.workers.one_process_per_rank, config.rollout.in_actor) == (True, True)  # the actor's labels
    contradictions = {
        "workers.one_process_per_rank=true": ("reference", "workers.one_process_per_rank=true runs the reference in"),
        "rollout.in_actor=true": ("rollout", "rollout.in_actor=true needs workers.node_labels.rollout=the actor's"),
        "reward.in_driver=true": ("reward", "reward.in_driver=true scores in the driver"),
    }
    for override, (role, expected) in contradictions.items():
        with pytest.raises(ConfigError) as error:
            load_config(ppo, [override, f"workers.node_labels.{role}.zone=b"])
        assert str(error.value).startswith(f"workers.node_labels.{role}: {expected}"), str(error.value)
    # On GPUs the reference and the critic share the actor's GPUs, and the rollout too without GPUs of its own
    for role in ("reference", "critic", "rollout"):
        with pytest.raises(ConfigError, match=rf"^workers.node_labels.{role}: .* shares actor rank"):
            load_config(ppo, GPUS + [f"workers.node_labels.{role}.zone=b"])
    load_config(ppo, GPUS + ["workers.node_labels.rollout.zone=b", "workers.rollout_gpus=1"])  # GPUs of its own


def ray_node(number: int, labels: dict, cpus: float = 1, gpus: float = 0, alive: bool = True) -> dict:
    """A node as ray.nodes() lists it (the keys the check reads; Ray labels every node with its id)."""
    node_id = f"{number:02d}" * 28
    resources = {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {}), f"node:10.0.0.{number}": 1.0}
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": f"10.0.0.{number}",
        "Labels": {"ray.io/node-id": node_id, **labels},
        "Resources": resources,
    }


def test_a_pin_needs_an_alive_node_with_its_labels_and_room_there():
    from roll_lite.workers.cluster import check_pins
    from roll_lite.workers.placement import reservation

    nodes = [
        ray_node(1, {}),
        ray_node(2, {"zone": "b", "gpu": "big"}, cpus=2, gpus=8),
        ray_node(3, {"zone": "c"}, alive=False),  # gone: its labels are offered no more
    ]

    def check(*overrides: str) -> None:
        check_pins(reservation(load_config(REPO / "configs/ppo.yaml", list(overrides))).pins, nodes)

    check("workers.node_labels.rollout={zone: b, gpu: big}", "workers.node_labels.actor.zone=b")
    for pin, expected in (
        ("workers.node_labels.reward.zone=c", "workers.node_labels.reward: no node of the cluster has zone=c"),
        ("workers.node_labels.actor={zone: b, gpu: small}", "workers.node_labels.actor: no node of the cluster has "),
    ):
        with pytest.raises(ConfigError) as error:
            check(pin)
        assert str(error.value).startswith(expected)
        assert str(error.value).endswith(
            "its nodes: 10.0.0.1 (no labels), 10.0.0.2 (gpu=big, zone=b) (a node's labels: `ray start --labels key=value`)"
        )
    with pytest.raises(ConfigError) as error:  # 3 ranks of 1 CPU each, on a node of 2
        check("workers.node_labels.actor.zone=b", "workers.actor_dp=3")
    assert str(error.value) == (
        "workers.node_labels.actor: the actor reserves workers.actor_dp 3 × (workers.actor_cpus 1 CPU), more than "
        "the nodes with zone=b have: 10.0.0.2 (2 CPUs, 8 GPUs); label more nodes, or reserve less"
    )
