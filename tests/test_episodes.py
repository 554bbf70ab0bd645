"""The multi-turn rollout loop (roll_lite/environments/episodes.py) with a scripted engine and real
environment processes: token in, token out; how trajectories end; faults cost one trajectory; the
scheduling changes nothing but the batching."""

from __future__ import annotations

import re

import pytest
from user_modules import user_module as user_module_named

from roll_lite.environments import EnvironmentRunner
from roll_lite.environments.episodes import EpisodeLimits, EpisodeStart, run_episodes
from roll_lite.environments.guess_the_number import GuessTheNumber
from roll_lite.errors import ConfigError
from roll_lite.model.tokenizer import load_tokenizer
from roll_lite.rollout import Completions, SamplingParams

TOKENIZER = load_tokenizer(None, "compact")
EOS = TOKENIZER.eos_token_id
NEWLINE = TOKENIZER("\n", add_special_tokens=False)["input_ids"][0]
PARAMS = SamplingParams(max_new_tokens=99, temperature=1.0)

FAULTY = '''
import random, time

from roll_lite.environments.guess_the_number import GuessTheNumber


class Jittery(GuessTheNumber):
    """guess_the_number whose steps take a random 0-20 ms (not seeded: a different timing every run)."""

    def step(self, action):
        time.sleep(random.SystemRandom().uniform(0, 0.02))
        return super().step(action)


class Faulty(GuessTheNumber):
    """guess_the_number whose step raises at turn `boom_at` of the rows that have it."""

    def reset(self, seed=None, secret=None, boom_at=None):
        self.boom_at = boom_at
        return super().reset(seed=seed, secret=secret)

    def step(self, action):
        if self.boom_at is not None and self.turn + 1 == self.boom_at:
            raise RuntimeError("the environment broke")
        return super().step(action)
'''


@pytest.fixture(scope="module")
def faulty_module(tmp_path_factory):
    with user_module_named(tmp_path_factory, "faulty_envs", FAULTY) as name:
        yield name


