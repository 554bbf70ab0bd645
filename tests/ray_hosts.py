"""A Ray cluster on tests/hosts.py's hosts, for tests: the head in host 1, a worker node in each other
host, one CPU each, token authentication on. Jobs go in with `ray job submit` from this process's
namespace (outside the cluster, over the bridge). A worker host can be killed (every process in its
namespace, SIGKILL: its raylet, its workers, the `ray start` that started them) and started again.

    with hosts_or_skip(3) as hosts:
        cluster = RayCluster(hosts, folder)   # up, three nodes alive
        ...
    cluster.assert_gone()                     # after the hosts closed: no process of its nodes is left
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hosts import Host, Hosts

BIN = Path(sys.executable).parent
NODE_OPTIONS = ["--block", "--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats"]


class RayCluster:
    def __init__(self, hosts: Hosts, folder: Path):
        self.hosts, self.folder = hosts, folder
        token = folder / "ray_auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.token = token.read_text()
        self.env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
        self.temp_dirs: list[str] = []  # one per node started (a restarted host gets a new one)
        self.head = hosts[0]
        self.dashboard = f"http://{self.head.address}:8265"
        try:
            for host in hosts:  # the worker nodes wait for the head's GCS
                self.start_node(host)
            self.wait_for_nodes(len(hosts.hosts))
        except BaseException:
            hosts.close()  # the nodes' processes first: they hold files in their temp dirs
            self.remove_temp_dirs()
            raise

    def start_node(self, host: Host) -> None:
        """`ray start` in `host`: the head in host 1, a worker node joining it elsewhere. Ray's default
        ports: each host has its own."""
        number = self.hosts.hosts.index(host) + 1
        # Short: Ray's socket paths live in it
        self.temp_dirs.append(tempfile.mkdtemp(prefix=f"rl{os.getpid()}h{number}-", dir="/tmp"))
        if host is self.head:
            role = ["--head", "--port=6379", f"--dashboard-host={host.address}"]
        else:
            role = [f"--address={self.head.address}:6379"]
        host.start(
            [
                str(BIN / "ray"),
                "start",
                *role,
                f"--node-ip-address={host.address}",
                f"--temp-dir={self.temp_dirs[-1]}",
                *NODE_OPTIONS,
            ],
            self.folder / f"host{number}.log",
            self.env,
        )

    def wait_for_nodes(self, count: int, timeout: float = 120) -> None:
        """Until `count` nodes are alive, one per host address."""
        start = time.monotonic()
        while len(found := self.alive_nodes()) < count:
            exited = [
                number for number, host in enumerate(self.hosts, start=1) if host.processes[-1].poll() is not None
            ]
            assert not exited and time.monotonic() - start < timeout, (
                f"{len(found)} of {count} Ray nodes up after {time.monotonic() - start:.0f} s ({found}); `ray start` "
                f"exited in hosts {exited}; host1.log: {(self.folder / 'host1.log').read_text()[-2000:]}"
            )
            time.sleep(1)

    def alive_nodes(self) -> dict[str, str]:
        """{node address: node id} of the nodes the head's dashboard counts alive ({} while it is not
        up). Without the token it answers 401: token authentication is on."""
        url = f"{self.dashboard}/nodes?view=summary"
        try:
            urllib.request.urlopen(url, timeout=5)
            raise AssertionError("the dashboard answered a request without the token")
        except urllib.error.HTTPError as refused:
            assert refused.code == 401, refused
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return {}
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            summary = json.load(answer)["data"]["summary"]
        return {
            node["raylet"]["nodeManagerAddress"]: node["raylet"]["nodeId"]
            for node in summary
            if node["raylet"]["state"] == "ALIVE"
        }

    def kill(self, address: str) -> float:
        """SIGKILL every process of the worker host at `address` (its raylet, its workers, its `ray
        start`), as a machine that loses power; returns time.monotonic() of the kill."""
        host = next(host for host in self.hosts if host.address == address)
        assert host is not self.head, "the head holds the GCS and the job's driver: these tests lose a worker host"
        killed = deadline = time.monotonic()
        deadline += 30
        while (pids := host.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        assert not pids, f"processes of {address} still running after SIGKILL: {pids}"
        for process in host.processes:
            process.wait(timeout=10)
        return killed

    def wait_until_dead(self, address: str) -> float:
        """Until the head counts the node at `address` dead (Ray's health checks of its raylet have
        failed); returns time.monotonic() then."""
        deadline = time.monotonic() + 120
        while address in self.alive_nodes():
            assert time.monotonic() < deadline, f"the head still counts {address}'s killed node alive"
            time.sleep(0.5)
        return time.monotonic()

    def restart(self, address: str) -> None:
        """`ray start` again in the host at `address`, once the head knows its old node is dead."""
        self.wait_until_dead(address)
        self.start_node(next(host for host in self.hosts if host.address == address))
        self.wait_for_nodes(len(self.hosts.hosts))

    def restart_lost(self) -> None:
        """Start again the nodes of the hosts whose `ray start` has exited."""
        for host in self.hosts:
            if host.processes[-1].poll() is not None:
                self.restart(host.address)

    def workers_left(self, wait_s: float = 10) -> list[str]:
        """The Ray actors of roll_lite still running on any host after up to `wait_s` (their processes
        are named ray::<class>; Ray kills a job's actors once its driver has exited)."""
        deadline = time.monotonic() + wait_s
        while (found := self._workers()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return found

    def _workers(self) -> list[str]:
        found = []
        for host in self.hosts:
            for pid in host.pids():
                try:
                    name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
                except OSError:
                    continue
                if name.startswith(("ray::ModelWorker", "ray::RolloutWorker", "ray::RewardWorker")):
                    found.append(f"{host.address}: {name}")
        return found

    def command(self, args: list[str]) -> list[str]:
        return [str(BIN / "ray"), "job", "submit", "--address", self.dashboard, "--", *args]

    def submit(self, args: list[str], log: Path) -> subprocess.CompletedProcess:
        """`args` as a job; waits for its end (its output: the job's log)."""
        for _ in range(12):  # the head's job agent can come up seconds after its dashboard
            submitted = subprocess.run(self.command(args), capture_output=True, text=True, timeout=300, env=self.env)
            if "No available agent to submit job" not in submitted.stderr:
                break
            time.sleep(2)
        log.write_text(submitted.stdout + submitted.stderr)
        return submitted

    @contextmanager
    def job(self, args: list[str], log: Path) -> Iterator[subprocess.Popen]:
        """`args` as a job, in the background: `ray job submit` follows the job's log into `log` and
        exits when the job ends. A job still running when the block ends (a test failed) is stopped."""
        submission = f"test-{secrets.token_hex(4)}"
        command = self.command(args)
        command.insert(command.index("--"), f"--submission-id={submission}")
        with log.open("w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        try:
            yield process
        finally:
            if process.poll() is None:
                subprocess.run(
                    [str(BIN / "ray"), "job", "stop", "--address", self.dashboard, submission],
                    capture_output=True,
                    timeout=120,
                    env=self.env,
                )
                process.kill()
                process.wait()

    def processes_left(self) -> list[str]:
        """The processes still running whose command line names one of the nodes' temp dirs (Ray's GCS,
        raylets and agents do)."""
        listed = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
        return [line for line in listed if any(folder in line for folder in self.temp_dirs)]

    def remove_temp_dirs(self) -> None:
        for folder in self.temp_dirs:
            shutil.rmtree(folder, ignore_errors=True)
