"""tests/raylets.py, the hosts tests/test_several_hosts.py runs on where this machine cannot make network
namespaces (CI can, so that module runs there on namespaces only): a host is its sessions, which keep
a process that left the process tree, and closing the hosts leaves none of their processes."""

import os
import time

import pytest
from raylets import Raylets, hosts_or_raylets, processes

# A process that outlives its parent (its parent exits: it is reparented, out of the tree, in the session)
ORPHAN_AND_CHILD = ["bash", "-c", "(sleep 300 &) ; exec sleep 301"]


def test_a_host_is_its_sessions_and_closing_the_hosts_ends_their_processes_orphans_included(tmp_path):
    with Raylets(2, "a test") as hosts:
        for host in hosts:
            host.start(ORPHAN_AND_CHILD, tmp_path / f"host{host.number}.log")
        deadline = time.monotonic() + 10
        while len(first := hosts[0].pids()) < 2 or len(second := hosts[1].pids()) < 2:
            assert time.monotonic() < deadline, (first, hosts[1].pids())  # the subshell forks its sleep and exits
        assert len(first) == len(second) == 2 and not set(first) & set(second)
        assert hosts[0].processes[0].pid in first and os.getpid() not in first + second
        assert hosts[0].running() and hosts[1].running()
    running = {pid for pid, (status, _) in processes().items() if status != "Z"}  # "Z": exited, reaped soon
    assert not set(first + second) & running
    assert all(process.returncode is not None for host in hosts for process in host.processes)


def test_ROLL_TEST_HOSTS_asks_for_raylets_with_a_warning_and_takes_no_other_value(monkeypatch):
    monkeypatch.setenv("ROLL_TEST_HOSTS", "raylets")
    with pytest.warns(pytest.PytestWarning, match="not network namespaces: ROLL_TEST_HOSTS=raylets"):
        with hosts_or_raylets(3) as hosts:
            assert isinstance(hosts, Raylets) and len(hosts.hosts) == 3
    monkeypatch.setenv("ROLL_TEST_HOSTS", "namespace")
    with pytest.raises(ValueError, match="leave it unset"):
        with hosts_or_raylets(3):
            pass
