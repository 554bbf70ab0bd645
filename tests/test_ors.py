"""environment.name: ors (roll_lite/environments/ors_env.py) with the openreward SDK's own client against real
ORS servers on 127.0.0.1 serving roll_lite/environments/ors_guess.py: the same game as guess_the_number (by task
spec and by split / index), a server killed mid-episode, one frozen mid-episode, a tool that raises, the config's
checks, and a tiny roll-train run (workers.backend=local) on a server it starts itself.
The servers are forked from this process before any client starts a thread (openreward's import is paid once)."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time

import pytest
from forked_servers import start_server, stop_server

os.environ.setdefault("OPENREWARD_LOG_LEVEL", "WARNING")  # read as its loggers are made, at import
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
# not imported here: collecting the suite would pay for openreward (~4 s of CPU) in every pytest process
pytestmark = pytest.mark.skipif(importlib.util.find_spec("openreward") is None, reason="needs openreward==0.1.167")

from roll_lite.environments.config import EnvironmentConfig, check_environment_config  # noqa: E402
from roll_lite.environments.guess_the_number import GuessTheNumber  # noqa: E402
from roll_lite.environments.ors_env import OrsEnvironment, OrsServerError  # noqa: E402
from roll_lite.errors import ConfigError  # noqa: E402

ENV = "guessthenumberenv"


def _app():
    from roll_lite.environments.ors_guess import make_server

    return make_server().app


@pytest.fixture(scope="module")
def servers():
    """(one that stays up, one to kill mid-episode, one to freeze mid-episode)."""
    import roll_lite.environments.ors_guess  # noqa: F401 (openreward's import: here, once, not in each fork)

    started = [start_server(_app) for _ in range(3)]
    yield started
    for pid, _ in started:
        stop_server(pid)


def test_plays_the_same_game_as_guess_the_number(servers):
    from roll_lite.environments.ors_guess import GAME

    (_, url), _, _ = servers
    remote, local = OrsEnvironment(env_id=ENV, url=url, tool="guess"), GuessTheNumber(**GAME)
    for secret, guesses in ((5, ["8", "4", "x", "6", "7"]), (11, ["8", "12", "11"])):
        assert remote.reset(seed=3, secret=secret) == local.reset(seed=3, secret=secret)
        for guess in guesses:
            assert remote.step(guess) == local.step(guess)
    remote.close()


def test_a_row_names_a_task_of_a_split_by_its_index(servers):
    (_, url), _, _ = servers
    env = OrsEnvironment(env_id=ENV, url=url, tool="guess", split="test")
    assert env.reset(index=3)[0] == "Guess 1-16."
    assert env.step("4")[:3] == ("Correct! It was 4.", 1.0, True)  # test's task 3 is the secret 4
    with pytest.raises(ValueError, match="an int 'index'"):
        env.reset(secret=4)
    env.close()


def test_server_killed_mid_episode_fails_that_episode(servers):
    _, (pid, url), _ = servers
    env = OrsEnvironment(env_id=ENV, url=url, tool="guess", connect_timeout_s=1, message_timeout_s=1)
    env.reset(secret=5)
    stop_server(pid)
    start = time.monotonic()
    with pytest.raises(OrsServerError, match=f"ors server {url}: step failed"):
        env.step("8")
    with pytest.raises(OrsServerError, match="reset failed"):  # the next episode: still down
        env.reset(secret=5)
    assert time.monotonic() - start < 6
    env.close()


def test_a_frozen_server_fails_within_the_timeouts(servers):
    _, _, (pid, url) = servers
    env = OrsEnvironment(env_id=ENV, url=url, tool="guess", connect_timeout_s=1, message_timeout_s=1)
    env.reset(secret=5)
    os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(OrsServerError, match="step failed \\(timed out"):
        env.step("8")
    assert time.monotonic() - start < 3.5  # message_timeout_s, then a second at most to end the session
    with pytest.raises(OrsServerError, match="reset failed \\(timed out"):
        env.reset(secret=5)
    os.kill(pid, signal.SIGCONT)
    env.close()


def test_wrong_tool_bad_task_and_terminal_tool_are_errors(servers):
    (_, url), _, _ = servers
    env = OrsEnvironment(env_id=ENV, url=url, tool="shout")
    env.reset(secret=5)
    with pytest.raises(OrsServerError, match="no tool 'shout' \\(kwargs.tool\\)"):
        env.step("8")
    env = OrsEnvironment(env_id=ENV, url=url)  # no tool: the @terminal tool, which this environment has not
    env.reset(secret=5)
    with pytest.raises(OrsServerError, match="step failed \\(ToolCallError"):
        env.step("8")
    with pytest.raises(OrsServerError, match="reset failed"):  # the environment raises: no secret in the task
        env.reset(lo=1)
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "http://a"}, "environment.kwargs.env_id: ors needs the environment's name"),
        ({"env_id": "e"}, "environment.kwargs.url: ors needs exactly one of url"),
        ({"env_id": "e", "url": "http://a", "app": "m:f"}, "environment.kwargs.url: ors needs exactly one"),
        ({"env_id": "e", "url": "localhost:8080"}, "environment.kwargs.url: must be an http"),
        ({"env_id": "e", "app": "module_only"}, "environment.kwargs.app: must be a package.module:factory"),
        ({"env_id": "e", "url": "http://a", "tool": ""}, "environment.kwargs.tool: must be a non-empty str"),
        ({"env_id": "e", "url": "http://a", "port": 1}, "environment.kwargs.port: not a key of ors"),
        ({"env_id": "e", "url": "http://a", "message_timeout_s": 8}, "= 11 s must be under environment.step_timeout_s"),
    ],
)
def test_config_errors_name_the_key(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", "\\(")):
        check_environment_config(EnvironmentConfig(name="ors", kwargs=kwargs))


def test_roll_train_on_an_ors_server(tmp_path):
    from test_multi_turn_run import SMALL
    from test_resume import LOCAL, REPO, metrics, run

    args = [sys.executable, "-m", "roll_lite.cli", "--config", str(REPO / "examples/ors/guess.yaml"), *SMALL, LOCAL]
    args += ["steps=1", "sft.steps=0", "data.eval_files=null", "checkpoint.every=0"]
    args += ["environment.max_concurrent=1", f"output_dir={tmp_path}", "run_name=ors"]
    log = run(args).stderr
    assert "environment: ors in 1 process(es)" in log
    steps = [r for r in metrics(tmp_path / "ors") if r["step"] > 0]
    assert [r["step"] for r in steps] == [1]
    assert not any(key.startswith("env/faults") for r in steps for key in r)
