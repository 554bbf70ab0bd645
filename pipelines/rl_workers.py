"""PPOPipeline's worker groups, apart from its step: starting them (the actor, the reference and the
critic, the rollout and reward workers, the teachers), the actor's weights to the rollout engine and the
other groups, the warm start (SFT steps on the actor before RL) and the trained policy saved at the end."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, cast

from roll_lite.config import AlgorithmConfig, RunConfig, rollout_dtype

from .run_log import describe_async_rollout, describe_fully_async, oversubscribed_cpu_warning

if TYPE_CHECKING:
    from roll_lite.workers.group import ModelGroup, RewardClient, RolloutClient
    from transformers import PreTrainedTokenizerFast

    from .async_episodes import FullyAsyncEpisodes
    from .async_schedule import FullyAsyncSchedule
    from .rollout_schedule import RolloutSchedule
    from .sft import SFTPipeline
    from .teachers import Teachers

logger = logging.getLogger("roll_lite")


class RLWorkers:
    # What this mixin reads of the pipeline it is mixed into (PPOPipeline sets them in __init__, and
    # start_workers the groups and clients): declared for the type checker only, no value here.
    config: RunConfig
    algorithm: AlgorithmConfig
    tokenizer: PreTrainedTokenizerFast
    schedule: RolloutSchedule | FullyAsyncSchedule | FullyAsyncEpisodes
    teachers: Teachers | None
    warm_start_sft: SFTPipeline | None
    use_reference: bool
    reference_in_actor: bool
    use_critic: bool
    actor: ModelGroup
    critic: ModelGroup | None
    reference: ModelGroup | None
    rollout: RolloutClient | None
    reward: RewardClient

    def start_workers(self) -> None:
        from roll_lite.workers.group import ModelGroup, RewardClient, RolloutClient, make_placement

        from roll_lite.rewards.routing import reads_text

        w = self.config.workers
        # On GPUs, the processes of rank i of every model group, the rollout worker (unless it has GPUs of its
        # own, workers.rollout_gpus, or runs in the actor's process, rollout.in_actor) and a reward worker with
        # models or judges (unless workers.reward_gpus gives it a GPU of its own) share a GPU.
        colocated_rollout = w.rollout_gpus == 0 and not self.config.rollout.in_actor
        colocated_reward = w.reward_gpus == 0 and reads_text(self.config.reward)
        reference_worker = self.use_reference and not self.reference_in_actor
        teachers = len(self.teachers.folders) if self.teachers is not None else 0
        own_processes = 0 if w.one_process_per_rank else reference_worker + self.use_critic
        placement = make_placement(
            self.config, roles_on_a_gpu=1 + own_processes + colocated_rollout + colocated_reward + teachers
        )
        self.actor = ModelGroup("actor", w.actor_dp, placement, self.config)  # processes start now; wait_ready builds
        host = self.actor if w.one_process_per_rank else None  # or processes of their own
        # cast: load_config sets reference_dp and critic_dp (None in the dataclass: "as actor_dp on GPUs, else 1")
        self.reference = (
            ModelGroup("reference", cast(int, w.reference_dp), placement, self.config, host)
            if reference_worker
            else None
        )
        self.critic = (
            ModelGroup("critic", cast(int, w.critic_dp), placement, self.config, host) if self.use_critic else None
        )
        in_actor = self.config.rollout.in_actor  # then the actor's process generates, once it is ready
        self.rollout = None if in_actor else RolloutClient(self.config, placement)
        self.reward = RewardClient(self.config, placement)
        for group in (self.actor, self.reference, self.critic):
            if group is not None:
                group.wait_ready()
        if self.teachers is not None:
            self.teachers.start(placement)
            logger.info(self.teachers.describe())
        if in_actor:
            self.rollout = RolloutClient(self.config, placement, actor=self.actor)
        self.schedule.engine = self.rollout
        for group in (self.actor, self.critic):
            if group is not None and getattr(self.config, group.role).lora.rank:
                logger.info(group.describe_lora())
        if self.reference_in_actor:
            logger.info("reference: the actor with its LoRA adapters off (no model of its own)")
        assert self.rollout is not None  # made above, in either branch
        logger.info(self.rollout.describe())
        logger.info(self.reward.describe())
        if self.config.rollout.fully_async:
            logger.info(
                describe_fully_async(self.config.rollout, self.algorithm, self.config.environment.name is not None)
            )
        if self.config.rollout.async_steps:
            logger.info(describe_async_rollout(self.config.rollout.async_steps, self.algorithm))
        if self.config.rollout.async_steps or self.config.rollout.fully_async:
            if (warning := oversubscribed_cpu_warning(self.config)) is not None:
                logger.warning(warning)

    def sync_from_actor(self, version: int) -> None:
        assert self.rollout is not None  # start_workers() made it
        self.rollout.sync(self.actor, rollout_dtype(self.config), version)
        others = [group for group in (self.reference, self.critic) if group is not None]
        if others:
            state = self.actor.state_dict_ref(part="merged")
            for group in others:
                group.load_state_dict(state)

    def warm_start(self) -> dict[str, float]:
        """sft.steps SFT steps on the actor before RL (pipelines/sft.py on sft.train_files), then the
        actor's optimizer starts afresh at actor.lr."""
        assert self.warm_start_sft is not None  # prepare_data() made it: sft.steps > 0
        self.warm_start_sft.actor = self.actor
        metrics = self.warm_start_sft.train()
        if self.config.actor.lora.rank:  # the warm-started model becomes the base (and the reference)
            self.actor.merge_adapters()
        self.actor.reset_optimizer()
        return metrics

    def save_final(self, path: Path) -> None:
        """The trained policy as a HF folder; reload it with model.pretrained_path / tokenizer_path."""
        from roll_lite.model.vision_run import save_tokenizer_files

        self.actor.save_pretrained(str(path.resolve()))
        save_tokenizer_files(self.config.model, self.config.data, self.tokenizer, path)  # a VLM's: its processor
        logger.info("saved the policy and tokenizer to %s", path)
