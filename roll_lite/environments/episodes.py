"""Multi-turn rollouts: many trajectories in flight, each alternating the engine's turns with its
environment's steps, built token in, token out (turns.py).

    episodes = run_episodes(engine, runner, tokenizer, starts, params, limits)

    loop = EpisodeLoop(engine, runner, tokenizer, params, limits).start(starts)
    loop.play(rounds=2)   # the fully async mode (pipelines/async_episodes.py) plays a batch in rounds
    loop.play()           # ... and to its end

A trajectory starts with its environment's reset; the first observation, chat-templated with the
generation prompt, is its prompt. Then, until it ends:

- the engine samples the model's turn (at most limits.max_new_tokens_per_turn tokens, and no more
  than the trajectory's token budget has left);
- the turn's text goes to the environment's step; its reward belongs to that turn;
- the trajectory ends when the environment says so (terminated / truncated), after
  limits.max_turns turns ("max_turns"), when the next observation would pass
  limits.max_trajectory_tokens ("token_budget"; the observation is then not added), or on a fault of
  its environment (runner.py: raised, timed_out, bad_return, bad_image, crashed, lost; bad_image also
  when the driver's processor cannot encode an observation's image);
- else the observation's tokens (turns.observation_ids) are appended. A turn that stopped without the
  end-of-turn token (it hit its token limit) gets that token first, as the environment's, so the
  chat template's continuation holds; it is never trained.

Concurrency: the environments step in the runner's processes while the engine generates. The
trajectories are split into two fixed cohorts (even and odd places in `starts`) that take turns: one
cohort's running trajectories generate, in one batch, while the other's environments step. Which
trajectories share a generation call, and the order of the calls, follow from `starts` and what the
environments answer, never from timing, so a run repeats bit for bit (the engine's sampling depends
on both). `overlap=False` is one cohort: every environment steps, then every running trajectory
generates, for comparison. A round is one pass over the cohorts; how many rounds run at a time does not
change what is played, only when.

A settled loop (no environment call in flight) saves its episodes and, for each running environment,
the runner's record of it (state_dict); a loop loaded from that on another runner has each of those
environments rebuilt by replaying its reset and actions (EnvironmentRunner.adopt).
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any, Hashable, Protocol, cast

from roll_lite.data.chat import as_messages, render_chat
from roll_lite.environments.images import BadImage, encode_messages, message_images
from roll_lite.environments.results import Result
from roll_lite.environments.turns import Trajectory, observation_ids, observation_inputs
from roll_lite.errors import ConfigError
from roll_lite.rollout.engine import Completions, SamplingParams, merge_routing

# How a trajectory ended. The first two are the environment's; the next two are the loop's limits.
ENDINGS = ("terminated", "truncated", "max_turns", "token_budget", "fault")
TRUNCATIONS = ("truncated", "max_turns", "token_budget")


class TurnEngine(Protocol):
    """What the loop needs of an engine: start a generation, then wait for it (the rollout client's
    start_generate / wait, or an in-process engine wrapped to return its Completions at once)."""

    def start_generate(self, prompts: list[list[int]], params: SamplingParams, *images: list) -> Any:
        """`images`, only with a vision-language policy's trajectories: [per prompt its image inputs or None]."""
        ...

    def result(self, handle: Any) -> Completions: ...


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_new_tokens_per_turn: int
    max_trajectory_tokens: int | None = None  # tokens after the prompt; None: no budget
    max_sequence_tokens: int | None = None  # prompt + response: the model's positions; None: no limit


@dataclass(frozen=True)
class EpisodeStart:
    key: Hashable  # e.g. (row, sample): the environment's id in the runner
    seed: int | None
    fields: dict = field(default_factory=dict)  # the dataset row's fields, passed to reset


@dataclass
class Episode:
    key: Hashable
    trajectory: Trajectory | None = None  # None when reset faulted: no prompt, nothing to train
    turn_rewards: list[float] = field(default_factory=list)  # the environment's reward for each model turn
    turn_ends: list[int] = field(default_factory=list)  # response index of each model turn's last token
    turn_texts: list[str] = field(default_factory=list)  # each model turn as the environment got it
    end: str | None = None  # one of ENDINGS, once over
    fault: str | None = None  # runner.FAULTS' reason, when end == "fault"
    error: str | None = None
    env_seconds: float = 0.0  # the environment's own time, reset and steps
    metrics: Counter = field(default_factory=Counter)  # the steps' info["metrics"], summed
    info: dict = field(default_factory=dict)  # the last step's info
    turn_versions: list[int] = field(default_factory=list)  # the engine's weight version that sampled each turn
    step_seconds: list[float] = field(default_factory=list)  # each environment call's: [0] the reset's
    step_metrics: list[dict] = field(default_factory=list)  # each step's info["metrics"] (the traces)

    @property
    def num_turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def truncated(self) -> bool:
        return self.end in TRUNCATIONS

    @property
    def env_return(self) -> float:
        return float(sum(self.turn_rewards))

    @property
    def response_tokens(self) -> int:
        return 0 if self.trajectory is None else len(self.trajectory.response_ids)


