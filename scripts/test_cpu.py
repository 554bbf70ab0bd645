"""CPU seconds per test, counting every process a test starts (roll-train drivers, Ray's processes, model
workers, vLLM engines, spawned ranks): a pytest plugin that puts each pytest process (each -n worker)
in a cgroup of its own and reads the group's CPU time before and after each test. Then a table per file.

    PYTHONPATH=scripts python -m pytest -p test_cpu -n 2 --dist loadfile --no-loadscope-reorder
    python scripts/test_cpu.py [--top N]           # the table: per file, CPU and wall seconds
    python scripts/test_cpu.py --areas [--check]   # per area of tests/cpu_budget.py, against its budget

Needs root and cgroup v1's cpuacct controller (/sys/fs/cgroup/cpuacct); where either is missing the
plugin says so and records nothing. Results go to $TEST_CPU_DIR (default /tmp/test_cpu), one JSON file
per pytest process: {nodeid: [CPU s, wall s]}. A test's CPU includes whatever the processes of the test
before it left running; a test that is CPU-bound alone shows wall ≈ CPU. CONTRIBUTING.md ("Where the
time goes") has a table made with it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
OUT = Path(os.environ.get("TEST_CPU_DIR", "/tmp/test_cpu"))
_group: Path | None = None
_times: dict[str, list[float]] = {}
_started: dict[str, tuple[float, float]] = {}


def _cpu_s() -> float:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config) -> None:
    global _group
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if name == "main" and getattr(config.option, "numprocesses", None):
        return  # the controller of -n N runs no test (it sees the workers' reports, not their CPU)
    try:
        # the pid keeps apart a pytest run under another one's plugin (tests/test_cpu_per_test.py under -p test_cpu)
        group = CPUACCT / f"test_cpu_{name}_{os.getpid()}"
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))  # the processes started from now on follow
        _group = group
    except OSError as error:
        warnings.warn(f"test_cpu: no cgroup of its own ({error}): nothing recorded", stacklevel=1)


def pytest_runtest_logstart(nodeid, location) -> None:
    if _group is not None:
        _started[nodeid] = (_cpu_s(), time.monotonic())


def pytest_runtest_logfinish(nodeid, location) -> None:  # after the test's setup, call and teardown
    if _group is not None:
        cpu, wall = _started.pop(nodeid)
        _times[nodeid] = [round(_cpu_s() - cpu, 3), round(time.monotonic() - wall, 3)]


def pytest_unconfigure(config) -> None:
    if _group is not None:
        OUT.mkdir(parents=True, exist_ok=True)
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (OUT / f"test_cpu_{name}.json").write_text(json.dumps(_times))
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))  # back to the root group, and the group goes
        try:
            _group.rmdir()
        except OSError:  # a process the tests left running is still in it: the group goes with it later
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=25, help="files in the table")
    parser.add_argument("--areas", action="store_true", help="per area of tests/cpu_budget.py, with its budget")
    parser.add_argument("--check", action="store_true", help="with --areas: exit 1 where an area is over budget")
    args = parser.parse_args()
    tests: dict[str, list[float]] = {}
    for path in sorted(OUT.glob("*.json")):
        tests.update(json.loads(path.read_text()))
    if not tests:
        raise SystemExit(f"no recording in {OUT}: run pytest with -p test_cpu first (see this file's docstring)")
    if args.areas:
        raise SystemExit(print_areas(tests, args.check))
    files: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for nodeid, (cpu, wall) in tests.items():
        row = files[nodeid.split("::")[0]]
        row[0] += 1
        row[1] += cpu
        row[2] += wall
    total_cpu, total_wall = sum(r[1] for r in files.values()), sum(r[2] for r in files.values())
    print(f"{len(tests)} tests: {total_cpu:.0f} s of CPU in {total_wall:.0f} s of test time\n")
    print("| file | tests | CPU s | wall s |\n|---|---:|---:|---:|")
    for path, (count, cpu, wall) in sorted(files.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"| {Path(path).name} | {count} | {cpu:.0f} | {wall:.0f} |")


def print_areas(tests: dict[str, list[float]], check: bool) -> int:
    """The table of tests/cpu_budget.py's areas: measured CPU against budget. 1 where `check` and one is over."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from cpu_budget import AREAS, TOTAL_BUDGET_S, area_of

    used: dict[str, float] = defaultdict(float)
    for nodeid, (cpu, _) in tests.items():
        used[area_of(nodeid.split("::")[0])] += cpu
    print("| area | CPU s | budget s | |\n|---|---:|---:|---|")
    over = []
    for area, (budget, _, _) in AREAS.items():
        if used[area] > budget:
            over.append(area)
        print(f"| {area} | {used[area]:.0f} | {budget} | {'over' if used[area] > budget else ''} |")
    total = sum(used.values())
    print(f"| **all** | **{total:.0f}** | **{TOTAL_BUDGET_S}** | {'over' if total > TOTAL_BUDGET_S else ''} |")
    return 1 if check and (over or total > TOTAL_BUDGET_S) else 0


if __name__ == "__main__":
    main()
