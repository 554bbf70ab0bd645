"""MultiTurnPipeline: PPOPipeline whose rollouts are multi-turn trajectories with an environment
(config `environment`, roll_lite/environments/), trained on the model's own tokens only.

    pipeline: roll_lite.pipelines.multi_turn:MultiTurnPipeline
    environment: {name: guess_the_number, max_turns: 8}

The step is PPOPipeline's; what differs is its first part. A training row seeds an environment (its
fields go to reset; its `seed` field, else one derived from data.seed and the row's index, seeds it,
the same for every sample of the row, so a GRPO group plays one task). The trajectories run
(roll_lite/environments/episodes.py) with the rollout engine; the batch holds model_mask, the
model's sampled tokens, which is loss_mask_keys' mask, so every loss and every global denominator
counts exactly those tokens. Rewards: each step's reward on the last token of the model turn it
answered (+ reward.functions on the last turn with environment.final_reward; a trajectory they
leave unscored under reward.on_failure=drop leaves the loss and its group's baseline, counted in
reward/dropped, as single-turn). Faults and truncation as environment.on_fault / environment.truncated
say; each is counted (env/...). data.domain_weights draws the rows by their domain field, as single-turn.
A vision-language policy's environments may show images (docs/vision.md): the processor expands each once as
its observation joins the trajectory, and the batch carries each trajectory's images (image_inputs).
"""

from __future__ import annotations

import logging
from collections import Counter
from functools import cached_property
from typing import TYPE_CHECKING, cast

import torch

from roll_lite.config import ConfigError, RunConfig
from roll_lite.data import DataProto
from roll_lite.data.domain_sampler import check_row_domains
from roll_lite.data.files import read_table
from roll_lite.data.sequences import response_aligned
from roll_lite.environments.episodes import Episode, EpisodeLimits, EpisodeLoop, EpisodeStart, run_episodes
from roll_lite.environments.seeds import derived_seed
from roll_lite.environments.turns import trajectory_batch
from roll_lite.loss.advantages import turn_level_advantages
from roll_lite.rollout import SamplingParams

from .async_episodes import FullyAsyncEpisodes, turn_token_versions
from .ppo import PPOPipeline

if TYPE_CHECKING:
    from roll_lite.environments import EnvironmentRunner
    from roll_lite.environments.turns import Trajectory

    from .sft import SFTPipeline

logger = logging.getLogger("roll_lite")