def run_episodes(
    engine: TurnEngine,
    runner,
    tokenizer,
    starts: list[EpisodeStart],
    params: SamplingParams,
    limits: EpisodeLimits,
    overlap: bool = True,
    processor=None,
) -> list[Episode]:
    """Run one episode per start to its end; the episodes in the order of `starts`. `params` gives
    the sampling (its max_new_tokens and num_samples are the loop's: one sample per turn). `processor`: a
    vision-language policy's, which renders the observations and their images (None: text only)."""
    loop = EpisodeLoop(engine, runner, tokenizer, params, limits, overlap, processor).start(starts)
    loop.play()
    return loop.results()


class EpisodeLoop:
    def __init__(
        self,
        engine,
        runner,
        tokenizer,
        params: SamplingParams,
        limits: EpisodeLimits,
        overlap: bool = True,
        processor=None,
    ):
        self.engine, self.runner, self.tokenizer, self.limits = engine, runner, tokenizer, limits
        self.processor = processor  # a vision-language policy's (environments/images.py); None: text only
        self.params = params
        self.cohorts = 2 if overlap else 1
        self.eos = tokenizer.eos_token_id
        self.episodes: dict[Hashable, Episode] = {}
        self.place: dict[Hashable, int] = {}  # each episode's place among the starts
        self.stepping: dict[Future, Hashable] = {}  # environment calls in flight
        self.waiting: list[Hashable] = []  # trajectories whose next model turn is due

    def start(self, starts: list[EpisodeStart]) -> EpisodeLoop:
        keys = [start.key for start in starts]
        if len(set(keys)) != len(keys):
            raise ValueError("run_episodes: every start needs its own key")
        self.place = {key: place for place, key in enumerate(keys)}
        # Reset cohort by cohort: the runner puts each reset on its least busy process, so every
        # process then hosts both cohorts and all of them step while either cohort generates.
        for start in sorted(starts, key=lambda start: self.place[start.key] % self.cohorts):
            self.episodes[start.key] = Episode(start.key)
            self.stepping[self.runner.submit_reset(start.key, start.seed, start.fields)] = start.key
        return self

    @property
    def done(self) -> bool:
        return not (self.stepping or self.waiting)

    def play(self, rounds: int | None = None) -> None:
        """`rounds` more rounds (each cohort: its environments answer, then its due turns generate), or
        until every episode has ended (None)."""
        played = 0
        while not self.done and (rounds is None or played < rounds):
            for cohort in range(self.cohorts):
                in_cohort = lambda key: self.place[key] % self.cohorts == cohort  # noqa: E731
                self._collect([future for future, key in self.stepping.items() if in_cohort(key)])
                turn = sorted((key for key in self.waiting if in_cohort(key)), key=self.place.__getitem__)
                if turn:
                    self.waiting = [key for key in self.waiting if not in_cohort(key)]
                    self._generate(turn)
            played += 1

    def results(self) -> list[Episode]:
        return sorted(self.episodes.values(), key=lambda episode: self.place[episode.key])

    def settle(self) -> None:
        """Take every environment answer in flight (in the episodes' order: what a next round would do)."""
        self._collect(sorted(self.stepping, key=lambda future: self.place[self.stepping[future]]))

    def state_dict(self) -> dict[str, Any]:
        """The settled loop: its episodes, the turns due, and the runner's record of each running environment."""
        self.settle()
        running = [key for key, episode in self.episodes.items() if episode.end is None]
        return {
            "place": self.place,
            "episodes": self.episodes,
            "waiting": self.waiting,
            "environments": {key: self.runner.record_of(key) for key in running},
        }

    def load_state_dict(self, state: dict[str, Any]) -> EpisodeLoop:
        self.place, self.episodes, self.waiting = state["place"], state["episodes"], state["waiting"]
        for key, record in state["environments"].items():
            self.runner.adopt(key, record)
        return self

    def _collect(self, calls: list[Future]) -> None:
        wait(calls)
        for future in calls:
            self._after_environment(self.episodes[self.stepping.pop(future)], future.result())

    def _after_environment(self, episode: Episode, result: Result) -> None:
        episode.env_seconds += result.seconds
        episode.step_seconds.append(result.seconds)
        if result.fault is not None:
            episode.end, episode.fault, episode.error = "fault", result.fault, result.error
            return
        if episode.trajectory is None:  # the reset
            try:
                prompt, images = self._prompt(as_messages(result.observation))
            except BadImage as error:
                return self._fault(episode, str(error))
            episode.trajectory = Trajectory(prompt, images=[images] if images is not None else [])
            if self._room(episode) < 1:
                raise ConfigError(
                    f"model.max_position_embeddings: the first observation of {episode.key!r} takes "
                    f"{len(prompt)} tokens, leaving no room for a model turn within "
                    f"{self.limits.max_sequence_tokens} positions"
                )
            self.waiting.append(episode.key)
            return
        episode.turn_rewards[-1] = result.reward
        episode.info = result.info
        episode.step_metrics.append(dict(result.info.get("metrics") or {}))
        for name, value in (result.info.get("metrics") or {}).items():
            episode.metrics[name] += value
        if result.terminated or result.truncated:
            episode.end = "terminated" if result.terminated else "truncated"
            return
        if episode.num_turns >= self.limits.max_turns:
            return self._stop(episode, "max_turns")
        continuation = [] if episode.trajectory.response_ids[-1] == self.eos else [self.eos]
        assert result.observation is not None  # None only when the call faulted (returned above)
        try:
            ids, images = self._observation(result.observation)
        except BadImage as error:
            return self._fault(episode, str(error))
        continuation += ids
        if self._room(episode) < len(continuation) + 1:  # the observation and one token of a next turn
            return self._stop(episode, "token_budget")
        episode.trajectory.add_observation(continuation, images)
        self.waiting.append(episode.key)

    def _prompt(self, messages: list[dict]) -> tuple[list[int], dict | None]:
        """The first observation's ids (and image inputs): a vision-language policy's through its processor."""
        if self.processor is not None:
            return encode_messages(self.processor, messages)
        self._no_images(messages)
        return render_chat(self.tokenizer, messages), None

    def _observation(self, observation) -> tuple[list[int], dict | None]:
        if self.processor is not None:
            return observation_inputs(self.processor, observation, self.eos)
        self._no_images(as_messages(observation))
        return observation_ids(self.tokenizer, observation, self.eos), None

    @staticmethod
    def _no_images(messages: list[dict]) -> None:
        if message_images(messages):
            raise BadImage(
                "the observation holds an image, but the policy reads no images (a vision-language policy does: "
                "model.model_type=qwen2_5_vl or qwen3_vl, docs/vision.md)"
            )

    def _stop(self, episode: Episode, end: str) -> None:
        episode.end = end
        self.runner.release(episode.key)

    def _fault(self, episode: Episode, error: str, fault: str = "bad_image") -> None:
        """A fault found here, in the driver (an observation's image the processor cannot encode): it ends
        that trajectory, as the runner's faults do."""
        episode.end, episode.fault, episode.error = "fault", fault, error
        self.runner.release(episode.key)

    def _room(self, episode: Episode) -> int:
        """Tokens the trajectory may still grow by: its budget's and the model's positions' rest."""
        budget, positions = self.limits.max_trajectory_tokens, self.limits.max_sequence_tokens
        room = 10**9 if budget is None else budget - episode.response_tokens
        if positions is not None:
            assert episode.trajectory is not None  # asked only once the reset made it
            room = min(room, positions - len(episode.trajectory.prompt_ids) - episode.response_tokens)
        return room

    def _generate(self, keys: list[Hashable]) -> None:
        # cast: a waiting episode has the trajectory its reset made
        trajectories = cast("list[Trajectory]", [self.episodes[key].trajectory for key in keys])
        allowed = [min(self.limits.max_new_tokens_per_turn, self._room(self.episodes[key])) for key in keys]
        p = self.params
        params = SamplingParams(max(allowed), 1, p.temperature, p.top_p, p.top_k, p.greedy)
        # a vision-language policy's trajectories: each with every image so far, beside ids that hold their tokens
        images = [[t.image_inputs for t in trajectories]] if any(t.images for t in trajectories) else []
        completions = self.engine.result(
            self.engine.start_generate([t.prompt_ids + t.response_ids for t in trajectories], params, *images)
        )
        for row, key in enumerate(keys):
            episode = self.episodes[key]
            ids = completions.token_ids[row][: allowed[row]]
            log_probs = (
                completions.log_probs[row][: allowed[row]] if completions.log_probs is not None else [0.0] * len(ids)
            )  # greedy (evaluation): nothing is trained
            if not ids:
                raise RuntimeError(f"the engine returned an empty turn for trajectory {key!r}")
            assert episode.trajectory is not None  # a waiting episode's, made by its reset
            if completions.routed_experts is not None:  # an MoE engine's routing (actor.router_replay)
                t = episode.trajectory
                context = len(t.prompt_ids) + len(t.response_ids)
                t.routed_experts = merge_routing(t.routed_experts, completions.routed_experts[row], context, len(ids))
            episode.trajectory.add_model_turn(ids, log_probs)
            episode.turn_ends.append(episode.response_tokens - 1)
            episode.turn_rewards.append(0.0)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            episode.turn_texts.append(text)
            episode.turn_versions.append(completions.weight_version)
            self.stepping[self.runner.submit_step(key, text)] = key
