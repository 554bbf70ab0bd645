"""GPU placement on Ray, checked on a CPU machine with logical GPUs (Ray hands out GPU ids it is told
exist; the workers then run on CPU since torch sees no CUDA). workers/placement.py: each actor rank a
GPU of its own, rank i of the reference and the critic and the rollout worker colocated on the same
GPU, ranks spread over two nodes when asked; too few GPUs is one line before any worker starts."""

import json
import os
import re
import subprocess
import sys
import time

import pytest
import ray
from ray_hosts import HEAD_OPTIONS
from raylets import Raylets, forked_workers, ray_start
from test_pipeline_ray import REPO, small

from roll_lite.cli import main
from roll_lite.config import ConfigError, load_config
from roll_lite.strategy.distributed import free_port

GPUS = [
    "workers.gpus_per_rank=1",
    "workers.actor_dp=2",  # reference_dp and critic_dp follow actor_dp on GPUs
    "workers.actor_cpus=0.5",
    "workers.rollout_cpus=0",
    "algorithm.track_kl=true",
]


def test_gpu_settings_are_checked_with_the_key_named(tmp_path):
    cases = {
        "workers.gpus_per_rank=2": "workers.gpus_per_rank: must be 0 (CPU) or 1",
        "workers.placement=random": "workers.placement: must be pack or spread",
        "workers.reference_dp=1": "workers.reference_dp: with workers.gpus_per_rank=1 the roles share the actor's GPUs",
        "workers.reward_gpus=2": "workers.reward_gpus: must be 0 (a share of actor rank 0's GPU) or 1",
        "workers.reward_gpus=1": "workers.reward_gpus: the reward worker takes a GPU for reward models and judges, "
        "and this run has none",
    }
    for override, expected in cases.items():
        with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            load_config(REPO / "configs/ppo.yaml", GPUS + [override])
    config = load_config(REPO / "configs/ppo.yaml", GPUS)
    assert (config.workers.reference_dp, config.workers.critic_dp) == (2, 2)
    config = load_config(REPO / "configs/ppo.yaml", ["workers.actor_dp=2"])  # on CPU: one rank each, as before
    assert (config.workers.reference_dp, config.workers.critic_dp) == (1, 1)


def test_rollout_gpus_of_its_own_are_checked_with_the_key_named():
    vllm = ["rollout.engine=vllm"]
    cases = [
        (["workers.rollout_gpus=-1"], "workers.rollout_gpus: must be >= 0 (0: colocated), got -1"),
        (
            ["workers.gpus_per_rank=0", "workers.rollout_gpus=1"],
            "workers.rollout_gpus: GPUs of the rollout's own need workers.gpus_per_rank=1",
        ),
        (["workers.rollout_gpus=2"], "workers.rollout_gpus: the hf engine generates on one GPU, got 2"),
        (
            vllm + ["workers.rollout_gpus=2"],
            "rollout.tensor_parallel_size: must equal the rollout worker's GPUs, 2 (workers.rollout_gpus=2",
        ),
        (
            vllm + ["rollout.tensor_parallel_size=2"],
            "rollout.tensor_parallel_size: must equal the rollout worker's GPUs, 1 (workers.rollout_gpus=0",
        ),
    ]
    for overrides, expected in cases:
        with pytest.raises(ConfigError) as error:
            load_config(REPO / "configs/ppo.yaml", GPUS + overrides)
        assert str(error.value).startswith(expected), (overrides, str(error.value))
    disaggregated = load_config(
        REPO / "configs/ppo.yaml", GPUS + vllm + ["workers.rollout_gpus=2", "rollout.tensor_parallel_size=2"]
    )
    colocated = load_config(REPO / "configs/ppo.yaml", GPUS + vllm)
    # the engine sleeps between generations only when it shares a GPU
    assert (colocated.rollout.release_memory, disaggregated.rollout.release_memory) == (True, False)


