"""A Ray cluster over three hosts (network namespaces, tests/hosts.py; Ray on them, tests/ray_hosts.py):
the head in host 1, a worker node in hosts 2 and 3, token authentication on, started once for the
module. Jobs submitted from outside the hosts (this process's namespace, over the bridge, to the head's
job API, as `ray job submit` sends them) run GRPO with the actor's two FSDP2 ranks on two hosts and the
rollout worker on the third, pinned there by node label (workers.node_labels; each host's node has
labels of its own): the actor to hosts 2 and 3, the rollout worker to host 1, where they land, checked
by node id.

That run loses two worker hosts in turn: every process in a host's namespace is killed with SIGKILL
(its raylet, its agents, its workers and their zygote), first in the middle of step 2, then, in the run
resumed once that host is back, while step 2's checkpoint is being written. Each time the run stops
within seconds with one line naming the lost (pinned) worker and its host; resubmitted with the same
command once the host is back, it resumes from the last complete checkpoint. Its metrics, steps 0 and 1 from its first
job (on the three hosts, uninterrupted until step 2), step 2 from the resumed ones, equal those of the
same run on one host (its own local Ray cluster, run meanwhile), bit for bit. The runs time their
kills with a pipeline written next to them (`pipeline=host_loss:LosesTwoHosts`): a step, and a
checkpoint's write, that wait for the test. One run serves every test of the module (host_losses).

Where this machine cannot make network namespaces (no root, no `ip`, the kernel refuses), or
ROLL_TEST_HOSTS=raylets asks for it, the hosts are sessions of processes on this machine's network
instead (tests/raylets.py): three Ray nodes (raylets) on one machine, with ports of their own, and a
host killed is its node's session. A pytest warning says so and why, and the one test of what only
namespaces show is skipped with the reason. The rest runs the same: the nodes then share one address,
so roll-train's log names them by address and node id (workers/cluster.py node_names), and "one host
each" means one node id each."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray_hosts import BIN, Job, RayCluster
from raylets import Raylets, hosts_or_raylets
from test_pipeline_ray import REPO, SMALL
from warm_driver import WarmPopen

from roll_lite.checkpoint import layout

# Each host has one CPU and each actor rank and the rollout worker reserve one, so the actor's
# placement group (workers.placement=spread) takes two hosts and the rollout worker the third.
ONE_CPU_EACH = ["workers.actor_cpus=1", "workers.rollout_cpus=1"]
# The same run on this machine's two CPUs. What a worker reserves of Ray's CPUs changes where it runs,
# not what it computes: each one computes with workers.torch_threads=1 either way.
HALF_A_CPU_EACH = ["workers.actor_cpus=0.5", "workers.rollout_cpus=0.5"]
GRPO = [
    *SMALL,
    "rollout.prompts_per_step=2",
    "rollout.num_samples=4",
    "steps=2",
    "eval_every=2",
    "save_model=false",
    "checkpoint.every=1",  # a checkpoint after each step: the runs that lose a host resume from step 1's
    "algorithm.track_kl=false",  # no reference model: cheaper, same proof
    "workers.actor_dp=2",
    "workers.placement=spread",
]
# Each host's node labels (`ray start --labels`), and the run that loses hosts pinned by them: the actor's
# ranks to hosts 2 and 3, the rollout worker to host 1 (the head; where it would go anyway, as one CPU is
# left there, but Ray places it by its label: without the pin it could be scheduled before the actor's
# group and take a CPU of host 2 or 3, and the pinned ranks would then wait for it)
HOST_LABELS = [{"host": "h1"}, {"host": "h2", "pool": "trainers"}, {"host": "h3", "pool": "trainers"}]
PINNED = ["workers.node_labels.actor.pool=trainers", "workers.node_labels.rollout.host=h1"]
# Timings and memory figures: they follow the machine's load, and no two runs share them.
TIMING = re.compile(r"^perf/|_per_s$|_s$|memory")
NODE = r"(\S+(?: \(node \w+\))?)"  # an address, and the start of the node id where nodes share it
PLACEMENT = re.compile(
    rf"placement on 3 nodes: driver on {NODE}; actor rank 0 on {NODE}, rank 1 on {NODE}; rollout on {NODE};"
)

PIPELINES = '''
import json
import os
import time
from pathlib import Path

import ray

from roll_lite.checkpoint import layout
from roll_lite.pipelines.ppo import PPOPipeline

HERE = Path(__file__).parent


class LosesTwoHosts(PPOPipeline):
    """Two losses, each once, so that the same command run again goes through each time:

    - in its second call (step 2) the loss_func of each actor rank on a worker node (not on the head,
      where the driver runs) writes its node's id to rank<R>.json, then sleeps until the test has
      killed that node;
    - the write of step 2's checkpoint, its folder made and no part written yet, waits until the test
      has killed a node and says `go` (in the run resumed after the first loss)."""

    def loss_func(self, batch, output):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 2 and "RANK" in os.environ:  # an actor rank (the driver's loss check calls it too)
            node, mark = ray.get_runtime_context().get_node_id(), HERE / f"rank{os.environ['RANK']}.json"
            head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
            if node != head and not mark.exists():
                mark.write_text(json.dumps({"node_id": node}))
                time.sleep(120)
        return super().loss_func(batch, output)

    def checkpoint_groups(self):
        writing = layout.partial_dir(Path(self.config.output_dir) / self.config.run_name, 2).is_dir()
        if writing and not (HERE / "paused").exists():
            (HERE / "paused").touch()
            for _ in range(1200):
                if (HERE / "go").exists():
                    break
                time.sleep(0.1)
        return super().checkpoint_groups()
'''


def roll_train(data: list[str], output: Path, run_name: str, *extra: str) -> list[str]:
    return [
        str(BIN / "roll-train"),
        "--config",
        str(REPO / "configs/grpo.yaml"),
        *GRPO,
        *data,
        f"output_dir={output}",
        f"run_name={run_name}",
        "workers.backend=ray",
        *extra,
    ]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three hosts and a Ray cluster on them, for every test of the module; afterwards no namespace,
    veth, bridge or process of theirs is left."""
    with hosts_or_raylets(3) as hosts:
        cluster = RayCluster(hosts, tmp_path_factory.mktemp("cluster"), labels=HOST_LABELS)
        yield cluster
    cluster.remove_temp_dirs()
    assert hosts.leftovers() == []
    assert not cluster.processes_left()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("data")
    overrides = []
    for split in ("train", "eval"):
        rows = (REPO / f"data/reverse_digits/{split}.jsonl").read_text().splitlines(keepends=True)[:8]
        (folder / f"{split}.jsonl").write_text("".join(rows))
        overrides.append(f"data.{split}_files={folder / f'{split}.jsonl'}")
    return overrides


