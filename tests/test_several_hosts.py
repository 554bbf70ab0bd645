"""A Ray cluster over three hosts (network namespaces, tests/hosts.py): the head in host 1, a worker
node in hosts 2 and 3, token authentication on. `ray job submit` from outside the hosts (this
process's namespace, over the bridge) runs GRPO with the actor's two FSDP2 ranks on two hosts and
the rollout worker on the third; its metrics equal those of the same run on one host, bit for bit."""

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from hosts import Hosts, hosts_or_skip
from test_pipeline_ray import REPO, SMALL

BIN = Path(sys.executable).parent
# Each host has one CPU and each actor rank and the rollout worker reserve one, so the actor's
# placement group (workers.placement=spread) takes two hosts and the rollout worker the third.
ONE_CPU_EACH = ["workers.actor_cpus=1", "workers.rollout_cpus=1"]
# The same run on this machine's two CPUs. What a worker reserves of Ray's CPUs changes where it runs,
# not what it computes: each one computes with workers.torch_threads=1 either way.
HALF_A_CPU_EACH = ["workers.actor_cpus=0.5", "workers.rollout_cpus=0.5"]
GRPO = [*SMALL, "rollout.prompts_per_step=2", "rollout.num_samples=4", "steps=2", "eval_every=2", "save_model=false",
        "checkpoint.enabled=false", "algorithm.track_kl=false",  # no reference model: cheaper, same proof
        "workers.actor_dp=2", "workers.placement=spread"]
# Timings and memory figures: they follow the machine's load, and no two runs share them.
TIMING = re.compile(r"^perf/|_per_s$|_s$|memory")


def test_grpo_with_its_ranks_on_two_hosts_and_the_rollout_on_a_third_equals_the_one_host_run(tmp_path):
    data = tiny_data(tmp_path)
    token = tmp_path / "ray_auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    temp_dirs = [tempfile.mkdtemp(prefix=f"rl{os.getpid()}h{i}-", dir="/tmp") for i in (1, 2, 3)]  # short: Ray's socket paths
    try:
        with hosts_or_skip(3) as hosts:
            # The one-host run goes on meanwhile: its own local Ray cluster, in this namespace.
            with (tmp_path / "one_host.log").open("w") as log:
                one_host = subprocess.Popen([str(BIN / "roll-train"), "--config", str(REPO / "configs/grpo.yaml"), *GRPO,
                                             *HALF_A_CPU_EACH, *data, f"output_dir={tmp_path}", "run_name=one_host"],
                                            stdout=subprocess.DEVNULL, stderr=log, cwd=tmp_path)
            try:
                dashboard = start_cluster(hosts, env, temp_dirs, tmp_path)
                submitted = submit(dashboard, env, [str(BIN / "roll-train"), "--config", str(REPO / "configs/grpo.yaml"),
                                                    *GRPO, *ONE_CPU_EACH, *data, f"output_dir={tmp_path}",
                                                    "run_name=three_hosts"], tmp_path / "three_hosts.log")
            except BaseException:
                one_host.terminate()  # roll-train stops its local cluster on SIGTERM
                raise
            finally:
                one_host.wait(timeout=300)
            addresses = [host.address for host in hosts]
        assert hosts.leftovers() == []
        assert not ray_processes_in(temp_dirs)
    finally:
        for folder in temp_dirs:
            shutil.rmtree(folder, ignore_errors=True)

    assert one_host.returncode == 0, (tmp_path / "one_host.log").read_text()[-3000:]
    assert submitted.returncode == 0 and "succeeded" in submitted.stdout, submitted.stdout[-4000:] + submitted.stderr[-2000:]
    assert f"joined the Ray cluster at {addresses[0]}:6379 (3 CPUs" in submitted.stdout
    placement = re.search(r"placement on 3 nodes: driver on (\S+); actor rank 0 on (\S+), rank 1 on (\S+); "
                          r"rollout on (\S+); reward in the driver", submitted.stdout)
    assert placement, submitted.stdout[-4000:]
    driver, rank_0, rank_1, rollout = placement.groups()
    assert driver == addresses[0]  # a job's driver runs on the head
    assert sorted([rank_0, rank_1, rollout]) == addresses  # one host each
    assert metrics(tmp_path / "three_hosts") == metrics(tmp_path / "one_host")


