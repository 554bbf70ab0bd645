"""roll_lite/environments/: the environment runner for real, on a user's module of scripted environments:
fault isolation (environment processes that raise, hang, return the wrong things and die), concurrency,
and environments by name or import path. The contract's checks, guess_the_number, the config and GEM:
tests/test_environments.py."""

import time

import pytest
from user_modules import user_module as user_module_named

from roll_lite.environments import ENVIRONMENTS, EnvironmentRunner, resolve_environment
from roll_lite.environments.guess_the_number import GuessTheNumber

SCRIPTED = '''
import math, os, random, signal, time

class Scripted:
    """Each action says what step does; a normal step's observation counts the turns since reset."""

    def __init__(self, tag="t"):
        self.tag = tag

    def reset(self, seed=None, **fields):
        if fields.get("on_reset") == "raise":
            raise ValueError("no episode today")
        if fields.get("on_reset") == "bad":
            return "just an observation"
        self.seed, self.turn = seed, 0
        if fields.get("chat"):
            return [{"role": "user", "content": f"start {seed}"}], {}
        return f"{self.tag} start {seed}", {"fields": sorted(fields)}

    def step(self, action):
        self.turn += 1
        if action == "raise":
            raise RuntimeError("boom")
        if action == "exit":
            sys.exit(2)
        if action == "hang":
            time.sleep(600)
        if action == "os_exit":
            os._exit(3)
        if action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action.startswith("sleep "):
            time.sleep(float(action.split()[1]))
        bad = {
            "nan": ("x", math.nan, False, False, {}),
            "old_gym": ("x", 0.0, False, {}),
            "int_flag": ("x", 0.0, 1, False, {}),
            "str_reward": ("x", "1", False, False, {}),
            "number_obs": (42, 0.0, False, False, {}),
            "no_role": ([{"content": "hi"}], 0.0, False, False, {}),
            "list_info": ("x", 0.0, False, False, []),
            "lambda_info": ("x", 0.0, False, False, {"f": lambda: 0}),
            "none": None,
        }
        if action in bad:
            return bad[action]
        if action == "win":
            return "won", 1.0, True, False, {}
        return f"{self.seed}:{self.turn}:{action}", 0.5, False, False, {"turn": self.turn}


class Unseeded(Scripted):
    """Its episodes do not follow from the seed: a replay cannot rebuild one."""

    def reset(self, seed=None, **fields):
        self.seed, self.turn = random.random(), 0
        return f"start {self.seed}", {}


class NoStep:
    def reset(self, seed=None):
        return "x", {}
'''


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    """A user's module of environments, importable here and (through sys.path) in the runner's processes."""
    with user_module_named(tmp_path_factory, "user_envs", "import sys\n" + SCRIPTED) as name:
        yield name


# -- the runner ----------------------------------------------------------------------------------


def test_environments_by_name_and_by_import_path(user_module):
    assert {"guess_the_number", "gem"} <= set(ENVIRONMENTS)
    assert resolve_environment("guess_the_number") is GuessTheNumber
    assert resolve_environment(f"{user_module}:Scripted").__name__ == "Scripted"
    with pytest.raises(KeyError, match="unknown environment 'nope'; registered: color_cards, gem, guess_the_number"):
        resolve_environment("nope")
    with pytest.raises(TypeError, match="has no step"):
        resolve_environment(f"{user_module}:NoStep")
    with pytest.raises(TypeError, match="is a function, not a class"):
        resolve_environment("roll_lite.environments.guess_the_number:read_guess")


def test_each_fault_ends_only_its_trajectory_and_the_others_go_on(user_module):
    faults = {
        0: "raise",
        1: "hang",
        2: "nan",
        3: "os_exit",
        4: "old_gym",
        5: "exit",
        6: "lambda_info",
        7: "sigkill",
        8: "int_flag",
        9: "number_obs",
    }
    survivors = list(range(10, 16))
    with EnvironmentRunner(f"{user_module}:Scripted", {"tag": "s"}, max_concurrent=2, step_timeout_s=0.5) as runner:
        first = runner.reset_many([(i, 100 + i, {}) for i in [*faults, *survivors]])
        assert [r.observation for r in first] == [f"s start {100 + i}" for i in [*faults, *survivors]]
        runner.step_many([(i, "go") for i in survivors])
        results = runner.step_many([*faults.items(), *[(i, "go") for i in survivors]])
        by_id = {r.env_id: r for r in results}
        expected = {
            0: ("raised", "RuntimeError: boom"),
            1: ("timed_out", "no result within step_timeout_s=0.5 s"),
            2: ("bad_return", "step's reward is nan"),
            3: ("crashed", "the environment process died with exit code 3"),
            4: ("bad_return", "step returned 4 values (the old gym API"),
            5: ("raised", "SystemExit: 2"),
            6: ("bad_return", "its return does not pickle: "),
            7: ("crashed", "the environment process was killed by SIGKILL"),
            8: ("bad_return", "step's terminated is a int (1), not a bool"),
            9: ("bad_return", "step's observation is a int (42)"),
        }
        for i, (fault, error) in expected.items():
            result = by_id[i]
            assert (result.fault, result.error[: len(error)]) == (fault, error), result
            assert result.done and result.observation is None and result.reward == 0.0
        for i in survivors:  # their processes were restarted 3 times; each restart replayed their instances
            assert (by_id[i].observation, by_id[i].reward, by_id[i].fault) == (f"{100 + i}:2:go", 0.5, None)
        assert sorted(runner.running()) == survivors
        assert runner.stats["restarts"] == 3 and runner.stats["replays"] >= 3
        assert {key: n for key, n in runner.stats.items() if key.startswith("faults/")} == {
            "faults/raised": 2,
            "faults/timed_out": 1,
            "faults/bad_return": 5,
            "faults/crashed": 2,
        }

        # and it keeps working: the survivors go on, the faulted ones start new episodes
        again = runner.step_many([(i, "more") for i in survivors])
        assert [r.observation for r in again] == [f"{100 + i}:3:more" for i in survivors]
        restarted = runner.reset_many([(i, 7, {}) for i in faults])
        assert all(r.fault is None for r in restarted)
        assert [r.observation for r in runner.step_many([(i, "go") for i in faults])] == ["7:1:go"] * len(faults)


