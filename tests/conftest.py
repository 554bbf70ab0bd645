"""How the suite is scheduled, from the test times measured last (tests/durations.json):

- `slow`: a test is marked slow when its measured setup or call took over SLOW_S, or when it uses a
  fixture whose setup was measured slow in its file (a test that shares the exactness matrix's or an
  engine's fixture pays for it when the test that paid before is deselected). `pytest -m "not slow"`
  is the fast loop (CONTRIBUTING.md).
- order: files run slowest first, so that `-n 2 --dist loadfile` (scripts/test.sh) hands out the long
  files while the short ones fill in the end; files not measured yet go first, as if slow.
- `--record-durations PATH` writes this run's times in the same format (CONTRIBUTING.md says when).
- `--write-collection PATH` writes every test collected, in the order above, before `-m`/`-k` deselect
  any (tests/test_suite_schedule.py: one collection gives both the fast loop's tests and the whole suite's).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
SLOW_S = 1.0
# Function-scoped fixtures every test may use: their setup is cheap, so they do not make a test slow.
CHEAP_FIXTURES = {"tmp_path", "tmp_path_factory", "monkeypatch", "capsys", "capfd", "request", "caplog", "recwarn"}


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        default=None,
        help="write each test's setup and call seconds to PATH (JSON, the format of tests/durations.json)",
    )
    parser.addoption(
        "--write-collection",
        metavar="PATH",
        default=None,
        help="write the node ids of every test collected, one a line in the order they run, before -m/-k deselect",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"slow: measured over {SLOW_S:g} s, or sharing a slow fixture (tests/conftest.py)"
    )
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):  # under xdist the controller sees every worker's reports
        config.pluginmanager.register(DurationRecorder(Path(path)), "record-durations")
    if hasattr(config, "workerinput"):  # one of scripts/test.sh's pytest processes, beside the other
        import torch

        # Two OpenMP threads each in two processes on two cores wait for each other's preempted threads:
        # test_invariance.py took 69 s beside the other process, 12 s alone. One thread here, and by default
        # in the processes the tests start (scripts, vLLM engines, roll-check-loss): test_invariance.py and
        # test_cuda_check_smoke.py beside a busy core took 97 s with two threads each, 27 s with one.
        # roll-train's Ray workers and spawned ranks set their own (workers.torch_threads, ...).
        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def measured() -> dict[str, list[float]]:
    """{node id: [setup s, call s]} of the last recorded run."""
    return json.loads(DURATIONS.read_text())["tests"] if DURATIONS.exists() else {}


def slow_fixtures(items, times) -> dict[str, set[str]]:
    """Per file, the fixtures of the tests whose setup was slow: one of them is the slow one."""
    found = defaultdict(set)
    for item in items:
        setup, _ = times.get(item.nodeid, (0.0, 0.0))
        if setup > SLOW_S:
            found[file_of(item.nodeid)] |= set(getattr(item, "fixturenames", ())) - CHEAP_FIXTURES
    return found


def pytest_collection_modifyitems(config, items):
    times = measured()
    shared = slow_fixtures(items, times)
    file_seconds = defaultdict(float)
    for item in items:
        path = file_of(item.nodeid)
        setup, call = times.get(item.nodeid, (0.0, 0.0))
        file_seconds[path] += setup + call
        if setup > SLOW_S or call > SLOW_S or shared[path] & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    known = {file_of(nodeid) for nodeid in times}
    # A stable sort: within a file the tests keep their order (module fixtures are set up once).
    items.sort(key=lambda item: (file_of(item.nodeid) in known, -file_seconds[file_of(item.nodeid)]))
    if path := config.getoption("--write-collection"):  # before -m deselects: it reads the slow marks added above
        Path(path).write_text("".join(item.nodeid + "\n" for item in items))


class DurationRecorder:
    """Each test's setup and call seconds, written to `path` when the session ends."""

    def __init__(self, path: Path):
        self.path, self.tests = path, defaultdict(lambda: [0.0, 0.0])

    def pytest_runtest_logreport(self, report):
        if report.when in ("setup", "call"):
            self.tests[report.nodeid][0 if report.when == "setup" else 1] = round(report.duration, 3)

    def pytest_sessionfinish(self):
        write_durations(self.path, self.tests)


def write_durations(path: Path, tests: dict[str, list[float]]) -> None:
    """One line per test, so that a change of times reads well in a diff."""
    lines = [f"{json.dumps(nodeid)}: {json.dumps(times)}" for nodeid, times in sorted(tests.items())]
    path.write_text('{"tests": {\n' + ",\n".join(lines) + "\n}}\n")