def test_the_capacity_checks_count_what_the_placement_reserves(tmp_path):
    from roll_lite.workers.placement import reservation
    from test_reward_model import save_reward_model

    on_gpus = reservation(load_config(REPO / "configs/ppo.yaml", GPUS))  # the rollout takes a GPU share, no CPU
    assert (on_gpus.cpus, on_gpus.gpus, on_gpus.cpus_from) == (1.0, 2, "workers.actor_cpus 0.5 × workers.actor_dp 2")
    on_cpu = reservation(load_config(REPO / "configs/ppo.yaml", ["workers.actor_dp=2", "workers.rollout_cpus=0.25"]))
    assert (on_cpu.cpus, on_cpu.gpus) == (2.25, 0)
    assert (
        reservation(load_config(REPO / "configs/ppo.yaml", ["workers.actor_dp=2"]), with_rollout=False).cpus == 2
    )  # SFT
    assert (
        reservation(load_config(REPO / "configs/ppo.yaml", ["rollout.in_actor=true"])).cpus == 1
    )  # no rollout process
    apart = reservation(load_config(REPO / "configs/ppo.yaml", GPUS + ["workers.rollout_gpus=1"]))
    assert (apart.gpus, apart.gpus_from) == (3, "workers.gpus_per_rank × workers.actor_dp + workers.rollout_gpus")
    scorer = f"reward.models={{{save_reward_model(tmp_path / 'rm')}: 1.0}}"
    own_reward_gpu = reservation(load_config(REPO / "configs/ppo.yaml", GPUS + [scorer, "workers.reward_gpus=1"]))
    assert (own_reward_gpu.gpus, own_reward_gpu.gpus_from) == (
        3,
        "workers.gpus_per_rank × workers.actor_dp + workers.reward_gpus",
    )
    assert reservation(load_config(REPO / "configs/ppo.yaml", GPUS + [scorer])).gpus == 2  # colocated: a share
    # workers.node_labels: what each pinned role reserves of its own on the nodes it is pinned to
    pins = "workers.node_labels={actor: {zone: a}, rollout: {zone: b}, reward: {zone: c}, critic: {zone: a}}"
    pinned = reservation(
        load_config(REPO / "configs/ppo.yaml", GPUS + [scorer, pins, "workers.rollout_gpus=1", "workers.reward_gpus=1"])
    )
    assert {pin.role: (pin.labels, pin.bundle, pin.count) for pin in pinned.pins} == {
        "actor": ({"zone": "a"}, {"CPU": 0.5, "GPU": 1}, 2),
        "rollout": ({"zone": "b"}, {"GPU": 1}, 1),
        "reward": ({"zone": "c"}, {"GPU": 1}, 1),
        "critic": ({"zone": "a"}, {}, 1),  # on the actor's bundles: the actor's own check covers them
    }
    with pytest.raises(ConfigError, match=r"^workers.node_labels.reward: the reward worker's reward models and judges"):
        load_config(REPO / "configs/ppo.yaml", GPUS + [scorer, "workers.node_labels.reward.zone=c"])


def test_too_few_gpus_stops_roll_train_in_one_line_before_any_worker(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(
        ["--config", str(REPO / "configs/ppo.yaml"), *small(tmp_path), *GPUS, f"output_dir={tmp_path}", "run_name=gpu"]
    )
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "roll-train: config error: workers.gpus_per_rank: the workers need 2 GPUs (workers.gpus_per_rank × "
        "workers.actor_dp) but the cluster has 0; lower workers.actor_dp, or set workers.gpus_per_rank=0 to run on CPU"
    ]
    assert not (tmp_path / "gpu").exists()


@pytest.fixture
def two_nodes_with_two_logical_gpus_each(monkeypatch, tmp_path):
    """A head and a second node (a second raylet on this machine, each in a session of its own:
    tests/raylets.py), each with 2 logical GPUs and a node label, zone=a and zone=b, and without what
    these tests do not use (tests/raylets.py ray_start; no dashboard); yields the head's address once
    the head is up (DRIVER waits for the second node to join)."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus=1", "--num-gpus=2", "--disable-usage-stats", "--node-ip-address=127.0.0.1"]
    common += ["--include-log-monitor=false"]  # and the head's HEAD_OPTIONS: what these nodes need not start
    with Raylets(2, "two nodes on this machine") as nodes:
        command, hook = ray_start(
            ["--head", f"--port={port}", "--include-dashboard=false", "--labels=zone=a", *HEAD_OPTIONS, *common]
        )
        nodes[0].start(command, tmp_path / "head.log", {**os.environ, **hook})
        while nodes[0].running():  # `ray start` exits once its node is up
            time.sleep(0.2)
        assert not nodes[0].failed(), (tmp_path / "head.log").read_text()[-3000:]
        command, hook = ray_start([f"--address={address}", "--labels=zone=b", *common])
        nodes[1].start(command, tmp_path / "node.log", {**os.environ, **hook})
        yield address


# A driver of its own (as roll-train is): places the 2 ranks of an actor with each placement (pack pinned
# to the node labelled zone=b), and the bundles of a spread group pinned there, prints where; then joins
# as roll-train does with a label no node has. Each rank is a task with the Ray options a ModelGroup gives
# its rank's worker (Placement.model_rank) that answers where it runs, as ModelWorker.where does: the
# placement is Placement's alone, and the tasks, one after the other, reuse Ray's idle worker processes,
# which import no torch (test_each_actor_rank_gets_its_own_gpu checks a ModelGroup's ranks where Placement
# put them).
DRIVER = """
import json, sys, time
import ray
from roll_lite.config import ConfigError, load_config
from roll_lite.workers.cluster import start_ray
from roll_lite.workers.placement import Placement, reservation


