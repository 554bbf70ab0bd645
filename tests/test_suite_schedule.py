"""The suite's own scheduling (tests/conftest.py): CONTRIBUTING.md's fast loop leaves out the tests
measured slow and those sharing their fixtures, and the full suite runs the slowest files first."""

import functools
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import doc_commands

REPO = Path(__file__).resolve().parents[1]


@functools.cache  # one collection of the whole suite (~20 s of CPU) serves both tests below
def collected() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the tests CONTRIBUTING.md's fast loop runs, in order; every test of the suite, in order): its command
    verbatim with --collect-only, which writes the whole collection before -m deselects (tests/conftest.py)."""
    line = doc_commands.commands("python -m pytest", "not slow")[0]
    # without the options of the pytest that runs this test (PYTEST_ADDOPTS: --record-durations PATH, say)
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
    with tempfile.TemporaryDirectory() as folder:
        everything = Path(folder) / "collection"
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"]
            + [f"--write-collection={everything}", *shlex.split(line)[3:]],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        fast = tuple(line for line in result.stdout.splitlines() if "::" in line)
        return fast, tuple(everything.read_text().splitlines())


def test_the_fast_loop_leaves_out_what_was_measured_slow_and_keeps_the_unit_tests():
    fast, everything = collected()
    measured = json.loads((REPO / "tests" / "durations.json").read_text())["tests"]
    slow = {nodeid for nodeid, (setup, call) in measured.items() if setup > 1.0 or call > 1.0}
    assert slow and not slow & set(fast)
    # the exactness matrix shares one fixture measured at over a minute: every case goes with it
    assert not [n for n in fast if n.startswith("tests/test_exactness.py::")]
    for unit in ("tests/test_agg_loss.py::test_modes_by_hand", "tests/test_packing.py::", "tests/test_tools.py::"):
        assert any(n.startswith(unit) for n in fast), unit
    assert len(fast) < len(everything) and set(fast) < set(everything)


def test_the_slowest_file_runs_first_and_the_measurements_name_only_files_that_exist():
    measured = json.loads((REPO / "tests" / "durations.json").read_text())["tests"]
    assert not [path for path in {n.split("::")[0] for n in measured} if not (REPO / path).is_file()]  # re-record
    _, nodeids = collected()
    files: dict[str, float] = {}
    for nodeid in nodeids:  # like the scheduler: a renamed test's old measurement counts for nothing
        setup, call = measured.get(nodeid, (0.0, 0.0))
        if nodeid in measured:
            files[nodeid.split("::")[0]] = files.get(nodeid.split("::")[0], 0.0) + setup + call
    order = list(dict.fromkeys(n.split("::")[0] for n in nodeids))
    measured_order = [path for path in order if path in files]
    assert measured_order == sorted(measured_order, key=lambda path: -files[path])
    unmeasured = [path for path in order if path not in files]
    assert order[: len(unmeasured)] == unmeasured  # a new file is not known to be fast: it goes first


def test_every_test_file_is_in_exactly_one_area_of_the_cpu_budget():
    import cpu_budget

    listed = [name for _, _, files in cpu_budget.AREAS.values() for name in files]
    on_disk = sorted(path.name for path in (REPO / "tests").glob("test_*.py"))
    assert len(listed) == len(set(listed)), "a file is in two areas"
    assert sorted(listed) == on_disk, {"in no area": set(on_disk) - set(listed), "gone": set(listed) - set(on_disk)}
    assert sum(budget for budget, _, _ in cpu_budget.AREAS.values()) == cpu_budget.TOTAL_BUDGET_S
