"""tests/warm_workers.py: a Ray worker forked from the workers' zygote is the worker Ray would have started
(cwd, argv, sys.path, environment, the job and raylet it belongs to, a process group of its own), it ends
with the launcher the raylet started, and what the zygote cannot honour starts as Ray starts it.

The probe is a user pipeline module that roll-train imports from its cwd before Ray: it starts a one-CPU
local cluster itself, prints what an actor of it sees, and waits for its stdin to close."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import warm_driver
import warm_workers
from test_warm_driver import probe_run

PROBE = """
import json, os, sys
import ray

if os.environ.get("ROLL_LITE_TEST_PROBE") == "set a variable":
    os.environ["ROLL_TEST_WORKER_SETTING"] = "set by the driver"  # the workers inherit it: the zygote has not
ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")


@ray.remote
class Probe:
    def view(self):
        return {
            "cwd": os.getcwd(),
            "argv": sys.argv[:1],
            "path": sys.path,
            "main": sys.modules["__main__"].__file__,
            "job": ray.get_runtime_context().get_job_id(),
            "raylet": open(f"/proc/{os.environ['RAY_RAYLET_PID']}/cmdline").read().split(chr(0))[0],
            "group_leader": os.getpgid(0) == os.getpid(),
            "marker": os.environ.get("ROLL_LITE_TEST_MARKER"),
            "setting": os.environ.get("ROLL_TEST_WORKER_SETTING"),
            "pid": os.getpid(),
        }


print(json.dumps(ray.get(Probe.remote().view.remote())), flush=True)
sys.stdin.read()
ray.shutdown()
sys.exit(0)
"""


@pytest.fixture
def probe(tmp_path):
    command, cwd = probe_run(tmp_path, PROBE)
    return command, cwd, {**os.environ, "ROLL_LITE_TEST_MARKER": "m"}


def view(probe, what: str, fresh: bool) -> tuple[subprocess.Popen, dict]:
    command, cwd, env = probe
    popen = subprocess.Popen if fresh else warm_driver.WarmPopen
    env = {**env, "ROLL_LITE_TEST_PROBE": what}
    process = popen(command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert fresh or process.not_forked_because is None, process.not_forked_because
    line = process.stdout.readline()
    assert line, process.communicate(timeout=60)
    return process, json.loads(line)


def end(process: subprocess.Popen) -> None:
    process.communicate("", timeout=60)
    assert process.returncode == 0


def launcher_of(worker: int) -> int | None:
    for entry in warm_workers.LAUNCHED.glob("*"):
        if entry.read_text() == str(worker) and warm_workers.launched_worker(int(entry.name)) == worker:
            return int(entry.name)
    return None


def test_a_forked_worker_sees_what_a_fresh_one_does_and_ends_with_its_launcher(probe):
    fresh, cold = view(probe, "plain", fresh=True)
    end(fresh)
    process, warm = view(probe, "plain", fresh=False)
    launcher = launcher_of(warm["pid"])
    assert launcher is not None and launcher_of(cold["pid"]) is None  # forked, and started as Ray does
    assert {**warm, "pid": 0} == {**cold, "pid": 0}
    # Ray puts the driver's directory first, its own thirdparty_files next, and the script's folder follows
    assert warm["path"][0] == str(probe[1]) and warm["path"][1].endswith("ray/thirdparty_files")
    assert warm["path"][2].endswith("ray/_private/workers") and warm["main"].endswith("default_worker.py")
    assert warm["raylet"].endswith("/raylet") and warm["job"] == "01000000" and warm["group_leader"]
    assert warm["marker"] == "m"

    os.kill(launcher, signal.SIGKILL)  # the raylet's process: its worker goes with it
    deadline = time.monotonic() + 10
    while Path(f"/proc/{warm['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{warm['pid']}").exists()
    process.kill()
    process.communicate(timeout=60)


def test_a_variable_the_driver_sets_before_ray_starts_its_workers_the_usual_way(probe):
    process, seen = view(probe, "set a variable", fresh=False)
    assert seen["setting"] == "set by the driver" and launcher_of(seen["pid"]) is None
    end(process)