@ray.remote
def where():  # roll_lite.workers.placement.where_am_i, which ModelWorker.where returns
    context = ray.get_runtime_context()
    return {"node_id": context.get_node_id(), "gpu_ids": [str(i) for i in ray.get_gpu_ids()]}


address, config_path, *overrides = sys.argv[1:]
ray.init(address=address, logging_level="WARNING")
deadline = time.monotonic() + 120
while sum(node["Alive"] for node in ray.nodes()) < 2:
    assert time.monotonic() < deadline, "the second node did not join"
    time.sleep(0.2)
found = {}
# spread, pinned: both bundles on the one node labelled zone=b (without the pin, one per node)
config = load_config(config_path, overrides + ["workers.placement=spread", "workers.node_labels.actor.zone=b"])
layout = Placement(config, roles_on_a_gpu=1)
ray.get(layout.group.ready(), timeout=60)
found["spread pinned"] = ray.util.placement_group_table(layout.group)["bundles_to_node_id"]
layout.remove()
for placement in ("spread", "pack"):
    # Removing a placement group frees its bundles a moment later. PACK takes one node only where one
    # node has room when it is placed, and packs as far as it can otherwise: wait until the group
    # placed before is gone, with its actors, and the cluster's CPUs and GPUs are all free again.
    deadline, total = time.monotonic() + 60, ray.cluster_resources()
    while any((free := ray.available_resources()).get(r, 0) < total[r] for r in ("CPU", "GPU")):
        assert time.monotonic() < deadline, (free, total)
        time.sleep(0.1)
    pin = ["workers.node_labels.actor.zone=b"] if placement == "pack" else []
    config = load_config(config_path, overrides + [f"workers.placement={placement}", *pin])
    layout = Placement(config, roles_on_a_gpu=1)
    found[placement] = [ray.get(where.options(**layout.model_rank("actor", rank)).remote()) for rank in range(2)]
    layout.remove()
found["zone b"] = [node["NodeID"] for node in ray.nodes() if node["Labels"].get("zone") == "b"]
ray.shutdown()
try:
    start_ray(address, reservation(load_config(config_path, overrides + ["workers.node_labels.actor.zone=c"])))
except ConfigError as error:
    found["unknown"] = str(error)