@pytest.fixture(scope="module")
def one_host(data, tmp_path_factory):
    """The run on one host (its own local Ray cluster, in this namespace), started at once and left to run
    while the three hosts run theirs: (its process, its output folder); one_host_run() waits for it."""
    output = tmp_path_factory.mktemp("one_host")
    # roll-train as `python -m roll_lite.cli`: forked from the warm driver (tests/warm_driver.py), its imports done
    command = [sys.executable, "-m", "roll_lite.cli", *roll_train(data, output, "one_host", *HALF_A_CPU_EACH)[1:]]
    with (output / "one_host.log").open("w") as log:
        process = WarmPopen(command, stdout=subprocess.DEVNULL, stderr=log, cwd=output)
    yield process, output
    if process.poll() is None:
        process.terminate()  # roll-train stops its local cluster on SIGTERM
    process.wait(timeout=300)


def one_host_run(one_host) -> Path:
    """The one-host run's directory, once it has ended well."""
    process, output = one_host
    process.wait(timeout=300)
    assert process.returncode == 0, (output / "one_host.log").read_text()[-3000:]
    return output / "one_host"


@pytest.fixture(scope="module")
def host_losses(cluster, data, one_host, tmp_path_factory):
    """The run on the three hosts, for every test of the module: it loses two hosts, one after the other,
    and the same command resumes it each time. Its actor is pinned to hosts 2 and 3 and its rollout worker
    to host 1 (PINNED). Lost: a worker host in the middle of step 2, then, resubmitted once that host is
    back (and refused while it is not), a worker host while step 2's checkpoint is being written; each
    loss a job that fails within seconds with no worker left (lose_the_host). What the tests check is
    recorded as it happened: the jobs' logs and outputs, where the ranks ran, the checkpoints then."""
    folder = tmp_path_factory.mktemp("host_losses")
    (folder / "host_loss.py").write_text(PIPELINES)
    command = [
        "env",
        f"--chdir={folder}",  # where the driver imports host_loss from
        *roll_train(data, folder, "run", *ONE_CPU_EACH, *PINNED, "pipeline=host_loss:LosesTwoHosts"),
    ]
    run_dir = folder / "run"
    seen: dict = {"run_dir": run_dir}

    # A host lost in the middle of step 2
    with cluster.job(command, folder / "killed.log") as job:
        marks = wait_for(lambda: sorted(folder.glob("rank*.json")), job, folder / "killed.log")
        seen["rank"], seen["node_id"] = (
            int(marks[-1].stem.removeprefix("rank")),
            json.loads(marks[-1].read_text())["node_id"],
        )
        seen["node"] = next(node["name"] for node in cluster.nodes() if node["id"] == seen["node_id"])
        # logged before step 1; the job's log comes a moment after its lines were written
        wait_for(lambda: PLACEMENT.search((folder / "killed.log").read_text()), job, folder / "killed.log")
        seen["hosts"] = [cluster.node_of_host(number)["id"] for number in (1, 2, 3)]
        seen["ids"] = cluster.alive_nodes()  # {node name: id} of the nodes the run started on
        killed, seen["killed"] = lose_the_host(cluster, seen["node"], job, folder / "killed.log")
    seen["after the first loss"] = checkpoints(run_dir)

    # On the hosts that remain, the same command is refused at once: they lack the CPUs it reserves.
    print(f"the head counted the node dead {cluster.wait_until_dead(seen['node']) - killed:.1f} s after the kill")
    seen["remaining"] = cluster.submit(command, folder / "remaining.log")
    seen["after the refusal"] = checkpoints(run_dir)

    # Once the host is back, the same command resumes from step 1 and trains step 2; then a host is lost
    # while step 2's checkpoint is being written.
    cluster.restart(seen["node"])
    with cluster.job(command, folder / "resumed.log") as job:
        wait_for(lambda: (folder / "paused").exists(), job, folder / "resumed.log")
        # The job's log comes a moment after its lines were written
        placement = wait_for(
            lambda: PLACEMENT.search((folder / "resumed.log").read_text()), job, folder / "resumed.log"
        )
        seen["paused metrics"] = metrics(run_dir)  # step 2's records are written before its checkpoint
        driver, *actor_ranks, _ = placement.groups()
        rank = max(rank for rank, node in enumerate(actor_ranks) if node != driver)  # a rank on a worker host
        seen["second rank"], seen["second node"] = rank, actor_ranks[rank]
        _, seen["resumed"] = lose_the_host(cluster, actor_ranks[rank], job, folder / "resumed.log", then=folder / "go")
    torn = layout.partial_dir(run_dir, 2)
    seen["torn"] = torn.is_dir() and not layout.is_checkpoint(torn)  # begun, never committed
    seen["after the second loss"] = checkpoints(run_dir)

    cluster.restart(actor_ranks[rank])
    seen["resumed again"] = cluster.submit(command, folder / "resumed_again.log")
    seen["at the end"], seen["torn at the end"] = checkpoints(run_dir), torn.exists()
    return seen


