"""PPOPipeline: the controller of PPO, GRPO, Dr. GRPO, RLOO and REINFORCE++ (algorithm.advantage).

`step()` reads top to bottom: rollout -> rewards -> reference / old log-probs (+ values) -> KL ->
advantages -> loss_mask_keys -> actor (+ critic) train_step -> weight sync -> metrics. With
rollout.async_steps = N > 0 the rollout of the next N steps runs while a step trains
(roll_lite/rollout/ahead.py).

Subclass it and override `loss_func(batch, output)` to change the policy loss; nothing else has to
change (see examples/custom_loss/). The class is also instantiated, without workers, inside every
actor / critic worker to serve `loss_func` and `critic_loss_func`, so `__init__` must stay light.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch

from roll_lite.config import ConfigError, RunConfig, rollout_dtype
from roll_lite.data import DataProto
from roll_lite.data.prompts import PromptData
from roll_lite.data.sampler import PromptSampler
from roll_lite.loss import kl_regularized_loss_func, ppo_policy_loss_func, value_loss_func
from roll_lite.loss.advantages import (
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    kl_shaped_rewards,
    last_token_rewards,
    masked_whiten,
    rloo_advantages,
    whitens_advantages,
)
from roll_lite.progress import on_terminal, progress_bar, seconds_in_all
from roll_lite.rollout import Completions, SamplingParams
from roll_lite.rollout.ahead import RolloutQueue, staleness
from roll_lite.sequences import build_sequence_batch
from roll_lite.tokenizer import load_tokenizer

from .session import RunSession
from .sft import SFTPipeline

logger = logging.getLogger("roll_lite")
EVAL_CHUNK = 256  # eval prompts per generate call
ROLLOUTS_AHEAD = "rollouts_ahead.json"  # in a checkpoint: the generations launched for later steps


class PPOPipeline:
    def __init__(self, config: RunConfig):
        self.config = config
        self.algorithm = config.algorithm
        self.tokenizer = load_tokenizer(config.model.tokenizer_path)
        self.train_data = self.eval_data = self.sampler = None  # prepare_data(): in the driver only
        self.warm_start_sft = None  # an SFTPipeline when sft.steps > 0 (prepare_data)
        self.eval_samples: list[dict] = []  # the last evaluate()'s greedy answers
        self.seq_len_norm = (self.algorithm.seq_len_norm if self.algorithm.seq_len_norm is not None
                             else config.rollout.max_new_tokens)
        self.use_critic = self.algorithm.advantage == "gae"
        self.use_reference = self.algorithm.kl_coef > 0 or self.algorithm.track_kl
        # One optimizer step per rollout: the training forward's log-probs are the old ones.
        self.on_policy = self.algorithm.ppo_epochs == 1 and self.algorithm.mini_batches == 1 and not (
            self.use_reference and self.algorithm.kl_in_reward
        )
        a = self.algorithm
        policy_options = dict(clip_ratio_low=a.clip_ratio_low, clip_ratio_high=a.clip_ratio_high,
                              dual_clip_c=a.dual_clip_c, entropy_coef=a.entropy_coef,
                              rollout_is=a.rollout_is, rollout_is_cap=a.rollout_is_cap)
        if self.use_reference:
            self._policy_loss = kl_regularized_loss_func(
                a.loss_agg_mode, kl_coef=0.0 if a.kl_in_reward else a.kl_coef, kl_estimator=a.kl_estimator,
                seq_len_norm=self.seq_len_norm, policy_mask_key="response_mask", kl_mask_key="response_mask",
                kl_clamp=a.kl_clamp, **policy_options,
            )
        else:
            self._policy_loss = ppo_policy_loss_func(a.loss_agg_mode, seq_len_norm=self.seq_len_norm, **policy_options)
        self._value_loss = value_loss_func(a.loss_agg_mode, a.value_clip, self.seq_len_norm)
        self._shuffle = torch.Generator().manual_seed(config.seed)
        self.rollouts = RolloutQueue(config.rollout.async_steps)  # generations launched, by step
        self._weight_sync = None  # the rollout's weight update not confirmed yet (async_steps > 0)
        self.stage = "start-up"  # where run() is: named by a worker failure and by a stop on a signal

    # -- losses: run inside the actor / critic workers ------------------------------------------

    def loss_func(self, batch: DataProto, output: dict) -> tuple[torch.Tensor, dict]:
        """Policy loss: PPO clip (+ KL to the reference when it is a loss, + entropy bonus)."""
        return self._policy_loss(batch, output)

    def critic_loss_func(self, batch: DataProto, output: dict) -> tuple[torch.Tensor, dict]:
        return self._value_loss(batch, output)

    # -- the controller ---------------------------------------------------------------------------

    def start_workers(self) -> None:
        from roll_lite.workers.group import ModelGroup, RewardClient, RolloutClient
        from roll_lite.workers.placement import Placement

        w = self.config.workers
        # On GPUs, rank i of every model group, and the rollout worker unless it has GPUs of its own
        # (workers.rollout_gpus), share one GPU.
        colocated_rollout = w.rollout_gpus == 0
        placement = Placement(self.config, roles_on_a_gpu=1 + self.use_reference + self.use_critic + colocated_rollout)
        # All worker processes start at once; wait_ready then builds their models.
        self.actor = ModelGroup("actor", w.actor_dp, placement, self.config)
        self.reference = ModelGroup("reference", w.reference_dp, placement, self.config) if self.use_reference else None
        self.critic = ModelGroup("critic", w.critic_dp, placement, self.config) if self.use_critic else None
        in_actor = self.config.rollout.in_actor  # then the actor's process generates, once it is ready
        self.rollout = None if in_actor else RolloutClient(self.config, placement)
        self.reward = RewardClient(self.config)
        for group in (self.actor, self.reference, self.critic):
            if group is not None:
                group.wait_ready()
        if in_actor:
            self.rollout = RolloutClient(self.config, placement, actor=self.actor)
        logger.info(self.rollout.describe())
        logger.info(self.reward.describe())
        if self.config.rollout.async_steps:
            logger.info(describe_async_rollout(self.config.rollout.async_steps, self.algorithm.rollout_is))
            if (warning := oversubscribed_cpu_warning(self.config)) is not None:
                logger.warning(warning)

    def prepare_data(self) -> None:
        """Load, validate and tokenize the data: files (data.train_files, data.eval_files), and the
        training sampler. In the driver, before Ray starts; a bad file raises DataError (one line).
        Idempotent: run() calls it too."""
        if self.train_data is not None:
            return
        from roll_lite.data.prompts import prepare_datasets

        d = self.config.data
        prepared = prepare_datasets(d, self.tokenizer)
        self.train_data, self.eval_data = prepared.train, prepared.eval
        self.sampler = PromptSampler(len(self.train_data), self.data_seed, d.shuffle, d.epochs)
        for note in prepared.notes:
            logger.info(note)
        if self.config.sft.steps:
            self.warm_start_sft = SFTPipeline(self.config, self.tokenizer)
            self.warm_start_sft.train_loss = "sft"  # the built-in SFT loss, not this pipeline's loss_func
            self.warm_start_sft.prepare_data()

    def longest_sequences(self) -> tuple[int, int]:
        """(tokens of the longest prompt, of the longest warm-start SFT sequence; 0 without a warm start)."""
        self.prepare_data()
        rows = [self.train_data] + ([self.eval_data] if self.eval_data is not None else [])
        longest_prompt = max(len(ids) for data in rows for ids in data.prompt_ids)
        return longest_prompt, self.warm_start_sft.longest_sequences()[1] if self.config.sft.steps else 0

    @property
    def data_seed(self) -> int:
        return self.config.seed if self.config.data.seed is None else self.config.data.seed

    @property
    def data_used_up(self) -> bool:
        """data.epochs ended: no prompts left to draw, and every step they were drawn for has run."""
        return self.sampler.exhausted and not len(self.rollouts)

    def sampling_params(self) -> SamplingParams:
        r = self.config.rollout
        return SamplingParams(r.max_new_tokens, r.num_samples, r.temperature, r.top_p, r.top_k)

    def generate(self, prompts: PromptData, params: SamplingParams) -> DataProto:
        """Generate now, with the actor's latest weights (see build_batch)."""
        self.wait_weight_sync()
        return self.build_batch(prompts, self.rollout.generate(prompts.prompt_ids, params))

    def launch_rollouts(self, step: int) -> None:
        """Start the generations due at the start of `step`: its own and, with rollout.async_steps = N,
        those of the next N steps, each on the next prompts of the sampler, with the weights the rollout
        worker holds now (the actor's after step - 1)."""
        for later in self.rollouts.steps_to_launch(step, self.total_steps):
            rows = self.sampler.draw(self.config.rollout.prompts_per_step)
            if not rows:
                break
            prompt_ids = self.train_data.select(rows).prompt_ids
            self.rollouts.add(later, rows, self.rollout.start_generate(prompt_ids, self.sampling_params()))

    def collect_rollout(self, step: int) -> tuple[DataProto, int]:
        """(the batch of `step`, how many steps older than the actor its sampling weights are)."""
        if step not in self.rollouts.launched:
            raise RuntimeError(f"step {step}: the training prompts are used up (data.epochs={self.config.data.epochs})")
        launched = self.rollouts.pop(step)
        completions = self._fetched(launched.result)
        if not self.config.rollout.async_steps:
            self.wait_weight_sync()  # it ran before this generation: its answer is there, and must be a success
        return self.build_batch(self.train_data.select(launched.rows), completions), staleness(step, completions)

    def fetch_rollouts(self) -> None:
        """Wait for every launched generation (a checkpoint saves them: their weights are gone)."""
        for launched in self.rollouts.launched.values():
            launched.result = self._fetched(launched.result)

    def _fetched(self, result) -> Completions:
        return result if isinstance(result, Completions) else self.rollout.wait(result, "generate")

    def sync_rollout_weights(self, version: int) -> None:
        """The actor's weights to the rollout engine. The load queues on the rollout worker (behind the
        generations in flight with rollout.async_steps > 0) and the step goes on; what needs the new
        weights waits for it first: the next sync, an evaluation, a checkpoint and, on-policy, the
        next step's batch (collect_rollout), which the worker generates after the load."""
        self.wait_weight_sync()
        self._weight_sync = self.rollout.start_sync(self.actor, rollout_dtype(self.config), version)

    def wait_weight_sync(self) -> None:
        if self._weight_sync is not None:
            ref, self._weight_sync = self._weight_sync, None
            self.rollout.wait(ref, "update_weights")

    def build_batch(self, prompts: PromptData, generated: Completions) -> DataProto:
        """Sequences of every (prompt, sample): tensors + response_text, group ids, and per row the
        prompt's answer and extra fields (non_tensor_batch 'answer', 'extra': a dict per row). When
        sampling, also the engine's log-prob of each response token ('rollout_log_probs')."""
        completions = generated.token_ids
        n = len(completions) // len(prompts)
        batch = build_sequence_batch([p for p in prompts.prompt_ids for _ in range(n)], completions,
                                     self.tokenizer.pad_token_id, generated.log_probs)
        batch.batch["group_ids"] = torch.arange(len(prompts)).repeat_interleave(n)
        batch.non_tensor_batch["response_text"] = [self.tokenizer.decode(c, skip_special_tokens=True) for c in completions]
        batch.non_tensor_batch["answer"] = [a for a in prompts.answers for _ in range(n)]
        batch.non_tensor_batch["extra"] = [e for e in prompts.extras for _ in range(n)]
        return DataProto(batch.batch, batch.non_tensor_batch)

    def step(self, step: int) -> dict[str, float]:
        a = self.algorithm
        start = time.perf_counter()
        self.prepare_data()
        self.launch_rollouts(step)
        batch, weights_behind = self.collect_rollout(step)
        generated = time.perf_counter()

        scores, reward_metrics = self.score(batch)
        mask = batch["response_mask"]
        token_rewards = last_token_rewards(scores, mask)

        if self.reference is not None:
            batch.batch["ref_log_probs"] = self.reference.compute_log_probs(batch)["log_probs"]
        if not self.on_policy:
            batch.batch["old_log_probs"] = self.actor.compute_log_probs(batch)["log_probs"]
        if self.critic is not None:
            batch.batch["values"] = self.critic.compute_values(batch)["values"]
        if self.reference is not None and a.kl_in_reward:
            token_rewards = kl_shaped_rewards(token_rewards, batch["old_log_probs"], batch["ref_log_probs"], mask,
                                              a.kl_coef, a.kl_estimator, a.kl_clamp)

        batch.batch["advantages"], returns = self.compute_advantages(scores, token_rewards, batch)
        if returns is not None:
            batch.batch["returns"] = returns
        batch.meta_info.update(loss_mask_keys=["response_mask"], on_policy=self.on_policy)

        prepared = time.perf_counter()
        actor_metrics = self.train(self.actor, batch, "policy")
        critic_metrics = self.train(self.critic, batch, "critic") if self.critic is not None else {}
        trained = time.perf_counter()
        self.sync_rollout_weights(version=step)

        elapsed = time.perf_counter() - start
        tokens = int(batch["attention_mask"].sum())
        return {
            "reward/mean": scores.mean().item(),
            **reward_metrics,
            **{f"actor/{k}": v for k, v in actor_metrics.items()},
            **{f"critic/{k}": v for k, v in critic_metrics.items()},
            "response_length/mean": mask.sum(-1).float().mean().item(),
            "rollout/staleness": weights_behind,  # steps between the sampling weights and the actor's
            "perf/step_s": elapsed,
            "perf/generate_s": generated - start,
            "perf/prepare_s": prepared - generated,  # rewards, reference / old log-probs, values, advantages
            "perf/train_s": trained - prepared,
            "perf/weight_sync_s": elapsed - (trained - start),
            "perf/tokens_per_s": tokens / elapsed,
        }

    def score(self, batch: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        """The reward functions on each row: its response text, answer and extra dataset fields
        (non_tensor_batch["extra"], one dict per row, when the data provides them)."""
        extras = batch.non_tensor_batch.get("extra")
        return self.reward.score(list(batch.non_tensor_batch["response_text"]), list(batch.non_tensor_batch["answer"]),
                                 None if extras is None else list(extras))

    def compute_advantages(self, scores, token_rewards, batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(advantages, returns for the critic or None). The estimator's raw advantages, whitened over
        the batch's response tokens when algorithm.whiten_advantages says so (default: gae and
        reinforce_pp); the critic's returns are built from the raw GAE advantages."""
        a, mask = self.algorithm, batch["response_mask"]
        returns = None
        if a.advantage == "gae":
            advantages, returns = gae_advantages(token_rewards, batch["values"], mask, a.gamma, a.lam)
        elif a.advantage in ("grpo", "dr_grpo"):
            shaped = token_rewards.sum(-1)  # the score, minus the KL penalty when it is in the reward
            advantages = grpo_advantages(shaped, batch["group_ids"], mask, normalize_std=a.advantage == "grpo")
        elif a.advantage == "rloo":
            advantages = rloo_advantages(token_rewards.sum(-1), batch["group_ids"], mask)
        else:  # reinforce_pp: discounted returns, whitened below (reinforce_pp_advantages)
            advantages = discounted_returns(token_rewards, mask, a.gamma)
        if whitens_advantages(a.advantage, a.whiten_advantages):
            advantages = masked_whiten(advantages, mask)
        return advantages, returns

    def train(self, group, batch: DataProto, loss: str) -> dict[str, float]:
        """ppo_epochs × mini_batches optimizer steps; each mini-batch gets its own global stats
        (the strategy computes them per train_step). Returns the last step's metrics."""
        metrics = {}
        for _ in range(self.algorithm.ppo_epochs):
            order = torch.randperm(len(batch), generator=self._shuffle)
            for rows in torch.tensor_split(order, self.algorithm.mini_batches):
                metrics = group.train_step(batch.index_select(rows), loss)
        if loss == "policy":
            self.check_rollout_is_applied(metrics)
        return metrics

    def check_rollout_is_applied(self, metrics: dict[str, float]) -> None:
        """algorithm.rollout_is asks for importance weights; a loss_func of one's own that ignores them
        would leave the asked-for correction silently undone."""
        if self.algorithm.rollout_is and "rollout_is_weight" not in metrics:
            raise ConfigError(
                f"algorithm.rollout_is={self.algorithm.rollout_is}: {type(self).__name__}.loss_func applied no importance "
                "weights (it reported no 'rollout_is_weight@sum'); weight its per-token loss with "
                "roll_lite.loss_funcs.rollout_correction, or set algorithm.rollout_is=null"
            )

    def evaluate(self) -> dict[str, float]:
        """On the held-out prompts (data.eval_files): greedy decoding, scored by the configured
        rewards (eval/reward_mean); with data.eval_num_samples = k > 0 also k samples per prompt at
        the rollout's temperature: eval/mean@k (mean score) and eval/pass@k (mean over prompts of
        the best of k scores; for 0/1 rewards the share of prompts solved at least once)."""
        self.prepare_data()
        if self.eval_data is None:
            return {}
        self.wait_weight_sync()
        r, k = self.config.rollout, self.config.data.eval_num_samples
        scores, per_function, responses = self._score_in_chunks(SamplingParams(r.max_new_tokens, greedy=True))
        # The greedy answers, for the run directory (eval_samples/): what a reload of final/ must reproduce.
        self.eval_samples = [{"prompt": p, "response": text, "answer": a, "score": s}
                             for p, text, a, s in zip(self.eval_data.prompts, responses, self.eval_data.answers, scores.tolist())]
        metrics = {"eval/reward_mean": scores.mean().item(), **{f"eval/{name}": v for name, v in per_function.items()}}
        if k > 0:
            sampled, _, _ = self._score_in_chunks(SamplingParams(r.max_new_tokens, k, r.temperature, r.top_p, r.top_k))
            sampled = sampled.view(-1, k)  # [prompts, k]: generate returns each prompt's samples together
            metrics[f"eval/mean@{k}"] = sampled.mean().item()
            metrics[f"eval/pass@{k}"] = sampled.max(dim=1).values.mean().item()
        return metrics

    def _score_in_chunks(self, params: SamplingParams) -> tuple[torch.Tensor, dict[str, float], list[str]]:
        """Scores and response texts of every eval (prompt, sample) in order, and each reward function's mean."""
        scores, sums, responses, prompts = [], {}, [], len(self.eval_data)
        several_chunks = prompts > EVAL_CHUNK  # a long evaluation: show its progress
        bar = progress_bar(prompts, "evaluation", unit="prompt", show=several_chunks)
        for start in range(0, prompts, EVAL_CHUNK):
            chunk = self.eval_data.select(range(start, min(start + EVAL_CHUNK, prompts)))
            batch = self.generate(chunk, params)
            chunk_scores, means = self.score(batch)
            scores.append(chunk_scores)
            responses.extend(batch.non_tensor_batch["response_text"])
            for name, mean in means.items():
                sums[name] = sums.get(name, 0.0) + mean * len(chunk_scores)
            bar.update(len(chunk))
            if several_chunks and not on_terminal():
                logger.info("evaluation: %d/%d prompts", start + len(chunk), prompts)
        bar.close()
        scores = torch.cat(scores)
        return scores, {name: total / len(scores) for name, total in sums.items()}, responses

    def warm_start(self) -> dict[str, float]:
        """sft.steps SFT steps on the actor before RL (pipelines/sft.py on sft.train_files), then the
        actor's optimizer starts afresh at actor.lr."""
        self.warm_start_sft.actor = self.actor
        metrics = self.warm_start_sft.train()
        self.actor.reset_optimizer()
        return metrics

    def save_final(self, path: Path) -> None:
        """The trained policy as a HF folder; reload it with model.pretrained_path / tokenizer_path."""
        self.actor.save_pretrained(str(path.resolve()))
        self.tokenizer.save_pretrained(path)
        logger.info("saved the policy and tokenizer to %s", path)

    def sync_from_actor(self, version: int) -> None:
        self.rollout.sync(self.actor, rollout_dtype(self.config), version)
        others = [group for group in (self.reference, self.critic) if group is not None]
        if others:
            state = self.actor.state_dict_ref()
            for group in others:
                group.load_state_dict(state)

    def run(self) -> list[dict]:
        """The whole job: workers, warm start, step-0 eval, training steps, plots. Returns the history."""
        from roll_lite.workers.placement import reservation

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
                logger.info("step 0 (before RL): held-out %s", _fmt(initial.get("eval/reward_mean")))
            bar = progress_bar(c.steps - resumed_step, "RL")
            for step in range(resumed_step + 1, c.steps + 1):
                if self.data_used_up:
                    logger.info("the training prompts are used up (data.epochs=%d) after step %d", c.data.epochs, step - 1)
                    break
                self.stage = f"step {step}"
                metrics = self.step(step)
                samples = None
                if step % c.eval_every == 0 or step == c.steps or self.data_used_up:
                    self.stage = f"step {step} (evaluation)"
                    metrics.update(self.evaluate())
                    samples = self.eval_samples
                bar.update()
                logger.info(_progress_line(step, c.steps, metrics))
                session.end_step(step, metrics, samples, last=step == c.steps or self.data_used_up)
            bar.close()
            if c.save_model:
                self.stage = "saving the final model"
                self.save_final(session.run_dir / "final")
            initial, final = (session.tracker.history[i].get("eval/reward_mean") for i in (0, -1))
        logger.info("held-out reward: %s at start -> %s at the end; %.1f s in all; run dir %s",
                    _fmt(initial), _fmt(final), seconds_in_all(start), session.run_dir)
        return session.tracker.history

    # -- checkpoints (pipelines/session.py, roll_lite/checkpoint/) -----------------------------------

    checkpoint_kind = "rl"
    # Besides the model's: the keys that decide which prompts the sampler's saved position refers to.
    checkpoint_compat_keys = ("algorithm.advantage", "data.train_files", "data.shuffle")

    total_steps_key = "steps"

    @property
    def total_steps(self) -> int:
        return self.config.steps

    def checkpoint_groups(self) -> dict:
        """The model groups a checkpoint holds. The reference too: after a warm start it holds the
        warm-started policy, not the build."""
        groups = {"actor": self.actor, "critic": self.critic, "reference": self.reference}
        return {name: group for name, group in groups.items() if group is not None}

    def save_driver_state(self, folder: Path) -> None:
        """The rollout engine's sampling position and generators; the mini-batch shuffle's generator;
        the generations launched ahead (rollout.async_steps), fetched first."""
        from roll_lite.checkpoint.rng import save_rng

        self.wait_weight_sync()
        self.fetch_rollouts()
        (folder / ROLLOUTS_AHEAD).write_text(json.dumps(self.rollouts.state_dict()))
        self.rollout.save_checkpoint(str(folder / "rng_rollout.pkl"))
        save_rng(folder / "rng_driver.pkl", {"minibatch_shuffle": self._shuffle.get_state()})

    def load_driver_state(self, folder: Path, step: int) -> None:
        from roll_lite.checkpoint.rng import load_rng

        self.rollout.sync(self.actor, rollout_dtype(self.config), version=step)
        self.rollout.load_checkpoint(str(folder / "rng_rollout.pkl"))
        # checkpoints written before rollout.async_steps existed have no such file: nothing was ahead
        ahead = folder / ROLLOUTS_AHEAD
        self.rollouts.load_state_dict(json.loads(ahead.read_text()) if ahead.exists() else [])
        self._shuffle.set_state(load_rng(folder / "rng_driver.pkl")["minibatch_shuffle"])


def describe_async_rollout(async_steps: int, rollout_is: str | None) -> str:
    correction = (f"algorithm.rollout_is={rollout_is} weights the loss by the ratio to the sampling weights"
                  if rollout_is else "nothing corrects the gap to the sampling weights (algorithm.rollout_is=null)")
    return (f"rollout.async_steps={async_steps}: the next steps' batches are generated while a step trains, with "
            f"weights up to {async_steps} step(s) older than the actor (rollout/staleness); the actor recomputes the "
            f"old log-probs, and {correction}")


def oversubscribed_cpu_warning(config: RunConfig) -> str | None:
    """Generating ahead on CPU: the rollout worker and the actor ranks compute at the same time, and
    more torch threads than cores make both crawl (on 2 cores, 2 threads each: a 0.56 s step where 1
    thread each gives 0.13 s, benchmarks/vs_trl.py)."""
    w = config.workers
    cores, busy = os.cpu_count() or 1, w.torch_threads * (w.actor_dp + 1)
    if w.gpus_per_rank or busy <= cores:
        return None
    return (f"rollout.async_steps={config.rollout.async_steps} on CPU: the rollout worker generates while "
            f"{w.actor_dp} actor rank(s) train, {busy} torch threads on {cores} cores; set "
            f"workers.torch_threads={max(cores // (w.actor_dp + 1), 1)} or the overlap is lost to contention")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _progress_line(step: int, steps: int, m: dict) -> str:
    parts = [f"step {step}/{steps}", f"reward {m['reward/mean']:.3f}"]
    if "eval/reward_mean" in m:
        parts.append(f"held-out {m['eval/reward_mean']:.3f}")
    for key, label in (("actor/kl", "kl"), ("actor/entropy", "entropy"), ("actor/grad_norm", "grad"), ("perf/step_s", "s")):
        if key in m:
            parts.append(f"{label} {m[key]:.3g}")
    return " | ".join(parts)