found["connected"] = ray.is_initialized()
print(json.dumps(found))
"""


def test_spread_puts_the_actor_ranks_on_two_nodes_and_pack_on_one(tmp_path, two_nodes_with_two_logical_gpus_each):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            two_nodes_with_two_logical_gpus_each,
            str(REPO / "configs/ppo.yaml"),
            *small(tmp_path),
            *GPUS,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    spread, pack = found["spread"], found["pack"]
    assert spread[0]["node_id"] != spread[1]["node_id"]
    assert pack[0]["node_id"] == pack[1]["node_id"] and pack[0]["gpu_ids"] != pack[1]["gpu_ids"]
    assert [pack[0]["node_id"]] == found["zone b"]  # pinned to the node labelled zone=b
    assert list(found["spread pinned"].values()) == found["zone b"] * 2
    # A label no node has: one line at start-up naming the key and every node's labels, and disconnected
    unknown = found["unknown"]
    assert unknown.startswith("workers.node_labels.actor: no node of the cluster has zone=c; its nodes: "), unknown
    assert unknown.endswith(" (a node's labels: `ray start --labels key=value`)"), unknown
    listed = {label: node for node, label in re.findall(r"\S+ \(node (\w{8})\) \((zone=\w)\)", unknown)}
    assert listed.keys() == {"zone=a", "zone=b"} and listed["zone=b"] == found["zone b"][0][:8], unknown
    assert not found["connected"]


def test_one_process_per_rank_where_the_dps_allow_and_another_dp_is_refused():
    ppo = REPO / "configs/ppo.yaml"
    assert load_config(ppo, []).workers.one_process_per_rank is True  # one rank of each role on CPU
    assert load_config(ppo, GPUS).workers.one_process_per_rank is True  # the dps follow actor_dp on GPUs
    assert load_config(ppo, ["workers.actor_dp=2"]).workers.one_process_per_rank is False  # 1 reference rank on CPU
    with pytest.raises(
        ConfigError,
        match=r"^workers.reference_dp: workers.one_process_per_rank=true puts rank i of "
        r"each role in actor rank i's process: set it to workers.actor_dp=2",
    ):
        load_config(ppo, ["workers.actor_dp=2", "workers.one_process_per_rank=true"])


# one Ray start for the module's last two tests; the first removes what it placed. Its workers fork from a
# zygote (tests/raylets.py forked_workers), as a forked roll-train's do: ~3.5 s of CPU of imports spared each
@pytest.fixture(scope="module")
def four_logical_gpus(tmp_path_factory):
    with forked_workers(tmp_path_factory.mktemp("zygote")):
        ray.init(
            address="local",
            num_cpus=2,
            num_gpus=4,
            labels={"zone": "a"},  # for the pinned groups of GPUs below (workers.node_labels)
            include_dashboard=False,
            object_store_memory=256 * 1024**2,
            logging_level="WARNING",
        )
        yield
        ray.shutdown()


def gpus_task():
    """A task that answers the GPU ids Ray assigned it (made in the test: Ray sends it by value)."""

    @ray.remote
    def assigned_gpus() -> list[str]:
        return sorted(str(i) for i in ray.get_gpu_ids())

    return assigned_gpus


def test_a_rollout_with_gpus_of_its_own_gets_them_apart_from_the_actors(tmp_path, four_logical_gpus):
    from roll_lite.workers.placement import Placement

    config = load_config(
        REPO / "configs/ppo.yaml",
        small(tmp_path)
        + GPUS
        + ["rollout.engine=vllm", "workers.rollout_gpus=2", "rollout.tensor_parallel_size=2"]
        + ["workers.node_labels={actor: {zone: a}, rollout: {zone: a}}"],  # bundle label selectors: the one node's
    )

    assigned_gpus = gpus_task()
    layout = Placement(config, roles_on_a_gpu=3)  # actor, reference, critic: the rollout is elsewhere
    try:
        actor = [ray.get(assigned_gpus.options(**layout.model_rank("actor", rank)).remote()) for rank in range(2)]
        rollout = ray.get(assigned_gpus.options(**layout.rollout()).remote())
    finally:
        layout.remove()
    assert len(rollout) == 2 and all(len(ids) == 1 for ids in actor)
    assert sorted(actor[0] + actor[1] + rollout) == ["0", "1", "2", "3"]  # four different GPUs


def test_each_actor_rank_gets_its_own_gpu_and_the_other_roles_share_it(tmp_path, four_logical_gpus):
    from roll_lite.pipelines.ppo import PPOPipeline
    from roll_lite.workers.placement import Placement
    from test_reward_model import save_reward_model

    scorer = f"reward.models={{{save_reward_model(tmp_path / 'rm', positions=512)}: 0.5}}"
    config = load_config(REPO / "configs/ppo.yaml", small(tmp_path) + GPUS + [f"output_dir={tmp_path}", scorer])
    pipeline = PPOPipeline(config)
    pipeline.prepare_data()
    pipeline.start_workers()  # actor, reference, critic (GAE) with 2 ranks each, the rollout and reward workers
    actor, reference, critic = (group.where() for group in (pipeline.actor, pipeline.reference, pipeline.critic))
    gpu = [rank["gpu_ids"] for rank in actor]
    assert all(len(ids) == 1 for ids in gpu) and gpu[0] != gpu[1]  # no two actor ranks on one GPU
    assert [rank["gpu_ids"] for rank in reference] == gpu and [rank["gpu_ids"] for rank in critic] == gpu
    assert pipeline.rollout.where()["gpu_ids"] == gpu[0] and pipeline.reward.where()["gpu_ids"] == gpu[0]
    assert "reward models and judges on cpu" in pipeline.reward.describe()  # torch sees no CUDA here
    # The colocated layout trains (here on CPU, torch sees no CUDA): one full PPO step, the reward model scoring.
    metrics = pipeline.step(1)
    assert metrics["actor/grad_norm"] > 0 and metrics["critic/grad_norm"] > 0
    assert metrics["reward/model:rm/failed"] == 0 and "reward/model:rm" in metrics
    # workers.reward_gpus=1: a GPU of its own, apart from the actor's (one actor rank, so the 4 GPUs suffice),
    # here pinned to the node's label (its group's bundle label selector). Where Placement puts the reward
    # worker (RewardClient's options, checked above on the shared GPU), asked of a task: no reward worker
    # process of its own to start
    own_gpu = ["workers.actor_dp=1", "workers.reward_gpus=1", scorer, "workers.node_labels.reward.zone=a"]
    apart = load_config(REPO / "configs/ppo.yaml", small(tmp_path) + GPUS + own_gpu)
    own = ray.get(gpus_task().options(**Placement(apart, roles_on_a_gpu=1).reward()).remote())
    assert len(own) == 1 and own not in gpu, (own, gpu)