def checkpoints(run_dir: Path) -> tuple[list[int], Path | None, list[str]]:
    """The steps of the committed checkpoints, the latest's folder, the writes under way (.partial folders)."""
    partial = sorted(path.name for path in layout.checkpoints_dir(run_dir).glob(".*.partial"))
    return layout.committed_steps(run_dir), layout.latest(run_dir), partial


def test_grpo_with_its_ranks_on_two_hosts_and_the_rollout_on_a_third_ends_equal_to_the_one_host_run(
    cluster, host_losses, one_host
):
    """The run that loses two hosts: where its ranks ran, and its metrics at its end, after the two losses
    and resumes, those of the same run on one host, bit for bit. Its steps 0 and 1 are its first job's,
    which ran on the three hosts uninterrupted until step 2 (records after the last checkpoint are dropped
    on resume), its step 2 the last job's, resumed from step 1's checkpoint on them."""
    log = host_losses["killed"]
    head = cluster.head_node()
    assert f"joined the Ray cluster at {head['address']}:{cluster.gcs_port} (3 CPUs" in log
    placement = PLACEMENT.search(log)
    assert placement and "reward in the driver" in log, log[-4000:]
    driver, rank_0, rank_1, rollout = placement.groups()
    assert driver == head["name"]  # a job's driver runs on the head
    # One host each: in namespaces three addresses, on raylets (one address) three node ids
    assert sorted([rank_0, rank_1, rollout]) == sorted(host_losses["ids"])
    finished = host_losses["resumed again"]
    assert finished.returncode == 0 and "succeeded" in finished.stdout, finished.stdout[-4000:]
    assert metrics(host_losses["run_dir"]) == metrics(one_host_run(one_host))