def tiny_data(tmp_path: Path) -> list[str]:
    overrides = []
    for split in ("train", "eval"):
        rows = (REPO / f"data/reverse_digits/{split}.jsonl").read_text().splitlines(keepends=True)[:8]
        (tmp_path / f"{split}.jsonl").write_text("".join(rows))
        overrides.append(f"data.{split}_files={tmp_path / f'{split}.jsonl'}")
    return overrides


def start_cluster(hosts: Hosts, env: dict[str, str], temp_dirs: list[str], logs: Path) -> str:
    """Ray's head in host 1, a worker node in each other host, one CPU each; returns the head's
    dashboard address once all three nodes are up. Ray's default ports: each host has its own."""
    head = hosts[0]
    common = ["--block", "--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats"]
    head.start([str(BIN / "ray"), "start", "--head", f"--node-ip-address={head.address}", "--port=6379",
                f"--dashboard-host={head.address}", f"--temp-dir={temp_dirs[0]}", *common], logs / "host1.log", env)
    for number, host in enumerate(hosts[1:], start=2):  # they wait for the head's GCS
        host.start([str(BIN / "ray"), "start", f"--address={head.address}:6379", f"--node-ip-address={host.address}",
                    f"--temp-dir={temp_dirs[number - 1]}", *common], logs / f"host{number}.log", env)
    dashboard = f"http://{head.address}:8265"
    deadline = time.monotonic() + 120
    while (found := alive_nodes(dashboard, Path(env["RAY_AUTH_TOKEN_PATH"]).read_text())) < 3:
        exited = [number for number, host in enumerate(hosts, start=1) if host.processes[0].poll() is not None]
        assert not exited and time.monotonic() < deadline, (
            f"{found} of 3 Ray nodes up after {120 - deadline + time.monotonic():.0f} s; `ray start` exited in hosts "
            f"{exited}; host1.log: {(logs / 'host1.log').read_text()[-2000:]}")
        time.sleep(1)
    return dashboard


def alive_nodes(dashboard: str, token: str) -> int:
    """How many nodes the head's dashboard counts alive (0 while it is not up). Without the token it
    answers 401: token authentication is on."""
    try:
        urllib.request.urlopen(f"{dashboard}/nodes?view=summary", timeout=5)
        raise AssertionError("the dashboard answered a request without the token")
    except urllib.error.HTTPError as refused:
        assert refused.code == 401, refused
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0
    request = urllib.request.Request(f"{dashboard}/nodes?view=summary", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        summary = json.load(answer)["data"]["summary"]
    return sum(node["raylet"]["state"] == "ALIVE" for node in summary)


def submit(dashboard: str, env: dict[str, str], command: list[str], log: Path) -> subprocess.CompletedProcess:
    for _ in range(12):  # the head's job agent can come up seconds after its dashboard
        submitted = subprocess.run([str(BIN / "ray"), "job", "submit", "--address", dashboard, "--", *command],
                                   capture_output=True, text=True, timeout=300, env=env)
        if "No available agent to submit job" not in submitted.stderr:
            break
        time.sleep(2)
    log.write_text(submitted.stdout + submitted.stderr)
    return submitted


def ray_processes_in(temp_dirs: list[str]) -> list[str]:
    """The processes still running whose command line names one of the nodes' temp dirs (Ray's GCS,
    raylets and agents do)."""
    listed = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in listed if any(folder in line for folder in temp_dirs)]


def metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [0, 1, 2]
    return [{key: value for key, value in record.items() if not TIMING.search(key)} for record in records]
