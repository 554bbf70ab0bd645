"""scripts/test_cpu.py, the per-test CPU recorder CONTRIBUTING.md's table comes from: a test's CPU counts
the processes it starts, and a test that waits shows wall time without CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")

TESTS = """
import subprocess, sys, time

def test_spins_in_a_child():
    spin = "import time\\nend = time.process_time() + 1.0\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)

def test_sleeps():
    time.sleep(0.5)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not (CPUACCT / "cgroup.procs").exists(), reason="needs root and cgroup v1's cpuacct"
)
def test_a_tests_cpu_counts_its_child_processes_and_not_its_waits(tmp_path):
    (tmp_path / "test_two.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TEST_CPU"))}
    env.update(PYTHONPATH=str(REPO / "scripts"), TEST_CPU_DIR=str(tmp_path / "out"))
    pytest_command = [sys.executable, "-m", "pytest", "-p", "test_cpu", "-p", "no:cacheprovider", "-n", "2"]
    groups_before = set(CPUACCT.glob("test_cpu_*"))  # this run's own, where it runs under -p test_cpu
    result = subprocess.run(
        [*pytest_command, "-q", "test_two.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    recorded = sorted((tmp_path / "out").glob("*.json"))
    assert [path.name for path in recorded] == ["test_cpu_gw0.json", "test_cpu_gw1.json"]  # none by the controller
    times = {nodeid: row for path in recorded for nodeid, row in json.loads(path.read_text()).items()}
    spin_cpu, spin_wall = times["test_two.py::test_spins_in_a_child"]
    sleep_cpu, sleep_wall = times["test_two.py::test_sleeps"]
    assert spin_cpu >= 0.95 and spin_wall >= 1.0, times  # the child's second of CPU is the test's
    assert sleep_cpu < 0.2 and sleep_wall >= 0.5, times
    assert set(CPUACCT.glob("test_cpu_*")) <= groups_before  # their cgroups are gone with them
    table = subprocess.run(
        [sys.executable, str(REPO / "scripts/test_cpu.py")], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "2 tests:" in table and "| test_two.py | 2 |" in table, table