def test_the_hosts_have_networks_of_their_own(cluster, host_losses):
    """What only network namespaces show: the ranks' gloo group and Ray's traffic crossed between
    network stacks, one address per host (each rank bound gloo to its own node's interface,
    GLOO_SOCKET_IFNAME). On raylets the nodes share this machine's network and address."""
    if isinstance(cluster.hosts, Raylets):
        pytest.skip(
            f"{cluster.hosts.reason}: the three Ray nodes share this machine's network, so nothing here "
            "crossed between hosts' networks; the other tests check three node ids instead of three addresses"
        )
    _, rank_0, rank_1, rollout = PLACEMENT.search(host_losses["killed"]).groups()
    assert sorted([rank_0, rank_1, rollout]) == [host.address for host in cluster.hosts]


def test_a_host_lost_mid_step_then_one_lost_in_a_checkpoint_each_stop_the_run_and_the_same_command_resumes(
    host_losses, one_host
):
    """The run of host_losses: each loss stops it naming the lost rank and its node, the same command is
    refused while a host is missing, and resumes from step 1's checkpoint once it is back."""
    seen, run_dir = host_losses, host_losses["run_dir"]
    step_1 = layout.step_dir(run_dir, 1)
    # Where the labels pinned them, by node id: the actor's ranks on hosts 2 and 3, the rollout on host 1
    _, rank_0, rank_1, rollout = PLACEMENT.search(seen["killed"]).groups()
    ids, hosts = seen["ids"], seen["hosts"]
    assert sorted([ids[rank_0], ids[rank_1]]) == sorted(hosts[1:]) and ids[rollout] == hosts[0]
    assert seen["node_id"] in hosts[1:]  # the lost host is one the actor is pinned to

    # A host lost in the middle of step 2
    log, rank, node = seen["killed"], seen["rank"], seen["node"]
    assert f"roll-train: worker failure: actor rank {rank} died during train_step at step 2 on node {node}\n" in log, (
        log[-4000:]
    )
    assert seen["after the first loss"] == ([1], step_1, [])  # no write was under way

    # On the hosts that remain, the same command is refused at once, and changes nothing
    remaining = seen["remaining"]
    assert remaining.returncode != 0
    assert (
        "roll-train: config error: workers.actor_cpus: the workers reserve 3 CPUs (workers.actor_cpus 1 × workers.actor_dp 2 + "
        "workers.rollout_cpus 1) but the cluster has 2; lower them"
    ) in remaining.stdout, remaining.stdout[-3000:]
    assert seen["after the refusal"][0] == [1]

    # Once the host is back it resumes from step 1 and trains step 2 as the one-host run did, then loses a
    # host while step 2's checkpoint is being written
    assert seen["paused metrics"] == metrics(one_host_run(one_host))
    log, rank, node = seen["resumed"], seen["second rank"], seen["second node"]
    assert f"resumed from {step_1} (step 1)" in log
    assert (
        f"roll-train: worker failure: actor rank {rank} died during save_checkpoint at the checkpoint of step 2 "
        f"on node {node}\n"
    ) in log, log[-4000:]
    assert seen["torn"]  # step 2's checkpoint begun, never committed
    assert seen["after the second loss"][:2] == ([1], step_1)

    resumed = seen["resumed again"]
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert f"resumed from {step_1} (step 1)" in resumed.stdout
    assert (
        "resume: dropped the records of step 2 that the previous run logged after checkpoint step_1" in resumed.stdout
    )
    assert metrics(run_dir) == metrics(one_host_run(one_host))
    assert seen["at the end"][0] == [1, 2] and not seen["torn at the end"]  # the next write of step 2 replaced it


def lose_the_host(cluster: RayCluster, node: str, job: Job, log: Path, then: Path | None = None):
    """Kill the host at `node` (then create the file `then`, if given) and wait for the job: it fails
    within seconds, and no worker of it is left on any host. Returns (the kill's time.monotonic(), the
    job's log)."""
    killed = cluster.kill(node)
    if then is not None:
        then.touch()
    job.wait(timeout=120)
    stopped_s = time.monotonic() - killed
    print(f"{log.parent.name}: host {node} killed; the job ended {stopped_s:.1f} s later")
    assert job.returncode != 0, log.read_text()[-4000:]
    assert stopped_s < 30, stopped_s  # the driver names the loss within seconds; Ray's job ends a few seconds later
    assert not cluster.workers_left()  # the ranks on hosts still up went with the job: none waits on
    return killed, log.read_text()


def wait_for(found, job: Job, log: Path, timeout: float = 180):
    """found()'s first true answer, while the job runs."""
    deadline = time.monotonic() + timeout
    while not (answer := found()):
        assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.1)
    time.sleep(0.2)  # a mark is written before its file is closed
    return answer


def metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [0, 1, 2]
    return [{key: value for key, value in record.items() if not TIMING.search(key)} for record in records]
