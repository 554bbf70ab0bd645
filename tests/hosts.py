"""Several "hosts" on this machine for tests: Linux network namespaces, each with an address of its own
on a private subnet, joined by veth pairs to a bridge in the default namespace. The bridge has an
address too, so this process (in the default namespace) reaches every host, as a client outside the
cluster would. Nothing routes further: the namespaces have no default route and the subnet is
10.77.N.0/24, so their traffic goes to their own loopback or to one another.

    with Hosts(3) as hosts:
        hosts[0].start(["python", "-m", "http.server", "--bind", hosts[0].address])
        ...   # every process started in the namespaces is killed, and every namespace, veth and the
              # bridge removed, when the block ends, whatever happened in it

Needs root and iproute2 (`ip`); where either is missing, or the kernel refuses a namespace, entering
raises NoNamespaces with the reason (tests/raylets.py's `hosts_or_raylets` then makes hosts of another
kind). Names carry this process's pid, so two pytest processes (the suite runs `-n 2`) never share one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SUBNETS = "10.77.{}.0/24"  # private; the third number is picked free on this machine
# Held while a subnet is picked and the bridge takes its address: two runs at once pick different ones.
SUBNET_LOCK = Path("/tmp/roll-lite-hosts.lock")


class NoNamespaces(Exception):
    """This machine cannot make network namespaces here; the message says why."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


@dataclass
class Host:
    namespace: str
    address: str
    veth: str  # the end in the default namespace, on the bridge (the other is "eth0" in the namespace)
    processes: list[subprocess.Popen] = field(default_factory=list)

    def command(self, args: list[str]) -> list[str]:
        """`args` run in this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def start(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start `args` in this host, in a session of its own, output to `log`; stopped when Hosts exits."""
        with log.open("ab") as out:
            process = subprocess.Popen(
                self.command(args), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.processes.append(process)
        return process

    def pids(self) -> list[int]:
        """Every process in this host's namespace (ours alone: we made it)."""
        found = ip("netns", "pids", self.namespace, check=False).stdout.split()
        return [int(pid) for pid in found]

    def running(self) -> bool:
        """Whether the last process started is running."""
        return self.processes[-1].poll() is None

    def failed(self) -> bool:
        """Whether the last process started has exited with an error."""
        return self.processes[-1].poll() not in (None, 0)


class Hosts:
    shared_network = False  # each host has a network stack of its own: the same port in each is no clash

    def __init__(self, count: int):
        self.count = count
        self.tag = f"rl{os.getpid()}"  # interface names have 15 characters at most: "rl" + pid + "h1"
        self.bridge = f"{self.tag}br"
        self.hosts: list[Host] = []
        self.bridge_made = False
        self.outside_address = ""  # the default namespace's address on the bridge

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __enter__(self) -> Hosts:
        check_namespaces_possible()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _create(self) -> None:
        first = f"{self.tag}-h1"
        made = ip("netns", "add", first, check=False)
        if made.returncode != 0:
            raise NoNamespaces(f"`ip netns add {first}` failed: {made.stderr.strip()}")
        self.hosts.append(Host(first, "", f"{self.tag}h1"))
        self.hosts += [Host(f"{self.tag}-h{i}", "", f"{self.tag}h{i}") for i in range(2, self.count + 1)]
        for host in self.hosts[1:]:
            ip("netns", "add", host.namespace)
        with SUBNET_LOCK.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            prefix = free_subnet_prefix()
            ip("link", "add", self.bridge, "type", "bridge")
            self.bridge_made = True
            self.outside_address = f"{prefix}.254"
            ip("addr", "add", f"{self.outside_address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for number, host in enumerate(self.hosts, start=1):
            host.address = f"{prefix}.{number}"
            ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
            ip("link", "set", host.veth, "master", self.bridge)
            ip("link", "set", host.veth, "up")
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            ip("-n", host.namespace, "link", "set", "eth0", "up")
            ip("-n", host.namespace, "link", "set", "lo", "up")

    def close(self) -> None:
        """Stop every process in the hosts, then remove the veths, the bridge and the namespaces.
        Raises at the end, naming what is left, if anything could not be removed."""
        for host in self.hosts:  # SIGTERM first, to those still running
            for process in host.processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for host in self.hosts:
            for process in host.processes:
                try:
                    process.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    pass
        for _ in range(20):  # whatever is still running in a namespace, the workers of a process too
            remaining = [pid for host in self.hosts for pid in host.pids()]
            if not remaining:
                break
            for pid in remaining:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.25)
        for host in self.hosts:
            for process in host.processes:
                if process.poll() is None:  # killed above: collect it
                    process.wait(timeout=10)
        problems = []
        for host in self.hosts:
            # The veth first: a namespace is removed asynchronously, its end of the pair with it.
            if ip("link", "show", host.veth, check=False).returncode == 0:
                problems += [ip("link", "del", host.veth, check=False).stderr.strip()]
            problems += [ip("netns", "del", host.namespace, check=False).stderr.strip()]
        if self.bridge_made:
            problems += [ip("link", "del", self.bridge, check=False).stderr.strip()]
            self.bridge_made = False
        left = self.leftovers()
        if left:
            raise RuntimeError(f"hosts not removed: {left}; ip said: {[p for p in problems if p]}")

    def leftovers(self) -> list[str]:
        """Those of our namespaces and interfaces that still exist."""
        namespaces = {line.split()[0] for line in ip("netns", "list").stdout.splitlines()}
        links = {line.split()[0].split("@")[0] for line in ip("-br", "link").stdout.splitlines()}
        ours = [name for host in self.hosts for name in (host.namespace, host.veth)] + [self.bridge]
        return [name for name in ours if name in namespaces | links]


def check_namespaces_possible() -> None:
    if os.geteuid() != 0:
        raise NoNamespaces(f"network namespaces need root; this is uid {os.geteuid()}")
    if shutil.which("ip") is None:
        raise NoNamespaces("network namespaces need iproute2's `ip`, which is not on PATH")


def free_subnet_prefix() -> str:
    """ "10.77.N" for an N no interface of this machine has an address in (tried from this pid on)."""
    taken = ip("-4", "-o", "addr", "show").stdout
    for offset in range(250):
        prefix = f"10.77.{(os.getpid() + offset) % 250 + 1}"
        if f" {prefix}." not in taken:
            return prefix
    raise RuntimeError(f"no free subnet {SUBNETS.format('N')} on this machine")
