"""Several "hosts" on this machine without network namespaces, the stand-in for tests/hosts.py where
this machine cannot make them: each host is the session of processes that one command started (a
`ray start` and everything it starts, Ray's workers included, keep its session id). They share this
machine's network, so what runs on them needs ports of its own (tests/ray_hosts.py picks them free).

    with hosts_or_raylets(3) as hosts:   # Hosts(3), or Raylets(3) with a warning that says why
        hosts[0].start(["ray", "start", ...], log)
        ...   # every process of every host's sessions is killed when the block ends

ROLL_TEST_HOSTS=raylets asks for Raylets on a machine that can make namespaces.

Then, for Ray nodes on any hosts: `ray_start` (`ray start` without what a test's node does not use), and
a zygote of Ray workers (tests/host_zygote.py) for a host's node or, with `forked_workers`, for a local cluster that a
test starts in its own process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hosts import Hosts, NoNamespaces


@dataclass
class Raylet:
    """One host: the sessions of the processes started in it (a Ray node, its `ray start` the first)."""

    number: int
    processes: list[subprocess.Popen] = field(default_factory=list)
    address: str = "127.0.0.1"  # where a client on this machine reaches what listens on the host

    def start(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start `args` in a session of its own, output to `log`; stopped when Raylets exits."""
        with log.open("ab") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.processes.append(process)
        return process

    def pids(self) -> list[int]:
        """The live processes of this host's sessions. A session's id is the pid of the process that
        began it, ours: it is never reaped before its session is empty (running(), Raylets.close(),
        tests/ray_hosts.py's kill), so no other process can have taken that id meanwhile."""
        sessions = {process.pid for process in self.processes if process.returncode is None}
        return [pid for pid, (status, session) in processes().items() if session in sessions and status != "Z"]

    def running(self) -> bool:
        """Whether the last process started is running (an exited one stays unreaped: see pids())."""
        return self.processes[-1].returncode is None and state(self.processes[-1].pid) != "Z"

    def failed(self) -> bool:
        """Whether the last process started has exited with an error (read without reaping it)."""
        process = self.processes[-1]
        if process.returncode is not None:
            return process.returncode != 0
        exited = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return exited is not None and not (exited.si_code == os.CLD_EXITED and exited.si_status == 0)


class Raylets:
    """`count` Raylet hosts, with the same interface as Hosts."""

    shared_network = True

    def __init__(self, count: int, reason: str):
        self.hosts = [Raylet(number) for number in range(1, count + 1)]
        self.reason = reason  # why not network namespaces

    def __getitem__(self, index: int) -> Raylet:
        return self.hosts[index]

    def __iter__(self) -> Iterator[Raylet]:
        return iter(self.hosts)

    def __enter__(self) -> Raylets:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """SIGTERM to the processes the hosts started that still run, SIGKILL to whatever of their sessions
        is left after up to 30 s; then the processes are reaped."""
        started = [process for host in self.hosts for process in host.processes if process.returncode is None]
        for process in started:
            kill(process.pid, signal.SIGTERM)  # not Popen.send_signal: it reaps an exited process first
        deadline = time.monotonic() + 30
        while any(state(process.pid) != "Z" for process in started) and time.monotonic() < deadline:
            time.sleep(0.25)
        deadline = time.monotonic() + 10
        while (remaining := [pid for host in self.hosts for pid in host.pids()]) and time.monotonic() < deadline:
            for pid in remaining:
                kill(pid)
            time.sleep(0.25)
        for process in started:
            process.wait(timeout=10)
        if remaining:
            raise RuntimeError(f"processes of the raylet hosts still running after SIGKILL: {remaining}")

    def leftovers(self) -> list[str]:
        return []  # no namespace, interface or bridge was made


def processes() -> dict[int, tuple[str, int]]:
    """{pid: (state, session id)} of every process on this machine ("Z": exited, not reaped yet)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := read_stat(int(entry))):
            found[int(entry)] = (stat[0], int(stat[3]))
    return found


def state(pid: int) -> str:
    """A process's state; "Z" for one that has exited (or is gone)."""
    stat = read_stat(pid)
    return stat[0] if stat else "Z"


def read_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command: state, ppid, pgrp, session, ... ([] if gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rindex(")") + 2 :].split()  # the command may hold spaces and parentheses


def kill(pid: int, signal_number: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, signal_number)
    except ProcessLookupError:
        pass


