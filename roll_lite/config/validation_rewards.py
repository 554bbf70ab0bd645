"""reward.*: the sources, the reward models' and judges' keys, the code sandbox's, and which rewards need
the reward worker (rewards_needing_a_worker)."""

from __future__ import annotations

from roll_lite.config.key_checks import check, one_of
from roll_lite.config.schema import RewardConfig, RunConfig
from roll_lite.errors import ConfigError
from roll_lite.rewards import CHEAP_REWARDS, is_cheap
from roll_lite.rewards.checks import check_reward_config
from roll_lite.rewards.routing import all_sources, reads_text, uses_code


def validate_reward(config: RunConfig) -> None:
    try:  # registered names, or import paths imported here, before Ray starts (roll_lite/rewards/checks.py)
        check_reward_config(config.reward)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    one_of(config.reward.on_failure, ("zero", "drop"), "reward.on_failure")
    check(
        config.reward.model_max_tokens >= 1,
        "reward.model_max_tokens",
        f"must be >= 1, got {config.reward.model_max_tokens}",
    )
    check(
        config.reward.model_timeout_s is None or config.reward.model_timeout_s > 0,
        "reward.model_timeout_s",
        f"must be > 0 seconds or null, got {config.reward.model_timeout_s}",
    )
    check(
        config.reward.model_clip is None or config.reward.model_clip > 0,
        "reward.model_clip",
        f"must be > 0 or null, got {config.reward.model_clip}",
    )
    check(
        not (config.reward.in_driver and (reads_text(config.reward) or uses_code(config.reward))),
        "reward.in_driver",
        "true scores only cheap built-in rules in the driver; reward models, judges and the code sandbox run in "
        "the reward worker. Set reward.in_driver=null",
    )
    if uses_code(config.reward):
        _validate_code(config.reward)
    check(
        config.reward.judge_max_new_tokens >= 1,
        "reward.judge_max_new_tokens",
        f"must be >= 1, got {config.reward.judge_max_new_tokens}",
    )
    check(
        config.reward.judge_timeout_s is None or config.reward.judge_timeout_s > 0,
        "reward.judge_timeout_s",
        f"must be > 0 or null (no limit), got {config.reward.judge_timeout_s}",
    )
    one_of(config.reward.judge_engine, ("hf", "vllm"), "reward.judge_engine")
    if config.reward.judge_engine == "vllm":
        check(
            config.reward.judge_timeout_s is None,
            "reward.judge_timeout_s",
            "a vLLM judge's generation has no time limit: set it to null, or reward.judge_engine=hf",
        )
        check(
            0 < config.reward.judge_gpu_memory_utilization < 1,
            "reward.judge_gpu_memory_utilization",
            f"must be in (0, 1), got {config.reward.judge_gpu_memory_utilization}",
        )
    if config.reward.in_driver and (guarded := rewards_needing_a_worker(all_sources(config.reward, "functions"))):
        raise ConfigError(
            f"reward.in_driver: true scores only cheap built-in rules ({', '.join(sorted(CHEAP_REWARDS))}) "
            f"in the driver; {', '.join(guarded)} run(s) in the reward worker's guarded process. "
            "Set reward.in_driver=null"
        )


def rewards_needing_a_worker(functions: dict[str, float]) -> list[str]:
    """The reward functions that are not cheap built-ins: they run in the reward worker's guarded
    process (roll_lite/rewards/runner.py), so a run with any of them has a reward worker."""
    return [name for name in functions if not is_cheap(name)]


def _validate_code(reward: RewardConfig) -> None:
    """The code source's keys and limits. The sandbox's tools are checked where it runs: the reward
    worker, when it starts, runs a program in it before the first step (on a cluster its node may not
    be the driver's)."""
    from roll_lite.rewards.code import EXTRACTIONS, SCORINGS, sandbox_limits
    from roll_lite.sandbox.isolation import MODES

    one_of(reward.code_extract, EXTRACTIONS, "reward.code_extract")
    one_of(reward.code_score, SCORINGS, "reward.code_score")
    box = reward.sandbox
    check(box.workers is None or box.workers >= 1, "reward.sandbox.workers", f"must be >= 1 or null, got {box.workers}")
    one_of(box.isolation, MODES, "reward.sandbox.isolation")
    try:
        sandbox_limits(box)
    except ValueError as error:
        raise ConfigError(f"reward.sandbox: {error}") from None
