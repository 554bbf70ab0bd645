"""tests/warm_driver.py: a roll-train forked from the zygote is the process that `python -m roll_lite.cli`
started anew would be (cwd, argv, sys.path, environment, exit code, output), ends as one on an error or a
signal, and what a fork could get wrong starts the usual way.

The probe is a user pipeline module that roll-train imports from its cwd before Ray: it prints what it
sees and exits, raises or hangs, as ROLL_LITE_TEST_PROBE says."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import warm_driver

PROBE = """
import json, os, sys

print(json.dumps({
    "cwd": os.getcwd(),
    "argv": sys.argv,
    "path": sys.path,
    "marker": os.environ.get("ROLL_LITE_TEST_MARKER"),
    "setting": os.environ.get("ROLL_TEST_SETTING"),
    "main": sys.modules["__main__"].__spec__.name,
    "cli_by_name": "roll_lite.cli" in sys.modules,
    "session_leader": os.getsid(0) == os.getpid(),
}), flush=True)
probe = os.environ.get("ROLL_LITE_TEST_PROBE")
if probe == "exit":
    sys.exit(7)
if probe == "raise":
    raise RuntimeError("the probe fails on purpose")
if probe == "hang":
    import time
    time.sleep(120)
"""


def probe_run(tmp_path, code: str) -> tuple[list[str], Path]:
    """`roll-train pipeline=probe:Probe` whose probe.py is `code`, and its cwd, the folder of probe.py; the test
    is skipped where the warm driver does not fork."""
    if warm_driver._the_zygote() is None:  # e.g. one pytest process without OMP_NUM_THREADS=1 (conftest.py)
        pytest.skip(f"the warm driver does not fork here: {getattr(warm_driver._zygote, 'state', 'turned off')}")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "probe.py").write_text(code)
    return [sys.executable, "-m", "roll_lite.cli", "pipeline=probe:Probe", "steps=1"], tmp_path / "work"


@pytest.fixture
def probe(tmp_path):
    command, cwd = probe_run(tmp_path, PROBE)
    (tmp_path / "lib").mkdir()
    return command, cwd, {**os.environ, "PYTHONPATH": str(tmp_path / "lib"), "ROLL_LITE_TEST_MARKER": "m"}


def start(probe, what: str, fresh: bool = False, **options) -> subprocess.Popen:
    command, cwd, env = probe
    popen = subprocess.Popen if fresh else warm_driver.WarmPopen
    process = popen(command, cwd=cwd, env={**env, "ROLL_LITE_TEST_PROBE": what}, text=True, **options)
    assert fresh or process.not_forked_because is None, process.not_forked_because
    return process


def test_a_forked_run_sees_and_prints_what_a_fresh_process_does(probe):
    ends = {}
    for fresh in (True, False):
        process = start(probe, "exit", fresh, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stdout, stderr = process.communicate(timeout=120)
        ends[fresh] = (process.returncode, json.loads(stdout), stderr)
    # The zygote imported Ray, which put its thirdparty_files first on sys.path; a fresh driver has it
    # there too once it imports Ray, after its pipeline module (this probe)
    ends[False][1]["path"] = [p for p in ends[False][1]["path"] if not p.endswith("ray/thirdparty_files")]
    assert ends[False] == ends[True]
    code, seen, stderr = ends[False]
    assert code == 7 and stderr == ""
    assert seen["path"][:2] == [str(probe[1]), str(probe[1].parent / "lib")] and seen["marker"] == "m"
    assert seen["main"] == "roll_lite.cli" and not seen["cli_by_name"] and not seen["session_leader"]


def test_an_uncaught_error_and_a_signal_end_a_forked_run_as_they_end_a_process(probe):
    process = start(probe, "raise", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1 and stderr.rstrip().endswith("RuntimeError: the probe fails on purpose"), stderr

    process = start(probe, "hang", stdout=subprocess.PIPE, start_new_session=True)
    assert json.loads(process.stdout.readline())["session_leader"]
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL


def test_a_test_that_changes_this_process_environment_gets_a_zygote_of_that_environment(probe, monkeypatch):
    """An in-process worker sets RANK, MASTER_ADDR, ... for good: the runs after it fork from a new zygote
    started with them, as a fresh process would inherit them."""
    first = warm_driver._zygote
    monkeypatch.setenv("ROLL_TEST_SETTING", "changed")
    command, cwd, env = probe
    env = {**os.environ, "PYTHONPATH": env["PYTHONPATH"], "ROLL_LITE_TEST_PROBE": "exit"}
    process = warm_driver.WarmPopen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
    assert process.not_forked_because is None and warm_driver._zygote is not first
    assert json.loads(process.communicate(timeout=60)[0])["setting"] == "changed" and process.returncode == 7


@pytest.mark.parametrize("change", ["a Ray variable", "a module of the zygote's in the cwd", "not roll-train"])
def test_what_a_fork_could_get_wrong_starts_the_usual_way(probe, change):
    command, cwd, env = probe
    if change == "a Ray variable":  # read when Ray is imported, which the zygote did with its own environment
        env = {**env, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    elif change == "a module of the zygote's in the cwd":  # a fresh process would import this one
        (cwd / "omegaconf.py").write_text("")
    else:
        command = [sys.executable, "-c", "import roll_lite.cli"]
    process = warm_driver.WarmPopen(
        command, cwd=cwd, env={**env, "ROLL_LITE_TEST_PROBE": "exit"}, stdout=subprocess.PIPE
    )
    process.communicate(timeout=120)
    assert process.not_forked_because is not None and process._status_fd is None  # started the usual way
    # (with omegaconf.py in its cwd, roll-train fails to import its config, as a fresh process must)
    assert process.returncode == {"a Ray variable": 7, "not roll-train": 0}.get(change, 1)