class BisectingEngine:
    """Plays guess-the-number by bisection, reading the conversation from the prompt it is given;
    each reply is its digits then <eos> (cut to max_new_tokens), with made-up log-probs. It records
    what it returned, and the batch size of every call."""

    def __init__(self, lo=1, hi=16, suffix=""):
        self.lo, self.hi, self.suffix = lo, hi, suffix
        self.returned: list[tuple[list[int], list[float]]] = []
        self.batches: list[int] = []
        self.calls: list[list[list[int]]] = []  # the prompts of every call

    def start_generate(self, prompts, params):
        self.batches.append(len(prompts))
        self.calls.append([list(p) for p in prompts])
        ids, log_probs = [], []
        for prompt in prompts:
            text = TOKENIZER.decode(prompt, skip_special_tokens=True)
            lo, hi = self.lo, self.hi
            for word, number in re.findall(r"(Higher|Lower) than (\d+)", text):
                lo, hi = (max(lo, int(number) + 1), hi) if word == "Higher" else (lo, min(hi, int(number) - 1))
            reply = TOKENIZER(str((lo + hi) // 2) + self.suffix, add_special_tokens=False)["input_ids"] + [EOS]
            reply = reply[: params.max_new_tokens]
            ids.append(reply)
            log_probs.append([-0.01 * (len(self.returned) + i + 1) for i in range(len(reply))])
            self.returned.append((ids[-1], log_probs[-1]))
        return Completions(ids, log_probs)

    def result(self, handle):
        return handle


def play(engine, starts, limits, name="guess_the_number", kwargs=None, overlap=True, max_concurrent=2):
    kwargs = {"lo": 1, "hi": 16, "max_turns": 6} if kwargs is None else kwargs
    with EnvironmentRunner(name, kwargs, max_concurrent=max_concurrent, step_timeout_s=10) as runner:
        return run_episodes(engine, runner, TOKENIZER, starts, PARAMS, limits, overlap=overlap)


def starts_for(secrets, **fields):
    return [EpisodeStart(i, seed=i, fields={"secret": s, **fields}) for i, s in enumerate(secrets)]


def test_trained_tokens_are_exactly_the_engines_and_the_sequence_is_the_templates():
    engine, secrets = BisectingEngine(), [1, 8, 11, 16]
    episodes = play(engine, starts_for(secrets), EpisodeLimits(max_turns=6, max_new_tokens_per_turn=4))
    by_ids = {}
    for ids, log_probs in engine.returned:
        by_ids.setdefault(tuple(ids), []).append(log_probs)
    for episode in episodes:
        assert episode.end == "terminated" and episode.env_return == 1.0 and episode.turn_rewards[-1] == 1.0
        t = episode.trajectory
        model_turns = [(ids, lps) for ids, lps in t.pieces if lps is not None]
        assert len(model_turns) == episode.num_turns
        for ids, lps in model_turns:  # each trained turn is one of the engine's replies, ids and log-probs
            assert lps in by_ids[tuple(ids)]
        trained = [tok for tok, m in zip(t.response_ids, t.model_mask) if m]
        assert trained == [tok for ids, _ in model_turns for tok in ids]
        # the whole sequence is the chat template's rendering of the conversation, replayed here on a
        # local instance: no re-tokenizing drift
        env = GuessTheNumber(lo=1, hi=16, max_turns=6)
        messages = [{"role": "user", "content": env.reset(secret=secrets[episode.key])[0]}]
        for text in episode.turn_texts:
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": env.step(text)[0]}]
        rendered = list(TOKENIZER.apply_chat_template(messages[:-1], tokenize=True, return_dict=False))
        assert t.prompt_ids + t.response_ids + [NEWLINE] == rendered
        assert [t.response_ids[end] for end in episode.turn_ends] == [EOS] * episode.num_turns
    assert [e.num_turns for e in episodes] == [
        4,
        1,
        4,
        5,
    ]  # bisection of 1..16: 8 4 2 1 / 8 / 8 12 10 11 / 8 12 14 15 16


def test_a_turn_cut_at_its_token_limit_gets_the_end_of_turn_token_as_the_environments():
    engine = BisectingEngine(suffix="!!!!")  # "8!!!!<eos>" is cut to 3 tokens
    (episode,) = play(engine, starts_for([12]), EpisodeLimits(max_turns=6, max_new_tokens_per_turn=3))
    t = episode.trajectory
    first_turn, observation = t.pieces[0], t.pieces[1]
    assert first_turn[0] == TOKENIZER("8!!", add_special_tokens=False)["input_ids"] and first_turn[1] is not None
    assert observation[0][0] == EOS and observation[1] is None  # untrained
    assert episode.turn_texts[0] == "8!!"


@pytest.mark.parametrize(
    "limits, kwargs, end, turns",
    [
        (EpisodeLimits(max_turns=2, max_new_tokens_per_turn=4), None, "max_turns", 2),  # the loop's turn limit
        (EpisodeLimits(max_turns=9, max_new_tokens_per_turn=4), {"lo": 1, "hi": 16, "max_turns": 2}, "truncated", 2),
        (EpisodeLimits(max_turns=9, max_new_tokens_per_turn=4, max_trajectory_tokens=30), None, "token_budget", 2),
        (EpisodeLimits(max_turns=9, max_new_tokens_per_turn=4, max_sequence_tokens=150), None, "token_budget", 1),
    ],
)
def test_how_a_trajectory_that_does_not_finish_ends(limits, kwargs, end, turns):
    (episode,) = play(BisectingEngine(), starts_for([1]), limits, kwargs=kwargs)
    assert (episode.end, episode.num_turns, episode.truncated) == (end, turns, True)
    budget = limits.max_trajectory_tokens or 10**9
    assert episode.response_tokens <= budget
    if limits.max_sequence_tokens:
        assert len(episode.trajectory.prompt_ids) + episode.response_tokens <= limits.max_sequence_tokens
    assert episode.trajectory.pieces[-1][1] is not None  # it ends with the model's turn: no observation left dangling


def test_a_first_observation_longer_than_the_models_positions_is_a_config_error():
    with pytest.raises(ConfigError, match="model.max_position_embeddings"):
        play(
            BisectingEngine(),
            starts_for([1]),
            EpisodeLimits(max_turns=2, max_new_tokens_per_turn=4, max_sequence_tokens=50),
        )


def test_a_fault_ends_its_trajectory_only(faulty_module):
    starts = starts_for([1, 5, 9, 13])
    starts[1] = EpisodeStart(1, seed=1, fields={"secret": 5, "boom_at": 2})
    episodes = play(
        BisectingEngine(), starts, EpisodeLimits(max_turns=6, max_new_tokens_per_turn=4), name=f"{faulty_module}:Faulty"
    )
    broken = episodes[1]
    assert (broken.end, broken.fault, broken.num_turns) == ("fault", "raised", 2)
    assert "the environment broke" in broken.error
    assert [e.end for e in episodes[:1] + episodes[2:]] == ["terminated"] * 3


def test_the_scheduling_changes_the_batching_not_the_episodes():
    secrets = [1, 3, 6, 8, 9, 12, 15, 16]
    limits = EpisodeLimits(max_turns=6, max_new_tokens_per_turn=4)
    plain, overlapped = BisectingEngine(), BisectingEngine()
    lockstep = play(plain, starts_for(secrets), limits, overlap=False)
    cohorts = play(overlapped, starts_for(secrets), limits, overlap=True)
    for a, b in zip(lockstep, cohorts):
        ta, tb = a.trajectory, b.trajectory  # the scripted log-probs count calls, so they differ
        assert (ta.prompt_ids, ta.response_ids, ta.model_mask, a.end) == (
            tb.prompt_ids,
            tb.response_ids,
            tb.model_mask,
            b.end,
        )
    assert sum(plain.batches) == sum(overlapped.batches) == sum(e.num_turns for e in lockstep)
    assert max(plain.batches) == len(secrets)  # lockstep: every running trajectory in one call
    assert max(overlapped.batches) == len(secrets) // 2  # two cohorts take turns


def test_the_generation_calls_follow_from_the_starts_not_from_the_environments_timing(faulty_module):
    """The engine's sampling depends on which trajectories share a call and on the calls' order; with
    environments whose steps take random times, both are the same run after run."""
    engines = [BisectingEngine(), BisectingEngine()]
    for engine in engines:
        play(
            engine,
            starts_for([2, 5, 7, 9, 11, 14]),
            EpisodeLimits(max_turns=6, max_new_tokens_per_turn=4),
            name=f"{faulty_module}:Jittery",
            max_concurrent=3,
        )
    assert engines[0].calls == engines[1].calls


def test_step_metrics_are_summed_per_trajectory(faulty_module):
    episodes = play(
        BisectingEngine(),
        starts_for([3]),
        EpisodeLimits(max_turns=6, max_new_tokens_per_turn=4),
        name="tools",
        kwargs={
            "env": "guess_the_number",
            "env_kwargs": {"lo": 1, "hi": 16},
            "tools": ["roll_lite.environments.example_tools:calculator"],
        },
    )
    assert episodes[0].end == "terminated"
    assert episodes[0].metrics == {"tool_calls": 0, "tool_errors": 0}


def test_every_environment_process_hosts_both_cohorts():
    """So that all processes step while either cohort generates (with resets placed round-robin in
    the starts' order, an even max_concurrent put each cohort on half of them)."""
    with EnvironmentRunner("guess_the_number", {"lo": 1, "hi": 16}, max_concurrent=4, step_timeout_s=10) as runner:
        run_episodes(
            BisectingEngine(),
            runner,
            TOKENIZER,
            starts_for([5] * 16),
            PARAMS,
            EpisodeLimits(max_turns=1, max_new_tokens_per_turn=4),
        )
        process_of = {key: record.process for key, record in runner._records.items()}
    for cohort in (0, 1):
        assert sorted({process_of[key] for key in range(16) if key % 2 == cohort}) == [0, 1, 2, 3]
