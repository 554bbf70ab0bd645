"""The `environment` section of the run config (RunConfig.environment): multi-turn rollouts when
`name` is set. The comments are the keys' documentation (docs/configuration.md is rendered from them)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from roll_lite.environments.registry import ENVIRONMENTS
from roll_lite.errors import ConfigError

FAULT_ACTIONS = ("zero_reward", "drop")
TRUNCATED_ACTIONS = ("train", "mask")
CREDIT = ("trajectory", "turn")


@dataclass
class EnvironmentConfig:
    """Multi-turn rollouts (docs/multi-turn.md): each training row seeds an environment, and the model
    takes turns with it; the loss covers the model's own tokens only (model_mask)."""

    # A registered environment (guess_the_number, color_cards, tools, gem, openenv, ors) or a package.module:Class import path.
    # null: single-turn rollouts (the prompt, one completion, the reward functions).
    name: Optional[str] = None
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to the class when it is built
    # The model's turns per trajectory; after the last one the trajectory ends as truncated, whatever
    # the environment says (an environment may also end it earlier with its own limit).
    max_turns: int = 8
    max_new_tokens_per_turn: int = 32  # the engine's limit for each of the model's turns
    # Tokens after the prompt (the model's and the environment's, all turns); a turn that would pass it
    # ends the trajectory as truncated. null: only max_turns bounds it.
    max_trajectory_tokens: Optional[int] = 512
    step_timeout_s: float = 10.0  # per reset / step call; past it the call is a fault (timed_out)
    # Environment processes, so as many reset / step calls at once; the environments of all running
    # trajectories are spread over them.
    max_concurrent: int = 4
    # A trajectory ended by a fault (raised, timed_out, bad_return, bad_image, crashed, lost): zero_reward trains
    # on it with reward 0; drop leaves it out of the batch. Both count it in env/faults/<reason>.
    on_fault: str = "zero_reward"
    # A trajectory cut short (the environment's truncated, max_turns, max_trajectory_tokens): train
    # trains on it with the reward it got, which is how a policy learns that running out of turns
    # fails; mask keeps it out of the loss (its tokens get model_mask 0), for tasks where a cut says
    # nothing about the policy. Either way it is counted in env/truncated.
    truncated: str = "train"
    # trajectory: every model token of a trajectory gets the estimator's advantage of its whole
    # return; turn: each turn's tokens get the return from that turn on, minus the group baseline
    # (grpo, dr_grpo, rloo; roll_lite.loss.advantages.turn_level_advantages). gae and reinforce_pp
    # are per token already, with each turn's reward on its last token.
    credit: str = "trajectory"
    # true: reward.functions also score the last model turn's text against the row's answer
    # (data.answer_key), added to the environment's rewards on the last turn; false: the
    # environment's rewards alone.
    final_reward: bool = False


def check_environment_config(config: EnvironmentConfig, section: str = "environment") -> None:
    """One ConfigError line naming the first bad key; the class itself is checked when the runner
    loads it (in its processes, where it may import heavy packages)."""
    if config.name is None:
        return
    if not isinstance(config.name, str) or not config.name.strip():
        raise ConfigError(
            f"{section}.name: name a registered environment or a package.module:Class, got {config.name!r}"
        )
    if ":" not in config.name and config.name not in ENVIRONMENTS:  # roll_lite.environments registered them
        raise ConfigError(
            f"{section}.name: '{config.name}' is not one of {', '.join(sorted(ENVIRONMENTS))}, "
            "nor a package.module:Class import path"
        )
    if not isinstance(config.kwargs, Mapping) or not all(isinstance(key, str) for key in config.kwargs):
        raise ConfigError(f"{section}.kwargs: must be a mapping of argument names to values, got {config.kwargs!r}")
    if config.name == "gem" and (not isinstance(config.kwargs.get("env_id"), str) or not config.kwargs["env_id"]):
        raise ConfigError(
            f"{section}.kwargs.env_id: gem needs GEM's environment id (e.g. game:GuessTheNumber-v0-easy), "
            f"got {config.kwargs.get('env_id')!r}"
        )
    if config.name == "openenv":
        from roll_lite.environments.openenv_env import check_openenv_kwargs

        check_openenv_kwargs(config.kwargs, section, config.step_timeout_s)
    if config.name == "ors":
        from roll_lite.environments.ors_env import check_ors_kwargs

        check_ors_kwargs(config.kwargs, section, config.step_timeout_s)
    for key in ("max_turns", "max_new_tokens_per_turn", "max_concurrent"):
        _check_positive_int(section, key, getattr(config, key))
    if config.max_trajectory_tokens is not None:
        _check_positive_int(section, "max_trajectory_tokens", config.max_trajectory_tokens)
        if config.max_trajectory_tokens < config.max_new_tokens_per_turn:
            raise ConfigError(
                f"{section}.max_trajectory_tokens: {config.max_trajectory_tokens} is less than one "
                f"turn's max_new_tokens_per_turn={config.max_new_tokens_per_turn}"
            )
    timeout = config.step_timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ConfigError(f"{section}.step_timeout_s: must be a number > 0, got {timeout!r}")
    for key, allowed in (("on_fault", FAULT_ACTIONS), ("truncated", TRUNCATED_ACTIONS), ("credit", CREDIT)):
        if getattr(config, key) not in allowed:
            raise ConfigError(f"{section}.{key}: must be one of {', '.join(allowed)}, got {getattr(config, key)!r}")


def _check_positive_int(section: str, key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{section}.{key}: must be a whole number >= 1, got {value!r}")