@contextmanager
def hosts_or_raylets(count: int) -> Iterator[Hosts | Raylets]:
    """Hosts(count), network namespaces; or, where this machine cannot make them or ROLL_TEST_HOSTS=raylets
    asks for it, Raylets(count), with a pytest warning that says why (the reason is also in
    Raylets.reason, for the tests that check what only namespaces show)."""
    asked = os.environ.get("ROLL_TEST_HOSTS", "")
    if asked not in ("", "raylets"):
        raise ValueError(f"ROLL_TEST_HOSTS={asked}: leave it unset (network namespaces) or set it to raylets")
    reason = "ROLL_TEST_HOSTS=raylets asks for them" if asked else ""
    if not reason:
        hosts = Hosts(count)
        try:
            hosts.__enter__()
        except NoNamespaces as cannot:
            reason = f"no network namespaces here ({cannot})"
        else:
            try:
                yield hosts
            finally:
                hosts.close()
            return
    warnings.warn(
        pytest.PytestWarning(
            f"the {count} hosts are sessions of processes on this machine's network (tests/raylets.py), "
            f"not network namespaces: {reason}"
        ),
        stacklevel=3,
    )
    with Raylets(count, reason) as raylets:
        yield raylets


# ---- Ray nodes and their workers, on any hosts ----------------------------------------------------------


def ray_start(args: list[str], agent: bool = False) -> tuple[list[str], dict[str, str]]:
    """The command and the environment variable that run `ray start ARGS` on a lean node
    (tests/lean_ray_start.py); `agent`: with Ray's dashboard agent, for a head that runs jobs. Without
    --block: `ray start` exits once its node is up, and the node's processes go on in its host (or
    session) until the test stops them."""
    hook = "__main__.lean_with_agent" if agent else "__main__.lean"
    return [sys.executable, str(TESTS / "lean_ray_start.py"), "start", *args], {"RAY_START_HOOK": hook}


TESTS = Path(__file__).resolve().parent


def warm() -> bool:
    """Whether tests/warm_driver.py's warm processes are on (ROLL_TEST_WARM_DRIVER=0 or
    ROLL_TEST_WARM_WORKERS=0 turn them off)."""
    return all(os.environ.get(variable) != "0" for variable in ("ROLL_TEST_WARM_DRIVER", "ROLL_TEST_WARM_WORKERS"))


def zygote_socket(zygote: subprocess.Popen, written: Path) -> str:
    """The socket's path, once tests/host_zygote.py has written it to `written`."""
    deadline = time.monotonic() + 60
    while not written.exists():
        assert zygote.poll() is None and time.monotonic() < deadline, f"the workers' zygote exited: {zygote.args}"
        time.sleep(0.05)
    return written.read_text()


@contextmanager
def forked_workers(folder: Path) -> Iterator[None]:
    """A local Ray cluster that this process starts and stops in the block (ray.init, workers/cluster.py
    start_ray) gets its Python workers forked from a zygote (tests/host_zygote.py, which the block ends), as a forked
    roll-train's local cluster does (tests/warm_workers.py): each worker skips ~3.5 s of CPU of imports,
    the zygote's own taken once. Its raylet gets the zygote's socket; this process's environment stays."""
    if not warm():
        yield
        return
    import ray._private.parameter as parameter
    import warm_workers

    written = folder / "workers_zygote"
    # os.environ, as Ray gives it to the raylet: a C library may have set variables in this process's own
    # environment (COLUMNS, LINES) that Popen would pass on, and the workers' would then differ
    command = [sys.executable, str(TESTS / "host_zygote.py"), str(written)]
    zygote = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=dict(os.environ))
    plain = parameter.RayParams.__init__
    try:
        socket_path = zygote_socket(zygote, written)

        def init(self, *args, **kwargs) -> None:
            plain(self, *args, **kwargs)
            self.setup_worker_path = warm_workers.LAUNCHER
            self.env_vars = {**(self.env_vars or {}), warm_workers.SOCKET_VARIABLE: socket_path}

        parameter.RayParams.__init__ = init
        yield
    finally:
        parameter.RayParams.__init__ = plain
        zygote.terminate()
        zygote.wait(timeout=30)
        if written.exists():  # the workers' zygote removes its socket's folder as it ends; where it was killed
            shutil.rmtree(os.path.dirname(written.read_text()), ignore_errors=True)