class MultiTurnPipeline(PPOPipeline):
    loss_mask_key = "model_mask"
    checkpoint_compat_keys = PPOPipeline.checkpoint_compat_keys + ("environment.name",)

    def __init__(self, config: RunConfig):
        if config.environment.name is None:
            raise ConfigError(
                "environment.name: MultiTurnPipeline needs an environment (e.g. environment.name="
                "guess_the_number); for single-turn runs use roll_lite.pipelines.ppo:PPOPipeline"
            )
        for key in ("domains", "code"):
            if getattr(config.reward, key):
                raise ConfigError(
                    f"reward.{key}: MultiTurnPipeline does not score with domains or code yet (its rows "
                    "hold whole trajectories); score with reward.functions, reward models, judges or the "
                    "environment's rewards"
                )
        if (config.reward.models or config.reward.judges) and not config.environment.final_reward:
            raise ConfigError(
                "environment.final_reward: reward.models and reward.judges score a trajectory's last turn, "
                "which needs environment.final_reward=true"
            )
        if config.reward.on_failure == "drop" and not config.environment.final_reward:
            raise ConfigError(
                "reward.on_failure: drop acts on what reward.functions, models and judges leave unscored, and a "
                "multi-turn run scores with them only with environment.final_reward=true; the environment's "
                "own faults are environment.on_fault's"
            )
        super().__init__(config)
        if config.rollout.fully_async:  # later batches play while a step trains (pipelines/async_episodes.py)
            self.schedule = FullyAsyncEpisodes(config.rollout, self.cohort_loop)
        self.environments: EnvironmentRunner | None = None  # in the driver, from start_workers to the end of run()
        self.episodes: list[Episode] = []  # the step's episodes, and those of them in its batch
        self.kept: list[Episode] = []

    # -- data: rows that seed environments ---------------------------------------------------------

    def read_data(self) -> tuple[list[dict], list[dict] | None]:
        """The rows of data.train_files and data.eval_files (None without): each seeds an environment."""
        d = self.config.data
        train: list[dict] = []
        for path in d.train_files:
            table = read_table(path, "data.train_files")
            if d.domain_weights:
                check_row_domains(table, d)
            train += table.rows
        held_out = [row for path in d.eval_files for row in read_table(path, "data.eval_files").rows]
        return train, held_out or None

    def longest_sequences(self) -> tuple[int, int]:
        """The prompts are the environments' first observations, known only once they reset; the loop
        keeps each trajectory within the model's positions (EpisodeLimits.max_sequence_tokens)."""
        self.prepare_data()
        return 1, cast("SFTPipeline", self.warm_start_sft).longest_sequences()[1] if self.config.sft.steps else 0

    def start_workers(self) -> None:
        from roll_lite.environments import EnvironmentRunner

        super().start_workers()
        self.environments = EnvironmentRunner.from_config(self.config.environment)
        logger.info(
            "environment: %s in %d process(es)", self.config.environment.name, self.config.environment.max_concurrent
        )

    def run(self) -> list[dict]:
        try:
            return super().run()
        finally:
            if isinstance(self.schedule, FullyAsyncEpisodes):
                self.schedule.stop()
            if self.environments is not None:
                self.environments.close()
                self.environments = None

    # -- rollout ------------------------------------------------------------------------------------

    def draw_prompts(self) -> tuple[list[int], list[list[int]]] | None:
        """The fully async mode's next rows (their prompts are the environments' first observations);
        None otherwise: collect_rollout plays the step's episodes (rollout.async_steps=0)."""
        assert self.sampler is not None  # prepare_data() made it
        if not self.config.rollout.fully_async:
            return None
        rows = self.sampler.draw(self.config.rollout.prompts_per_step)
        return (rows, []) if rows else None

    def collect_rollout(self, step: int) -> tuple[DataProto, int]:
        if isinstance(self.schedule, FullyAsyncEpisodes):
            if not self.schedule.is_launched(step):
                raise RuntimeError(
                    f"step {step}: the training rows are used up (data.epochs={self.config.data.epochs})"
                )
            _, self.episodes = self.schedule.collect(step)
            batch = self.episode_batch(self.episodes, step)
            # response_mask covers every token after the prompt, the environment's too (-1 there)
            versions = response_aligned(batch["response_mask"], [turn_token_versions(e) for e in self.kept], fill=-1)
            batch.batch["rollout_versions"] = versions
            oldest = versions[batch["model_mask"].bool()].min().item()
            return batch, step - 1 - int(oldest)
        assert self.sampler is not None  # prepare_data() made it
        rows = self.sampler.draw(self.config.rollout.prompts_per_step)
        if not rows:
            raise RuntimeError(f"step {step}: the training rows are used up (data.epochs={self.config.data.epochs})")
        self.episodes = self.play([self.train_data[row] for row in rows], rows, self.sampling_params(), "train")
        return self.episode_batch(self.episodes, step), 0

    def cohort_loop(self, cohort: int, rows: list[int] | None) -> EpisodeLoop:
        """The fully async mode's EpisodeLoop of step `cohort`'s rows (their resets submitted), or an empty
        one for a checkpoint to fill (rows None). Keys (split, row, sample, cohort): a row may be in two
        batches in flight."""
        loop = EpisodeLoop(
            _EngineCalls(self.rollout),
            self.environments,
            self.tokenizer,
            self.sampling_params(),
            self.limits,
            processor=self.processor,
        )
        if rows is None:
            return loop
        samples = range(self.config.rollout.num_samples)
        seeds = [self.environment_seed(self.train_data[row], row, "train") for row in rows]
        return loop.start(
            [
                EpisodeStart(("train", row, sample, cohort), seed, dict(self.train_data[row]))
                for row, seed in zip(rows, seeds)
                for sample in samples
            ]
        )

    def play(self, rows: list[dict], row_ids: list[int], params: SamplingParams, split: str) -> list[Episode]:
        """Every row's `params.num_samples` episodes, with the engine's current weights."""
        self.schedule.wait_sync()
        starts = [
            EpisodeStart((split, row_id, sample), self.environment_seed(row, row_id, split), dict(row))
            for row, row_id in zip(rows, row_ids)
            for sample in range(params.num_samples)
        ]
        return run_episodes(
            _EngineCalls(self.rollout),
            self.environments,
            self.tokenizer,
            starts,
            params,
            self.limits,
            processor=self.processor,
        )

    @cached_property
    def processor(self):
        """A vision-language policy's processor (data.min_pixels / data.max_pixels): it renders the observations
        and expands their images' placeholders once (docs/vision.md); None for a text policy."""
        from roll_lite.model.vision_run import is_vision_model, model_processor

        m = self.config.model
        return model_processor(m, self.config.data) if is_vision_model(m) else None

    @property
    def limits(self) -> EpisodeLimits:
        e = self.config.environment
        return EpisodeLimits(e.max_turns, e.max_new_tokens_per_turn, e.max_trajectory_tokens, self.positions)

    @cached_property
    def positions(self) -> int | None:
        """The model's max_position_embeddings: no trajectory grows past it."""
        m = self.config.model
        if m.pretrained_path is None:
            return m.max_position_embeddings
        from transformers import AutoConfig

        return getattr(
            AutoConfig.from_pretrained(m.pretrained_path, trust_remote_code=m.trust_remote_code),
            "max_position_embeddings",
            None,
        )

    def environment_seed(self, row: dict, row_id: int, split: str) -> int:
        if isinstance(row.get("seed"), int):
            return row["seed"]
        return derived_seed(self.data_seed, split, row_id)

    def episode_batch(self, episodes: list[Episode], step: int) -> DataProto:
        """The batch of the episodes kept: every one with a model turn, but those that faulted when
        environment.on_fault=drop. group_ids: the row each came from."""
        kept = [
            e
            for e in episodes
            if e.trajectory is not None
            and e.num_turns
            and not (e.fault is not None and self.config.environment.on_fault == "drop")
        ]
        if not kept:
            faults = Counter(e.fault for e in episodes if e.fault is not None)
            raise RuntimeError(
                f"step {step}: no trajectory to train on: {len(episodes)} ended in faults "
                f"({', '.join(f'{n} {why}' for why, n in faults.items())}); "
                f"first error: {next(e.error for e in episodes if e.error)}"
            )
        # casts: a kept episode has a trajectory; its key is play()'s (split, row, sample)
        batch = trajectory_batch(cast("list[Trajectory]", [e.trajectory for e in kept]), self.tokenizer.pad_token_id)
        rows = [cast("tuple[str, int, int]", e.key)[1] for e in kept]  # fully async: (split, row, sample, cohort)
        batch.batch["group_ids"] = torch.unique(torch.tensor(rows), return_inverse=True)[1]
        if self.config.environment.truncated == "mask":
            cut = torch.tensor([e.truncated for e in kept])
            batch.batch["model_mask"][cut] = 0
        batch.non_tensor_batch["response_text"] = [e.turn_texts[-1] for e in kept]
        # what reward models and judges read as the prompt: the conversation before the last model turn, as
        # the policy saw it (its chat markup kept); they score the last turn in it, and a reward model with
        # the policy's tokenizer reads the whole trajectory's ids
        batch.non_tensor_batch["prompt"] = [
            self.tokenizer.decode(before_last_turn(cast("Trajectory", e.trajectory))) for e in kept
        ]
        batch.non_tensor_batch["answer"] = [self.train_data[r].get(self.config.data.answer_key) for r in rows]
        batch.non_tensor_batch["extra"] = [dict(self.train_data[r]) for r in rows]
        self.kept = kept
        return DataProto(batch.batch, batch.non_tensor_batch)

    # -- rewards and credit -------------------------------------------------------------------------

    def rewards(self, batch: DataProto) -> tuple[DataProto, torch.Tensor, torch.Tensor, dict[str, float]]:
        """(batch, returns, token rewards, metrics): each step's reward on the last token of the turn it
        answered; a faulted trajectory gets 0 everywhere (environment.on_fault=zero_reward). With
        reward.on_failure=drop, score() marks the rows scored (batch["scored"]); the step takes the
        others out of the loss and of their groups' baselines, as single-turn (pipelines/unscored.py)."""
        episodes = self.kept  # the batch's rows, in order
        token_rewards = torch.zeros(batch["model_mask"].shape, dtype=torch.float32)
        final = torch.zeros(len(episodes))
        reward_metrics: dict[str, float] = {}
        if self.config.environment.final_reward:
            final, reward_metrics = self.score(batch)
        for row, episode in enumerate(episodes):
            if episode.fault is not None:
                continue
            assert episode.trajectory is not None  # a kept episode has one (episode_batch)
            ends = [len(episode.trajectory.prompt_ids) + end for end in episode.turn_ends]
            token_rewards[row, ends] = torch.tensor(episode.turn_rewards, dtype=torch.float32)
            token_rewards[row, ends[-1]] += final[row]
        metrics = {**episode_metrics(self.episodes, "env", self.config.environment.max_turns), **reward_metrics}
        if self.config.rollout.num_samples >= 2:
            # a row's group that left-out trajectories (faults under on_fault=drop, failed resets) cut to
            # one: the group estimators give it advantage 0, there being no other trajectory to compare with
            metrics["env/groups_of_one"] = float((torch.bincount(batch["group_ids"]) == 1).sum())
        return batch, token_rewards.sum(-1), token_rewards, metrics

    def compute_advantages(self, scores, token_rewards, batch):
        a = self.algorithm
        if self.config.environment.credit != "turn":
            return super().compute_advantages(scores, token_rewards, batch)
        mask = batch[self.loss_mask_key]
        valid = batch["scored"] if "scored" in batch else None  # reward.on_failure=drop: the rows scored
        advantages = turn_level_advantages(token_rewards, mask, batch["group_ids"], a.advantage, a.gamma, valid=valid)
        if self.teachers is not None:  # the teacher scores the model's own tokens only (model_mask)
            advantages = self.teachers.advantages(advantages, batch, mask, self.actor)
        return advantages, None

    # -- evaluation ---------------------------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Greedy episodes on data.eval_files' rows: eval/reward_mean (the mean return) and the
        episode metrics (eval/terminated, eval/turns_to_terminate, eval/turns, ...)."""
        self.prepare_data()
        if self.eval_data is None:
            return {}
        e = self.config.environment
        params = SamplingParams(e.max_new_tokens_per_turn, 1, greedy=True, stream="eval")
        episodes = self.play(self.eval_data, list(range(len(self.eval_data))), params, "eval")
        answer_key = self.config.data.answer_key
        self.eval_samples = [
            {
                "prompt": self.tokenizer.decode(ep.trajectory.prompt_ids) if ep.trajectory else None,
                "response": self.tokenizer.decode(ep.trajectory.response_ids) if ep.trajectory else None,
                "answer": row.get(answer_key),
                "score": ep.env_return,
                "end": ep.fault or ep.end,
                "turns": ep.num_turns,
            }
            for row, ep in zip(self.eval_data, episodes)
        ]
        return episode_metrics(episodes, "eval", e.max_turns)


class _EngineCalls:
    """The rollout client as episodes.TurnEngine."""

    def __init__(self, client):
        self.client = client

    def start_generate(self, prompts, params, *images):
        return self.client.start_generate(prompts, params, *images)

    def result(self, handle):
        return self.client.wait(handle, "generate")


def episode_metrics(episodes: list[Episode], prefix: str, max_turns: int) -> dict[str, float]:
    """Means over the episodes: <prefix>/reward_mean (the return), terminated, truncated, turns,
    turns_when_terminated, turns_to_terminate (an episode that did not terminate counts max_turns + 1),
    tokens, env_s (the environment's seconds, summed per episode), faults/<reason> counts, and the
    steps' info["metrics"] summed per episode."""
    n = len(episodes)
    terminated = [e for e in episodes if e.end == "terminated"]
    metrics = {
        f"{prefix}/reward_mean": sum(e.env_return for e in episodes if e.fault is None) / n,
        f"{prefix}/terminated": len(terminated) / n,
        f"{prefix}/truncated": sum(e.truncated for e in episodes) / n,
        f"{prefix}/turns": sum(e.num_turns for e in episodes) / n,
        f"{prefix}/turns_to_terminate": sum(e.num_turns if e.end == "terminated" else max_turns + 1 for e in episodes)
        / n,
        f"{prefix}/tokens": sum(e.response_tokens for e in episodes) / n,
        f"{prefix}/env_s": sum(e.env_seconds for e in episodes) / n,
    }
    if terminated:
        metrics[f"{prefix}/turns_when_terminated"] = sum(e.num_turns for e in terminated) / len(terminated)
    for end in ("max_turns", "token_budget"):
        metrics[f"{prefix}/ended_{end}"] = sum(e.end == end for e in episodes) / n
    for reason, count in Counter(e.fault for e in episodes if e.fault is not None).items():
        metrics[f"{prefix}/faults/{reason}"] = float(count)
    for name in sorted({name for e in episodes for name in e.metrics}):
        metrics[f"{prefix}/{name}"] = sum(e.metrics.get(name, 0) for e in episodes) / n
    return metrics


def before_last_turn(trajectory: Trajectory) -> list[int]:
    """The prompt's ids and every piece before the trajectory's last model turn."""
    last = max(i for i, (_, log_probs) in enumerate(trajectory.pieces) if log_probs is not None)
    return trajectory.prompt_ids + [token for ids, _ in trajectory.pieces[:last] for token in ids]
