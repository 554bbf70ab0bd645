"""environment.name: openenv (roll_lite/environments/openenv_env.py) against real OpenEnv servers on
127.0.0.1 serving roll_lite/environments/openenv_guess.py: the same game as guess_the_number, a server
killed mid-episode, one that never answers, an answer without the text, the config's checks, and a
tiny roll-train run (workers.backend=local) on a server it starts itself.
The servers are forked from this process (openenv's import is paid once)."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import sys
import time

import pytest
from forked_servers import start_server, stop_server

# not imported here: collecting the suite would pay for openenv (~2 s of CPU) in every pytest process
pytestmark = pytest.mark.skipif(importlib.util.find_spec("openenv.core") is None, reason="needs openenv-core==0.3.0")

from roll_lite.environments.config import EnvironmentConfig, check_environment_config  # noqa: E402
from roll_lite.environments.guess_the_number import GuessTheNumber  # noqa: E402
from roll_lite.environments.openenv_env import OpenEnvEnvironment, OpenEnvServerError  # noqa: E402
from roll_lite.errors import ConfigError  # noqa: E402

GAME = {"lo": 1, "hi": 16, "max_turns": 5, "intro": "Guess {lo}-{hi}."}


def _app():
    from roll_lite.environments.openenv_guess import make_app

    return make_app()


def _start_server() -> tuple[int, str]:
    import roll_lite.environments.openenv_guess  # noqa: F401 (openenv's import: here, once, not in each fork)

    return start_server(_app)


@pytest.fixture(scope="module")
def servers():
    """(a server that stays up, one to kill mid-episode), forked before any client starts a thread."""
    started = [_start_server(), _start_server()]
    yield started
    for pid, _ in started:
        stop_server(pid)


def test_plays_the_same_game_as_guess_the_number(servers):
    (_, url), _ = servers
    remote, local = OpenEnvEnvironment(url=url), GuessTheNumber(**GAME)
    for secret, guesses in ((5, ["8", "4", "x", "6", "7"]), (11, ["8", "12", "11"])):
        assert remote.reset(seed=3, secret=secret)[0] == local.reset(seed=3, secret=secret)[0]
        for guess in guesses:
            got, want = remote.step(guess), local.step(guess)
            assert got[:4] == want[:4]
            assert got[4]["outcome"] == want[4]["outcome"]
    assert got[1:4] == (1.0, True, False)  # solved
    remote.close()


def test_server_killed_mid_episode_fails_that_episode(servers):
    _, (pid, url) = servers
    env = OpenEnvEnvironment(url=url, message_timeout_s=2)
    assert env.reset(secret=5)[0] == "Guess 1-16."
    stop_server(pid)
    start = time.monotonic()
    with pytest.raises(OpenEnvServerError, match=f"openenv server {url}: step failed"):
        env.step("8")
    with pytest.raises(OpenEnvServerError, match="reset failed"):  # the next episode: still down
        env.reset(secret=5)
    assert time.monotonic() - start < 5


def test_a_frozen_server_fails_within_the_timeouts():
    """SIGSTOP mid-episode: the step fails at message_timeout_s and the next reset at connect_timeout_s, not
    after websockets' 10 s closing handshake with a server that never answers (the client closes aside)."""
    pid, url = _start_server()
    try:
        env = OpenEnvEnvironment(url=url, connect_timeout_s=1, message_timeout_s=1)
        env.reset(secret=5)
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(OpenEnvServerError, match="step failed \\(timed out"):
            env.step("8")
        assert time.monotonic() - start < 2.5
        start = time.monotonic()
        with pytest.raises(OpenEnvServerError, match="reset failed"):
            env.reset(secret=5)
        assert time.monotonic() - start < 2.5
    finally:
        stop_server(pid)


