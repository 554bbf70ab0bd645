"""A Ray cluster on tests/hosts.py's hosts (or tests/raylets.py's), for tests: the head in host 1, a
worker node in each other host, one CPU each (or `cpus`), token authentication on, each node without what
the tests do not use (tests/lean_ray_start.py) and, on namespace hosts, with its Python workers forked
from a zygote in its host (tests/host_zygote.py, tests/host_launcher.py). Jobs go in through the head's
job API, as `ray job submit` sends them, from this process (outside the cluster: over the bridge, or on
this machine's network). A worker host can be killed (every process in its namespace or sessions,
SIGKILL: its raylet, its agents, its workers and their zygote) and started again. Nodes go by the names
roll-train's log gives them (workers/cluster.py node_names): their addresses, with the start of their ids
where they share one.
`labels` gives each host's node its Ray node labels (`ray start --labels`), again when it restarts.

    with hosts_or_raylets(3) as hosts:
        cluster = RayCluster(hosts, folder, labels=[{"zone": "a"}, {}, {}])   # up, three nodes alive
        ...
    cluster.remove_temp_dirs()
    assert not cluster.processes_left()       # after the hosts closed: no process of its nodes is left
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import warm_workers
from hosts import Host, Hosts
from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR
from ray.job_submission import JobStatus, JobSubmissionClient
from raylets import TESTS, Raylet, Raylets, ray_start, warm, zygote_socket
from roll_lite.workers.cluster import node_names

from roll_lite.strategy.distributed import free_port

BIN = Path(sys.executable).parent
# No log monitor: it streams the workers' log files to their drivers (~1-5 s of CPU a node), and what the
# tests read is the drivers' own output (a job's log comes from its driver's file, not from the monitor)
NODE_OPTIONS = ["--object-store-memory=100000000", "--disable-usage-stats", "--include-log-monitor=false"]
# The head's: no autoscaler monitor (nothing to scale); no idle workers started ahead for a job's driver (its
# workers are actors, each started when made), no Ray metrics (nothing reads them): the GCS gives every
# node the system config. What workers/cluster.py spares a local cluster.
HEAD_OPTIONS = [
    "--no-monitor",
    '--system-config={"prestart_worker_first_driver":false,"enable_metrics_collection":false}',
]
# Ray's name for the variable that names the worker_process_setup_hook; the launchers have it without Ray
assert warm_workers.SETUP_HOOK_VARIABLE == WORKER_PROCESS_SETUP_HOOK_ENV_VAR


class RayCluster:
    def __init__(self, hosts: Hosts | Raylets, folder: Path, labels: list[dict[str, str]] | None = None, cpus: int = 1):
        self.hosts, self.folder, self.cpus = hosts, folder, cpus  # cpus: each node's
        self.labels = labels or [{} for _ in hosts.hosts]  # host i's node labels
        token = folder / "ray_auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.token = token.read_text()
        self.env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
        self.temp_dirs: list[str] = []  # one per node started (a restarted host gets a new one), its zygote's
        self.host_of: dict[str, Host | Raylet] = {}  # temp dir -> the host of its node
        self.killed: dict[str, Host | Raylet] = {}  # node name -> its host, until restart()
        self._jobs: JobSubmissionClient | None = None
        self.head = hosts[0]
        # Ray's default ports where each host has its own; never on a shared network, where another
        # test's cluster may hold them
        self.gcs_port, self.dashboard_port = (free_port(), free_port()) if hosts.shared_network else (6379, 8265)
        self.dashboard = f"http://{self.head.address}:{self.dashboard_port}"
        try:
            for host in hosts:  # the worker nodes wait for the head's GCS
                self.start_node(host)
            self.wait_for_nodes(len(hosts.hosts))
        except BaseException:
            hosts.close()  # the nodes' processes first: they hold files in their temp dirs
            self.remove_temp_dirs()
            raise

    def start_node(self, host: Host | Raylet) -> None:
        """`ray start` in `host`: the head in host 1, a worker node joining it elsewhere."""
        number = self.hosts.hosts.index(host) + 1
        # Short: Ray's socket paths live in it
        self.temp_dirs.append(tempfile.mkdtemp(prefix=f"rl{os.getpid()}h{number}-", dir="/tmp"))
        self.host_of[self.temp_dirs[-1]] = host
        if host is self.head:
            role = ["--head", f"--port={self.gcs_port}", f"--dashboard-port={self.dashboard_port}"]
            role += [f"--dashboard-host={host.address}", *HEAD_OPTIONS]
        else:
            role = [f"--address={self.head.address}:{self.gcs_port}"]
        if self.labels[number - 1]:
            role += ["--labels=" + ",".join(f"{key}={value}" for key, value in self.labels[number - 1].items())]
        if self.hosts.shared_network:  # Ray's other default ports: free ones (0: any)
            role += [f"--dashboard-agent-listen-port={free_port()}", "--min-worker-port=0", "--max-worker-port=0"]
        command, hook = ray_start(
            [
                *role,
                f"--node-ip-address={host.address}",  # Ray takes this machine's address for 127.0.0.1
                f"--temp-dir={self.temp_dirs[-1]}",
                f"--num-cpus={self.cpus}",
                *NODE_OPTIONS,
            ],
            agent=host is self.head,  # its job agent runs the jobs
        )
        log = self.folder / f"host{number}.log"
        if warm() and not self.hosts.shared_network:
            # in namespaces only: a raylet host's forked workers would leave its sessions (warm_workers.py)
            hook.update(self.start_zygote(host, log), RAY_START_HOOK="__main__.with_forked_workers")
        host.start(command, log, {**self.env, **hook})

    def start_zygote(self, host: Host | Raylet, log: Path) -> dict[str, str]:
        """tests/host_zygote.py in `host`; the variables for its node's `ray start` once it is there."""
        written = Path(self.temp_dirs[-1], "workers_zygote")
        command = [sys.executable, str(TESTS / "host_zygote.py"), str(written)]
        zygote = host.start(command, log, self.env)
        socket_path = zygote_socket(zygote, written)
        self.temp_dirs.append(os.path.dirname(socket_path))  # left behind when its host is killed
        return {"ROLL_TEST_WARM_WORKERS": socket_path, "ROLL_TEST_SETUP_WORKER": str(TESTS / "host_launcher.py")}

    def wait_for_nodes(self, count: int, timeout: float = 120) -> None:
        """Until `count` nodes are alive."""
        start = time.monotonic()
        while len(found := self.alive_nodes()) < count:
            failed = [number for number, host in enumerate(self.hosts, start=1) if host.failed()]
            assert not failed and time.monotonic() - start < timeout, (
                f"{len(found)} of {count} Ray nodes up after {time.monotonic() - start:.0f} s ({found}); `ray start` "
                f"failed in hosts {failed}; host1.log: {(self.folder / 'host1.log').read_text()[-2000:]}"
            )
            time.sleep(1)

    def nodes(self) -> list[dict]:
        """The nodes the head's dashboard counts alive ([] while it is not up), each a dict: name (as
        roll-train's log names it), id, address, temp_dir, head. Without the token the dashboard answers
        401: token authentication is on."""
        url = f"{self.dashboard}/nodes?view=summary"
        try:
            urllib.request.urlopen(url, timeout=5)
            raise AssertionError("the dashboard answered a request without the token")
        except urllib.error.HTTPError as refused:
            assert refused.code == 401, refused
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return []
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            summary = json.load(answer)["data"]["summary"]
        alive = [node["raylet"] for node in summary if node["raylet"]["state"] == "ALIVE"]
        names = node_names([(node["nodeId"], node["nodeManagerAddress"]) for node in alive])
        return [
            dict(
                name=names[node["nodeId"]],
                id=node["nodeId"],
                address=node["nodeManagerAddress"],
                temp_dir=node["tempDir"],
                head=node["isHeadNode"],
            )
            for node in alive
        ]

    def alive_nodes(self) -> dict[str, str]:
        """{node name: node id} of the nodes alive."""
        return {node["name"]: node["id"] for node in self.nodes()}

    def head_node(self) -> dict:
        return next(node for node in self.nodes() if node["head"])

    def node_of_host(self, number: int) -> dict:
        """The alive node of host `number` (1: the head's)."""
        host = self.hosts.hosts[number - 1]
        return next(node for node in self.nodes() if self.host_of.get(node["temp_dir"]) is host)

    def kill(self, name: str) -> float:
        """SIGKILL every process of the worker host of the node `name` (its raylet, its agents, its workers),
        as a machine that loses power; returns time.monotonic() of the kill."""
        host = self.host_of[next(node["temp_dir"] for node in self.nodes() if node["name"] == name)]
        assert host is not self.head, "the head holds the GCS and the job's driver: these tests lose a worker host"
        self.killed[name] = host
        return self._kill_all(host)

    def _kill_all(self, host: Host | Raylet) -> float:
        killed = deadline = time.monotonic()
        deadline += 30
        while (pids := host.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        assert not pids, f"processes of host {self.hosts.hosts.index(host) + 1} still running after SIGKILL: {pids}"
        for process in host.processes:
            process.wait(timeout=10)
        return killed

    def wait_until_dead(self, name: str) -> float:
        """Until the head counts the node `name` dead (Ray's health checks of its raylet have failed);
        returns time.monotonic() then."""
        deadline = time.monotonic() + 120
        while name in self.alive_nodes():
            assert time.monotonic() < deadline, f"the head still counts the killed node {name} alive"
            time.sleep(0.5)
        return time.monotonic()

    def restart(self, name: str) -> None:
        """`ray start` again in the host of the killed node `name`, once the head knows that node is dead."""
        self.wait_until_dead(name)
        self.start_node(self.killed.pop(name))
        self.wait_for_nodes(len(self.hosts.hosts))

    def workers_left(self, wait_s: float = 10) -> list[str]:
        """The Ray actors of roll_lite still running on any host after up to `wait_s` (their processes
        are named ray::<class>; Ray kills a job's actors once its driver has exited)."""
        deadline = time.monotonic() + wait_s
        while (found := self._workers()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return found

    def _workers(self) -> list[str]:
        found = []
        for number, host in enumerate(self.hosts, start=1):
            for pid in host.pids():
                try:
                    name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
                except OSError:
                    continue
                if name.startswith(("ray::ModelWorker", "ray::RolloutWorker", "ray::RewardWorker")):
                    found.append(f"host {number}: {name}")
        return found

    def submit(self, args: list[str], log: Path) -> subprocess.CompletedProcess:
        """`args` as a job; waits for its end (its output: the job's log, then a line with how it ended;
        returncode 0 when it succeeded, as `ray job submit`'s)."""
        job = Job(self.jobs(), args, log)
        job.wait(timeout=300)
        return subprocess.CompletedProcess(args, job.returncode, log.read_text(), "")

    @contextmanager
    def job(self, args: list[str], log: Path) -> Iterator[Job]:
        """`args` as a job, in the background: its log followed into `log` until it ends. A job still
        running when the block ends (a test failed) is stopped."""
        job = Job(self.jobs(), args, log)
        try:
            yield job
        finally:
            if job.poll() is None:
                job.client.stop_job(job.id)
                job.wait(timeout=120)

    def jobs(self) -> JobSubmissionClient:
        """A client of the head's job API: what `ray job submit` sends (the CLI's own process, ~1.5 s of
        CPU a job, spared), over the same HTTP, with the token."""
        if self._jobs is None:
            # plain HTTP: no TLS to verify (verify=True's ssl=None is deprecated by aiohttp, a warning a job)
            token = {"Authorization": f"Bearer {self.token}"}
            self._jobs = JobSubmissionClient(self.dashboard, headers=token, verify=False)
            logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)  # not a line at each job's end
        return self._jobs

    def processes_left(self) -> list[str]:
        """The processes still running whose command line names one of the nodes' temp dirs (Ray's GCS,
        raylets and agents do)."""
        listed = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
        return [line for line in listed if any(folder in line for folder in self.temp_dirs)]

    def remove_temp_dirs(self) -> None:
        for folder in self.temp_dirs:
            shutil.rmtree(folder, ignore_errors=True)


class Job:
    """A job submitted from this process with Ray's job API (outside the cluster: over the bridge, or on
    this machine's network) and its log followed into a file, as `ray job submit` submits and follows it;
    like a subprocess.Popen of that command: poll(), wait(), returncode (0 when the job succeeded)."""

    def __init__(self, client: JobSubmissionClient, args: list[str], log: Path):
        self.client, self.log, self.returncode = client, log, None
        self.id = f"test-{secrets.token_hex(4)}"
        for attempt in range(12):  # the head's job agent can come up seconds after its dashboard
            try:
                client.submit_job(entrypoint=shlex.join(args), submission_id=self.id)
                break
            except RuntimeError as error:
                if "No available agent to submit job" not in str(error) or attempt == 11:
                    raise
                time.sleep(2)
        self.follower = threading.Thread(target=self._follow, daemon=True)
        self.follower.start()

    def _follow(self) -> None:
        status = "not known"
        with self.log.open("w") as out:
            try:
                asyncio.run(self._tail(out))
                while (status := self.client.get_job_status(self.id)) not in ENDED:
                    time.sleep(0.2)
                out.write(f"Job '{self.id}' {status.value.lower()}\n")
            except Exception as error:  # the returncode tells the test; the log, why
                out.write(f"following job {self.id} failed: {error!r}\n")
        self.returncode = 0 if status == JobStatus.SUCCEEDED else 1

    async def _tail(self, out: IO[str]) -> None:
        async for lines in self.client.tail_job_logs(self.id):
            out.write(lines)
            out.flush()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.follower.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"job {self.id}", timeout or 0)
        return self.returncode


ENDED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)
