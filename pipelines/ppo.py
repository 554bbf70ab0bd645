"""PPOPipeline: the controller of PPO, GRPO, Dr. GRPO, RLOO and REINFORCE++ (algorithm.advantage).

`step()` reads top to bottom: rollout -> rewards -> reference / old log-probs (+ values) -> KL ->
advantages -> loss_mask_keys -> actor (+ critic) train_step -> weight sync -> metrics. With
rollout.async_steps = N > 0 the rollout of the next N steps runs while a step trains
(roll_lite/rollout/ahead.py); with rollout.fully_async, in cohorts that go on across weight updates
(pipelines/async_schedule.py).

Override `loss_func(batch, output)` in a subclass to change the policy loss (examples/custom_loss/). The class
is also built, without workers, in every actor / critic worker to serve its losses: `__init__` stays light.

Its prompts (prepare_data, read_data, draw_prompts, ...) are in pipelines/rl_data.py, its worker groups
(start_workers, sync_from_actor, warm_start, save_final) in pipelines/rl_workers.py, its checkpoints' hooks
in pipelines/rl_checkpoints.py.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from roll_lite.config import RunConfig, rollout_dtype
from roll_lite.data import DataProto
from roll_lite.data.prompts import PromptData
from roll_lite.data.sequences import completion_batch, token_ids
from roll_lite.loss import value_loss_func
from roll_lite.loss.advantages import kl_shaped_rewards, last_token_rewards
from roll_lite.model.vision_run import run_tokenizer
from roll_lite.rewards.routing import reads_text
from roll_lite.rollout import SamplingParams
from roll_lite.rollout.ahead import staleness
from roll_lite.runtime.progress import progress_bar, seconds_in_all

from .advantages import estimate_advantages, reward_signal_metrics
from .async_episodes import FullyAsyncEpisodes
from .async_schedule import FullyAsyncSchedule
from .dapo import filter_overlong, keep_informative_groups, shape_overlong
from .evaluation import evaluate_held_out
from .fresh_weights import check_fresh_weights
from .losses import check_correction_applied, policy_loss_func
from .mismatch import measure_mismatch, step_mismatch_metrics
from .moe_routing import check_recorded, expert_load_metrics, old_log_prob_sums, routing_metrics, take_own_routing
from .rl_checkpoints import RLCheckpoints
from .rl_data import RLData
from .rl_workers import RLWorkers
from .rollout_schedule import RolloutSchedule
from .run_log import held_out, held_out_change, progress_line
from .session import RunSession
from .sft import SFTPipeline
from .teachers import Teachers
from .traces import mark_for_trace, rl_trace, tracing
from .unscored import drop_unscored

if TYPE_CHECKING:
    from roll_lite.workers.group import ModelGroup

    from roll_lite.data.domain_sampler import DomainSampler, PromptSampler  # what training_sampler returns

logger = logging.getLogger("roll_lite")


class PPOPipeline(RLData, RLWorkers, RLCheckpoints):
    # The mask of the tokens the losses train on (loss_mask_keys): every generated token here; the
    # model's own tokens of a multi-turn trajectory in MultiTurnPipeline (pipelines/multi_turn.py).
    loss_mask_key = "response_mask"

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.algorithm = config.algorithm
        self.tokenizer = run_tokenizer(config.model)  # a vision-language model's has its vision tokens
        # prepare_data(), in the driver only: read_data()'s rows (PromptData; MultiTurnPipeline: the dataset's dicts)
        self.train_data: Any = None
        self.eval_data: Any = None
        self.sampler: PromptSampler | DomainSampler | None = None
        self.warm_start_sft: SFTPipeline | None = None  # an SFTPipeline when sft.steps > 0 (prepare_data)
        self.eval_samples: list[dict[str, Any]] = []  # the last evaluate()'s greedy answers
        self.seq_len_norm = (
            self.algorithm.seq_len_norm if self.algorithm.seq_len_norm is not None else config.rollout.max_new_tokens
        )
        self.use_critic = self.algorithm.advantage == "gae"
        self.use_reference = self.algorithm.kl_coef > 0 or self.algorithm.track_kl
        # LoRA: the reference is the actor with its adapters off, no model of its own
        self.reference_in_actor = self.use_reference and config.actor.lora.rank > 0
        # One optimizer step per rollout: the training forward's log-probs are the old ones.
        self.on_policy = (
            self.algorithm.ppo_epochs == 1
            and self.algorithm.mini_batches == 1
            and not (self.use_reference and self.algorithm.kl_in_reward)
        )
        self.teachers = Teachers.of(config)  # on-policy distillation's teachers (pipelines/teachers.py), or None
        self._policy_loss = policy_loss_func(
            self.algorithm,
            self.loss_mask_key,
            self.seq_len_norm,
            self.use_reference,
            config.distill if self.teachers is not None else None,
        )
        a = self.algorithm
        self._value_loss = value_loss_func(a.loss_agg_mode, a.value_clip, self.seq_len_norm, self.loss_mask_key)
        self._shuffle = torch.Generator().manual_seed(config.seed)
        # launches, collects, weight syncs: lockstep (rollout.async_steps ahead) or fully async
        self.schedule: RolloutSchedule | FullyAsyncSchedule | FullyAsyncEpisodes = (
            FullyAsyncSchedule(config.rollout, images_of=lambda rows: self.train_data.select(rows).images or None)
            if config.rollout.fully_async
            else RolloutSchedule(config.rollout.async_steps)
        )
        self.stage = "start-up"  # where run() is: named by a worker failure and by a stop on a signal

    # -- losses: run inside the actor / critic workers ------------------------------------------

    def loss_func(
        self, batch: DataProto, output: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Policy loss: algorithm.policy_loss (pipelines/losses.py; + KL to the reference when it is a loss)."""
        return self._policy_loss(batch, output)

    def critic_loss_func(
        self, batch: DataProto, output: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self._value_loss(batch, output)

    # -- the controller ---------------------------------------------------------------------------

    def sampling_params(self) -> SamplingParams:
        r = self.config.rollout
        return SamplingParams(r.max_new_tokens, r.num_samples, r.temperature, r.top_p, r.top_k)

    def generate(self, prompts: PromptData, params: SamplingParams) -> DataProto:
        """Generate now, with the actor's latest weights (roll_lite.data.sequences.completion_batch)."""
        self.schedule.wait_sync()
        assert self.rollout is not None  # start_workers() made it
        images = [prompts.images] if prompts.images else []  # image rows: their image inputs (the hf engine)
        return completion_batch(prompts, self.rollout.generate(prompts.prompt_ids, params, *images), self.tokenizer)

    def collect_rollout(self, step: int) -> tuple[DataProto, int]:
        """(the batch of `step`, how many steps older than the actor its sampling weights are)."""
        schedule = self.schedule
        assert not isinstance(schedule, FullyAsyncEpisodes)  # MultiTurnPipeline's: it collects its episodes itself
        if not schedule.is_launched(step):
            raise RuntimeError(f"step {step}: the training prompts are used up (data.epochs={self.config.data.epochs})")
        rows, completions = schedule.collect(step)
        return completion_batch(self.train_data.select(rows), completions, self.tokenizer), staleness(step, completions)

    def step(self, step: int) -> dict[str, float]:
        a = self.algorithm
        start = time.perf_counter()
        self.prepare_data()
        self.schedule.launch(step, self.total_steps, self.draw_prompts, self.sampling_params())
        batch, weights_behind = self.collect_rollout(step)
        check_recorded(batch, self.config)  # actor.router_replay: the engine's routing travels with the tokens
        generated = time.perf_counter()

        batch, scores, token_rewards, reward_metrics = self.rewards(batch)
        scored = time.perf_counter()
        reward_metrics = drop_unscored(
            batch, self.loss_mask_key, scores, {"reward/mean": scores.mean().item(), **reward_metrics}
        )
        if "group_ids" in batch:  # how many groups carry no reward signal (the step line says when none does)
            reward_metrics.update(reward_signal_metrics(scores, batch["group_ids"], batch.batch.get("scored")))
        batch.meta_info["temperature"] = self.config.rollout.temperature  # every log-prob below at the sampling one
        mask = batch[self.loss_mask_key]

        if self.use_reference:
            batch.batch["ref_log_probs"] = self.reference_log_probs(batch)
        if self.teachers is not None:
            batch.batch.update(self.teachers.scores(batch))  # teacher_log_probs (+ its top k)
        drift_sums = None  # MoE routing drift at the old-log-prob forward (pipelines/moe_routing.py)
        if not self.on_policy and not a.rollout_bypass:  # bypass: the engine's log-probs are π_old
            old = self.actor.compute_log_probs(batch)
            batch.batch["old_log_probs"], drift_sums = old["log_probs"], old_log_prob_sums(old, batch)
            take_own_routing(batch, old)  # actor.router_replay=old: the trainer's routing, replayed in training
        if self.critic is not None:
            batch.batch["values"] = self.critic.compute_values(batch)["values"]
        if self.use_reference and a.kl_in_reward:
            old = batch["rollout_log_probs"] if a.rollout_bypass else batch["old_log_probs"]
            token_rewards = kl_shaped_rewards(
                token_rewards, old, batch["ref_log_probs"], mask, a.kl_coef, a.kl_estimator, a.kl_clamp
            )

        batch.batch["advantages"], returns = self.compute_advantages(scores, token_rewards, batch)
        if returns is not None:
            batch.batch["returns"] = returns
        batch.meta_info.update(loss_mask_keys=[self.loss_mask_key], on_policy=self.on_policy)
        mismatch_sums = measure_mismatch(batch, self.loss_mask_key, self.config, step, weights_behind)

        prepared = time.perf_counter()
        actor_metrics = self.train(self.actor, batch, "policy")
        mismatch = step_mismatch_metrics(self.config, mismatch_sums, actor_metrics)
        routing = routing_metrics(drift_sums, actor_metrics)
        routing.update(expert_load_metrics(batch, self.config))  # the engine's, when it recorded routing
        check_fresh_weights(actor_metrics, weights_behind, self.config.rollout.max_logp_gap, type(self).__name__, step)
        critic_metrics = self.train(self.critic, batch, "critic") if self.critic is not None else {}
        trained = time.perf_counter()
        self.schedule.start_sync(self.actor, rollout_dtype(self.config), version=step)

        elapsed = time.perf_counter() - start
        tokens = int(batch["attention_mask"].sum())
        self.step_trace = rl_trace(self, step, batch, scores, weights_behind)  # docs/traces.md
        return {
            **reward_metrics,
            **(self.teachers.metrics if self.teachers is not None else {}),
            **{f"actor/{k}": v for k, v in actor_metrics.items()},
            **{f"critic/{k}": v for k, v in critic_metrics.items()},
            "response_length/mean": mask.sum(-1).float().mean().item(),
            "response_length/max": int(mask.sum(-1).max()),  # the longest answer: what a lockstep step waits for
            "rollout/staleness": weights_behind,  # steps between the sampling weights and the actor's
            **mismatch,  # engine / trainer log-prob mismatch (pipelines/mismatch.py)
            **routing,  # MoE: the trainer's routing against the engine's (pipelines/moe_routing.py)
            **self.schedule.last_metrics,  # fully async: per-token staleness, samples of several versions
            "perf/step_s": elapsed,
            "perf/generate_s": generated - start,
            "perf/prepare_s": prepared - generated,  # rewards, reference / old log-probs, values, advantages
            "perf/reward_s": scored - generated,  # of which the rewards (with DAPO's extra rounds, their generation)
            "perf/train_s": trained - prepared,
            "perf/weight_sync_s": elapsed - (trained - start),
            "perf/tokens_per_s": tokens / elapsed,
        }

    def reference_log_probs(self, batch: DataProto) -> torch.Tensor:
        """The reference model's: a worker group of its own, or with LoRA the actor's adapters off."""
        if self.reference_in_actor:
            return self.actor.compute_reference_log_probs(batch)["log_probs"]
        assert self.reference is not None  # a worker group of its own, without LoRA
        return self.reference.compute_log_probs(batch)["log_probs"]

    def rewards(self, batch: DataProto) -> tuple[DataProto, torch.Tensor, torch.Tensor, dict[str, float]]:
        """(batch, scores, token rewards: each score on its row's last response token, metrics), with
        DAPO's overlong shaping / filtering and dynamic sampling when on (pipelines/dapo.py)."""
        scores, metrics = self.shaped_scores(batch)
        if self.algorithm.dynamic_sampling:
            batch, scores, metrics = keep_informative_groups(self, batch, scores, metrics)
        token_rewards = last_token_rewards(scores, batch["response_mask"])
        if self.algorithm.overlong_filter:
            metrics = filter_overlong(batch, metrics, self.config.rollout.max_new_tokens, self.tokenizer.eos_token_id)
        return batch, scores, token_rewards, metrics

    def shaped_scores(self, batch: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        scores, metrics = self.score(batch)
        return shape_overlong(
            batch, scores, metrics, self.algorithm, self.config.rollout.max_new_tokens, self.tokenizer.eos_token_id
        )

    def score(self, batch: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        """The reward functions on each row: its response text, answer and extra dataset fields
        (non_tensor_batch["extra"], one dict per row, when the data provides them). With
        reward.on_failure=drop it also marks the rows every function scored: batch["scored"]."""
        scores, scored, metrics = self.score_batches([batch])
        if self.config.reward.on_failure == "drop":
            batch.batch["scored"] = scored
        if tracing(self.config):  # each row's sources' outcomes, for the step's trace
            mark_for_trace(batch, self.reward)
        return scores, metrics

    def score_batches(self, batches: list[DataProto]) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(scores, scored, metrics) of the rows of several batches in one call, so that every metric is over
        all of them (a held-out set generated in chunks)."""

        def column(key: str) -> list[Any]:
            return [value for batch in batches for value in batch.non_tensor_batch[key]]

        extras = column("extra") if "extra" in batches[0].non_tensor_batch else None
        with_text = reads_text(self.config.reward)
        ids = [row for batch in batches for row in token_ids(batch)] if with_text else []
        return self.reward.score(
            column("response_text"), column("answer"), extras, *((column("prompt"), ids) if with_text else ())
        )

    def compute_advantages(
        self, scores: torch.Tensor, token_rewards: torch.Tensor, batch: DataProto
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(advantages, returns for the critic or None): algorithm.advantage's estimator
        (pipelines/advantages.py) on the batch's loss mask; with a teacher, distill's advantage."""
        advantages, returns = estimate_advantages(self.algorithm, token_rewards, batch, batch[self.loss_mask_key])
        if self.teachers is not None:
            advantages = self.teachers.advantages(advantages, batch, batch[self.loss_mask_key], self.actor)
        return advantages, returns

    def train(self, group: ModelGroup, batch: DataProto, loss: str) -> dict[str, float]:
        """ppo_epochs × mini_batches optimizer steps; each mini-batch gets its own global stats
        (the strategy computes them per train_step). Returns the last step's metrics."""
        metrics: dict[str, float] = {}
        for _ in range(self.algorithm.ppo_epochs):
            order = torch.randperm(len(batch), generator=self._shuffle)
            for rows in torch.tensor_split(order, self.algorithm.mini_batches):
                metrics = group.train_step(batch.index_select(rows), loss)
        if loss == "policy":  # a loss_func of one's own that ignores an asked-for correction
            check_correction_applied(self.algorithm, metrics, type(self).__name__)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics with the actor's latest weights (pipelines/evaluation.py); keeps the greedy
        answers in self.eval_samples."""
        self.prepare_data()
        if self.eval_data is None:
            return {}
        self.schedule.wait_sync()
        metrics, self.eval_samples = evaluate_held_out(
            self.eval_data, self.generate, self.score_batches, self.config.rollout, self.config.data.eval_num_samples
        )
        return metrics

    def run(self) -> list[dict[str, Any]]:
        """The whole job: workers, warm start, step-0 eval, training steps, plots. Returns the history."""
        from roll_lite.workers.group import reservation

        c, start = self.config, time.monotonic()
        self.prepare_data()  # before the run directory and Ray: a bad file stops here
        with RunSession(self, reservation(c)) as session:
            self.stage = "the start of the workers"
            self.start_workers()
            resumed_step = session.begin()
            if not resumed_step:
                if c.sft.steps:
                    self.stage = "the warm start"
                    self.warm_start()
                self.stage = "step 0 (evaluation before RL)"
                self.sync_from_actor(version=0)
                initial = self.evaluate()
                session.log(0, initial, self.eval_samples)
                logger.info("step 0 (before RL): held-out %s", held_out(initial))
            bar = progress_bar(c.steps - resumed_step, "RL")
            for step in range(resumed_step + 1, c.steps + 1):
                if self.data_used_up:
                    logger.info(
                        "the training prompts are used up (data.epochs=%d) after step %d", c.data.epochs, step - 1
                    )
                    break
                self.stage = f"step {step}"
                metrics = self.step(step)
                samples = None
                if step % c.eval_every == 0 or step == c.steps or self.data_used_up:
                    self.stage = f"step {step} (evaluation)"
                    metrics.update(self.evaluate())
                    samples = self.eval_samples
                bar.update()
                logger.info(progress_line(step, c.steps, metrics))
                session.end_step(step, metrics, samples, last=step == c.steps or self.data_used_up)
            bar.close()
            if c.save_model:
                self.stage = "saving the final model"
                self.save_final(session.run_dir / "final")
            assert session.tracker is not None  # session.begin() opened it
            change = held_out_change(session.tracker.history[0], session.tracker.history[-1])
        logger.info(
            "held-out reward: %s; %.1f s in all; run dir %s",
            change,
            seconds_in_all(start),
            session.run_dir,
        )
        return session.tracker.history