def test_a_server_that_never_answers_times_out():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # connections queue, nobody answers the WebSocket handshake
    env = OpenEnvEnvironment(url=f"http://127.0.0.1:{sock.getsockname()[1]}", connect_timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(OpenEnvServerError, match="reset failed"):
        env.reset(secret=5)
    assert time.monotonic() - start < 3
    sock.close()


def test_an_answer_without_the_text_is_an_error(servers):
    (_, url), _ = servers
    env = OpenEnvEnvironment(url=url, observation_key="board")
    with pytest.raises(OpenEnvServerError, match="no str 'board' \\(observation_key\\)"):
        env.reset(secret=5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "environment.kwargs.url: openenv needs exactly one of url"),
        ({"url": "http://a", "app": "m:f"}, "environment.kwargs.url: openenv needs exactly one"),
        ({"url": "localhost:8000"}, "environment.kwargs.url: must be an http"),
        ({"app": "module_only"}, "environment.kwargs.app: must be a package.module:factory"),
        ({"url": "http://a", "message_timeout_s": 0}, "environment.kwargs.message_timeout_s: must be a number > 0"),
        ({"url": "http://a", "observation_key": ""}, "environment.kwargs.observation_key: must be a non-empty"),
        ({"url": "http://a", "port": 1}, "environment.kwargs.port: not a key of openenv"),
        ({"url": "http://a", "message_timeout_s": 8}, "= 11 s must be under environment.step_timeout_s = 10 s"),
    ],
)
def test_config_errors_name_the_key(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", "\\(")):
        check_environment_config(EnvironmentConfig(name="openenv", kwargs=kwargs))


def test_roll_train_on_an_openenv_app(tmp_path):
    from test_multi_turn_run import SMALL
    from test_resume import LOCAL, REPO, metrics, run

    config = REPO / "examples/openenv/guess.yaml"
    args = [sys.executable, "-m", "roll_lite.cli", "--config", str(config), *SMALL, LOCAL]
    args += ["steps=1", "sft.steps=0", "data.eval_files=null", "checkpoint.every=0"]
    args += ["environment.max_concurrent=1", f"output_dir={tmp_path}"]
    log = run(args + ["run_name=openenv"]).stderr
    assert "environment: openenv in 1 process(es)" in log
    steps = [r for r in metrics(tmp_path / "openenv") if r["step"] > 0]
    assert [r["step"] for r in steps] == [1]
    assert not any(key.startswith("env/faults") for r in steps for key in r)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports `pid` listens on (its socket inodes matched in /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
            ports.add(int(fields[1].split(":")[1], 16))
    return ports


def _gone(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_run_leaves_no_server_behind(tmp_path):
    """SIGKILL to the roll-train driver alone (workers.backend=local): its environment processes, and the
    OpenEnv servers they serve on 127.0.0.1, end with it (the guarded children's parent-death signal)."""
    import subprocess

    import warm_driver
    from processes import descendants
    from test_multi_turn_run import SMALL
    from test_resume import LOCAL, REPO

    args = [sys.executable, "-m", "roll_lite.cli", "--config", str(REPO / "examples/openenv/guess.yaml"), *SMALL]
    args += [LOCAL, "steps=50", "sft.steps=0", "data.eval_files=null", "checkpoint.every=0"]
    args += ["environment.max_concurrent=2", f"output_dir={tmp_path}", "run_name=killed"]
    driver = warm_driver.WarmPopen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=REPO)
    try:
        assert driver.stderr is not None
        for line in driver.stderr:
            if "environment: openenv in 2 process(es)" in line:
                break
        children = [pid for pid in _children(driver.pid) if "environments.child" in open(f"/proc/{pid}/cmdline").read()]
        ports = {port for pid in children for port in _listening_ports(pid)}
        assert len(children) == 2 and len(ports) == 2, (children, ports)
        run = descendants(driver.pid)  # the environment processes and whatever they started
        driver.kill()
        driver.wait(30)
    finally:
        driver.kill()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(_gone(pid) for pid in run):
        time.sleep(0.1)
    assert all(_gone(pid) for pid in children), "an environment process outlived the killed driver"
    assert all(_gone(pid) for pid in run), "a process of the run outlived the killed driver"
    # Nothing of the run serves on those ports. Another test's process may have taken one since (a Ray
    # worker's port is any free one): a connection that succeeds is checked for its listener.
    for port in ports:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        except ConnectionRefusedError:
            continue
        holders = {int(pid) for pid in os.listdir("/proc") if pid.isdigit() and port in _ports_or_none(int(pid))}
        assert not holders & run, (port, holders)


def _ports_or_none(pid: int) -> set[int]:
    try:
        return _listening_ports(pid)
    except OSError:  # gone meanwhile
        return set()
