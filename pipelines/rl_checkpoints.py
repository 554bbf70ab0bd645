"""What an RL pipeline's checkpoints hold and how they load (pipelines/session.py, roll_lite/checkpoint/):
PPOPipeline's (and so MultiTurnPipeline's) checkpoint interface, apart from its step."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from roll_lite.config import rollout_dtype

if TYPE_CHECKING:
    import torch
    from roll_lite.workers.group import ModelGroup, RolloutClient

    from roll_lite.config import RunConfig

    from .async_episodes import FullyAsyncEpisodes
    from .async_schedule import FullyAsyncSchedule
    from .rollout_schedule import RolloutSchedule


class RLCheckpoints:
    # What this mixin reads of the pipeline it is mixed into (PPOPipeline sets them: config, schedule and
    # _shuffle in __init__, the model groups and the rollout client in start_workers): declared for the
    # type checker only, no value here.
    config: RunConfig
    schedule: RolloutSchedule | FullyAsyncSchedule | FullyAsyncEpisodes
    _shuffle: torch.Generator
    actor: ModelGroup
    critic: ModelGroup | None
    reference: ModelGroup | None
    rollout: RolloutClient | None

    checkpoint_kind = "rl"
    # Besides the model's: the keys that decide which prompts the sampler's saved position refers to.
    checkpoint_compat_keys: tuple[str, ...] = (
        "algorithm.advantage",
        "data.train_files",
        "data.shuffle",
        "data.domain_weights",
    )

    total_steps_key = "steps"

    @property
    def total_steps(self) -> int:
        return self.config.steps

    def checkpoint_groups(self) -> dict[str, ModelGroup]:
        """The model groups a checkpoint holds. The reference too: after a warm start it holds the
        warm-started policy, not the build."""
        groups = {"actor": self.actor, "critic": self.critic, "reference": self.reference}
        return {name: group for name, group in groups.items() if group is not None}

    def save_driver_state(self, folder: Path) -> None:
        """The rollout engine's sampling position and generators; the mini-batch shuffle's generator;
        the generations launched ahead (rollout.async_steps), fetched first."""
        from roll_lite.checkpoint.rng import save_rng

        self.schedule.save(folder)
        assert self.rollout is not None
        self.rollout.save_checkpoint(str(folder / "rng_rollout.pkl"))
        save_rng(folder / "rng_driver.pkl", {"minibatch_shuffle": self._shuffle.get_state()})

    def load_driver_state(self, folder: Path, step: int) -> None:
        from roll_lite.checkpoint.rng import load_rng

        assert self.rollout is not None
        self.rollout.sync(self.actor, rollout_dtype(self.config), version=step)
        self.rollout.load_checkpoint(str(folder / "rng_rollout.pkl"))
        self.schedule.load(folder)
        self._shuffle.set_state(load_rng(folder / "rng_driver.pkl")["minibatch_shuffle"])