def test_a_reset_that_faults_ends_that_trajectory_and_the_calls_out_of_order_are_refused(user_module):
    with EnvironmentRunner(f"{user_module}:Scripted", max_concurrent=1, step_timeout_s=2.0) as runner:
        results = runner.reset_many(
            [
                (0, 1, {"on_reset": "raise"}),
                (1, 2, {"on_reset": "bad"}),
                (2, 3, {"b": 1, "a": 2}),
                (3, 4, {"chat": True}),
            ]
        )
        assert [(r.fault, r.error) for r in results[:2]] == [
            ("raised", "ValueError: no episode today"),
            ("bad_return", "reset returned a str ('just an observation'), not a tuple (observation, info)"),
        ]
        assert (results[2].observation, results[2].info) == ("t start 3", {"fields": ["a", "b"]})
        assert results[3].observation == [{"role": "user", "content": "start 4"}]
        assert sorted(runner.running()) == [2, 3]
        with pytest.raises(ValueError, match=r"environment 0 is not running \(done\)"):
            runner.submit_step(0, "go")
        with pytest.raises(ValueError, match="environment 2 is still running; release it"):
            runner.submit_reset(2)
        future = runner.submit_step(2, "sleep 0.2")
        with pytest.raises(ValueError, match="environment 2 has a call in flight"):
            runner.submit_step(2, "go")
        assert future.result().observation == "3:1:sleep 0.2"
        assert runner.step_many([(2, "win")])[0].terminated
        runner.release(3)  # the caller ends it (its turns or tokens are spent)
        assert runner.running() == []
        assert runner.reset_many([(3, 9, {})])[0].observation == "t start 9"


def test_a_trajectory_whose_replay_differs_is_lost(user_module):
    with EnvironmentRunner(f"{user_module}:Unseeded", max_concurrent=1, step_timeout_s=0.5) as runner:
        runner.reset_many([(0, 0, {}), (1, 1, {})])
        hung, neighbour = runner.step_many([(0, "hang"), (1, "go")])
        assert hung.fault == "timed_out"
        assert (neighbour.fault, neighbour.error) == (
            "lost",
            "its process was restarted for another environment's fault; replaying reset gave another "
            "observation (not deterministic given its seed?)",
        )
        assert runner.stats["faults/lost"] == 1 and runner.running() == []


def test_steps_run_concurrently_and_results_come_as_they_are_ready(user_module):
    with EnvironmentRunner(f"{user_module}:Scripted", max_concurrent=4, step_timeout_s=5.0) as runner:
        runner.reset_many([(i, i, {}) for i in range(4)])
        started = time.monotonic()
        results = runner.step_many([(i, "sleep 0.5") for i in range(4)])
        elapsed = time.monotonic() - started
        assert all(r.fault is None and r.seconds >= 0.5 for r in results)  # each slept its 0.5 s
        assert elapsed < 1.25, f"4 steps of 0.5 s on 4 processes took {elapsed:.2f} s"

        slow, fast = runner.submit_step(0, "sleep 1.0"), runner.submit_step(1, "go")
        assert fast.result(timeout=0.8).observation == "1:2:go" and not slow.done()
        assert slow.result().observation == "0:2:sleep 1.0"


def test_the_runner_refuses_to_start_on_an_environment_it_cannot_build(user_module):
    with pytest.raises(
        RuntimeError,
        match=r"environment 'guess_the_number' \(kwargs \{'hi': 0\}\): cannot build it in "
        r"the environment process: ValueError: lo \(1\) is above hi \(0\)",
    ):
        EnvironmentRunner("guess_the_number", {"hi": 0}, max_concurrent=1)
    with pytest.raises(
        RuntimeError, match=f"cannot build it in the environment process: TypeError: '{user_module}:NoStep' has no step"
    ):
        EnvironmentRunner(f"{user_module}:NoStep", max_concurrent=1)
