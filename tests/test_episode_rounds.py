"""EpisodeLoop played in rounds (the fully async mode's later batches, pipelines/async_episodes.py): the
same engine calls and episodes as one run to the end, however the rounds are cut; a loop saved between
rounds and loaded on another runner replays its environments and goes on as if never stopped."""

from __future__ import annotations

import pickle
import sys

from test_episodes import TOKENIZER, BisectingEngine, faulty_module, starts_for  # noqa: F401 (a fixture)

from roll_lite.environments import EnvironmentRunner
from roll_lite.environments.episodes import EpisodeLimits, EpisodeLoop, run_episodes
from roll_lite.rollout import Completions, SamplingParams

PARAMS = SamplingParams(max_new_tokens=99, temperature=1.0)
LIMITS = EpisodeLimits(max_turns=6, max_new_tokens_per_turn=4)
SECRETS = [1, 3, 6, 8, 9, 12, 15, 16]
GAME = {"lo": 1, "hi": 16, "max_turns": 6}


class VersionedEngine(BisectingEngine):
    """BisectingEngine whose completions carry the weight version it holds."""

    version = 0

    def start_generate(self, prompts, params):
        completions = super().start_generate(prompts, params)
        return Completions(completions.token_ids, completions.log_probs, weight_version=self.version)


def runner(name="guess_the_number"):
    return EnvironmentRunner(name, GAME, max_concurrent=2, step_timeout_s=10)


def summary(episodes):
    return [
        (e.key, e.trajectory.prompt_ids, e.trajectory.pieces, e.turn_rewards, e.turn_versions, e.end) for e in episodes
    ]


def test_played_in_rounds_a_loop_makes_the_calls_and_episodes_of_one_run_to_the_end():
    whole = VersionedEngine()
    with runner() as environments:
        expected = run_episodes(whole, environments, TOKENIZER, starts_for(SECRETS), PARAMS, LIMITS)
    for cuts in ([1] * 10, [2, 3, 9], [4, 1]):
        engine = VersionedEngine()
        with runner() as environments:
            loop = EpisodeLoop(engine, environments, TOKENIZER, PARAMS, LIMITS).start(starts_for(SECRETS))
            for rounds in cuts:
                loop.play(rounds)
            loop.play()
            assert loop.done
            assert engine.calls == whole.calls
            assert summary(loop.results()) == summary(expected)


def test_each_turn_keeps_the_weight_version_that_sampled_it():
    engine = VersionedEngine()
    with runner() as environments:
        loop = EpisodeLoop(engine, environments, TOKENIZER, PARAMS, LIMITS).start(starts_for(SECRETS))
        for version in range(6):
            engine.version = version
            loop.play(1)
        episodes = loop.results()
    assert all(e.turn_versions == list(range(e.num_turns)) for e in episodes)  # one turn per round
    assert max(e.num_turns for e in episodes) > 2


def test_a_loop_saved_between_rounds_and_loaded_on_a_new_runner_goes_on_as_if_never_stopped(faulty_module):
    name = f"{faulty_module}:Jittery"  # steps take random times: the replay does not depend on them
    whole = VersionedEngine()
    with runner(name) as environments:
        expected = run_episodes(whole, environments, TOKENIZER, starts_for(SECRETS), PARAMS, LIMITS)

    first = VersionedEngine()
    with runner(name) as environments:
        loop = EpisodeLoop(first, environments, TOKENIZER, PARAMS, LIMITS).start(starts_for(SECRETS))
        loop.play(2)
        saved = pickle.dumps(loop.state_dict())  # a checkpoint's copy: nothing shared with this runner
    assert not loop.done

    second = VersionedEngine()
    second.returned = list(first.returned)  # its made-up log-probs count the calls made before
    with runner(name) as environments:
        resumed = EpisodeLoop(second, environments, TOKENIZER, PARAMS, LIMITS).load_state_dict(pickle.loads(saved))
        resumed.play()
        replays = environments.stats["replays"]
    assert first.calls + second.calls == whole.calls
    assert summary(resumed.results()) == summary(expected)
    running = sum(e.end is None for e in loop.episodes.values())
    assert replays == running > 0  # each environment still running was rebuilt once


def test_an_environment_whose_replay_differs_ends_as_lost_and_the_others_go_on(tmp_path):
    """Row 0's secret comes from a file that changes between the save and the resume (an environment
    with outside state): its replay answers the first guess otherwise, and it alone ends, as lost."""
    secret = tmp_path / "secret.txt"
    (tmp_path / "outside_state_envs.py").write_text(
        "from pathlib import Path\n"
        "from roll_lite.environments.guess_the_number import GuessTheNumber\n\n\n"
        "class OutsideState(GuessTheNumber):\n"
        "    def reset(self, seed=None, secret=None):\n"
        f"        if secret == 0:\n"
        f"            secret = int(Path({str(secret)!r}).read_text())\n"
        "        return super().reset(seed=seed, secret=secret)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        secret.write_text("1")
        with runner("outside_state_envs:OutsideState") as environments:
            loop = EpisodeLoop(VersionedEngine(), environments, TOKENIZER, PARAMS, LIMITS)
            loop.start(starts_for([0, 8, 9, 12])).play(1)
            saved = pickle.dumps(loop.state_dict())
        secret.write_text("16")
        with runner("outside_state_envs:OutsideState") as environments:
            resumed = EpisodeLoop(VersionedEngine(), environments, TOKENIZER, PARAMS, LIMITS)
            resumed.load_state_dict(pickle.loads(saved)).play()
    finally:
        sys.path.remove(str(tmp_path))
    ends = {e.key: (e.end, e.fault) for e in resumed.results()}
    assert ends == {0: ("fault", "lost"), 1: ("terminated", None), 2: ("terminated", None), 3: ("terminated", None)}
    assert "replaying step 1 gave another result" in resumed.episodes[0].error
