"""The run configuration: omegaconf structured configs (dataclasses with defaults).

`load_config(path, overrides)` merges a YAML file and `key=value` overrides onto the defaults and
validates values. Any problem raises ConfigError with one line naming the key and what is allowed.

schema.py                the sections (ModelConfig, DataConfig, ..., RunConfig): every key, default and comment
validation.py            validate(config): the run's own keys, data.* and workers.*, then each section's checks
validation_rollout.py    rollout.* and environment.*; rollout_dtype, in_actor_blockers, in_actor_by_default
validation_rewards.py    reward.*; rewards_needing_a_worker
validation_algorithm.py  algorithm.*
validation_beyond_rl.py  sft.*, preference.*, distill.*
node_labels.py           workers.node_labels (roles pinned to Ray nodes by label); pinned_apart
backend.py               workers.backend: what `local` (every worker in roll-train's process, no Ray) can run
key_checks.py            check, one_of, file_list: each failure a ConfigError naming the key
loading.py               load_config (file, overrides), to_yaml
"""

from roll_lite.config.loading import load_config, to_yaml
from roll_lite.config.schema import (
    AlgorithmConfig,
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    PreferenceConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    SFTConfig,
    WorkersConfig,
)
from roll_lite.config.validation import validate
from roll_lite.config.validation_rewards import rewards_needing_a_worker
from roll_lite.config.validation_rollout import in_actor_blockers, rollout_dtype
from roll_lite.errors import ConfigError
from roll_lite.strategy.config import StrategyConfig

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "PreferenceConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "StrategyConfig",
    "WorkersConfig",
    "in_actor_blockers",
    "load_config",
    "rewards_needing_a_worker",
    "rollout_dtype",
    "to_yaml",
    "validate",
]
