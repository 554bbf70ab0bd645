"""algorithm.*: the advantage estimator, the policy loss (a user's loss_func imported here), DAPO's keys
and the rollout correction's."""

from __future__ import annotations

from roll_lite.config.key_checks import check, one_of
from roll_lite.config.schema import AlgorithmConfig, RunConfig
from roll_lite.errors import ConfigError
from roll_lite.loss import AGG_MODES, POLICY_LOSSES, ROLLOUT_IS_LEVELS, RolloutCorrection
from roll_lite.loss.advantages import ADVANTAGE_ESTIMATORS


def validate_algorithm(config: RunConfig) -> None:
    rollout = config.rollout
    algorithm = config.algorithm
    one_of(algorithm.advantage, ADVANTAGE_ESTIMATORS, "algorithm.advantage")
    one_of(algorithm.kl_estimator, ("k1", "k2", "k3"), "algorithm.kl_estimator")
    one_of(algorithm.loss_agg_mode, AGG_MODES, "algorithm.loss_agg_mode")
    check(algorithm.kl_coef >= 0, "algorithm.kl_coef", "must be >= 0")
    _validate_policy_loss(algorithm)
    _validate_dapo(config)
    check(algorithm.dual_clip_c is None or algorithm.dual_clip_c > 1, "algorithm.dual_clip_c", "must be > 1 or null")
    check(
        algorithm.seq_len_norm is None or algorithm.seq_len_norm > 0,
        "algorithm.seq_len_norm",
        f"must be > 0 or null (null: rollout.max_new_tokens), got {algorithm.seq_len_norm}",
    )
    check(algorithm.ppo_epochs >= 1, "algorithm.ppo_epochs", "must be >= 1")
    check(algorithm.mini_batches >= 1, "algorithm.mini_batches", "must be >= 1")
    check(
        algorithm.kl_clamp is None or algorithm.kl_clamp > 0,
        "algorithm.kl_clamp",
        f"must be > 0 or null (null: the exact KL estimate), got {algorithm.kl_clamp}",
    )
    if algorithm.rollout_is is not None:
        one_of(algorithm.rollout_is, ROLLOUT_IS_LEVELS, "algorithm.rollout_is")
    check(algorithm.rollout_is_cap > 0, "algorithm.rollout_is_cap", f"must be > 0, got {algorithm.rollout_is_cap}")
    _validate_rollout_correction(algorithm)
    batch_size = rollout.prompts_per_step * rollout.num_samples
    check(
        algorithm.mini_batches <= batch_size,
        "algorithm.mini_batches",
        f"must be <= the rollout batch ({batch_size} sequences)",
    )
    if algorithm.advantage in ("grpo", "dr_grpo", "rloo"):
        check(rollout.num_samples >= 2, "rollout.num_samples", f"{algorithm.advantage} needs >= 2 samples per prompt")


def _validate_policy_loss(algorithm: AlgorithmConfig) -> None:
    name = algorithm.policy_loss
    if ":" in name:  # a user's loss_func: imported here, before Ray starts (like the reward functions)
        from roll_lite.runtime.importing import load_object

        try:
            loss_func = load_object(name, search_cwd=True)
        except Exception as error:  # not found, or the module raised while importing
            raise ConfigError(f"algorithm.policy_loss: {error}") from None
        check(callable(loss_func), "algorithm.policy_loss", f"'{name}' is not a function")
    else:
        one_of(name, sorted(POLICY_LOSSES) + ["package.module:function"], "algorithm.policy_loss")
    for key in ("clip_ratio_low", "clip_ratio_high"):
        value = getattr(algorithm, key)
        check(
            value is None or value >= 0, f"algorithm.{key}", f"must be >= 0 or null (the loss's default), got {value}"
        )
    check(
        algorithm.dual_clip_c is None or name == "ppo",
        "algorithm.dual_clip_c",
        f"dual clip is ppo's; algorithm.policy_loss={name} has none: set it to null",
    )
    check(
        not algorithm.entropy_coef or name in ("ppo", "cispo"),
        "algorithm.entropy_coef",
        f"the entropy bonus is in ppo's and cispo's loss; algorithm.policy_loss={name} has none: set it to 0",
    )


def _validate_dapo(config: RunConfig) -> None:
    a, multi_turn = config.algorithm, config.environment.name is not None
    if a.dynamic_sampling:
        check(
            a.advantage in ("grpo", "dr_grpo", "rloo"),
            "algorithm.dynamic_sampling",
            f"drops groups of equal scores: it needs a group estimator (grpo, dr_grpo, rloo), not {a.advantage}",
        )
        check(
            config.rollout.async_steps == 0 and not config.rollout.fully_async,
            "algorithm.dynamic_sampling",
            "samples more prompts with the current weights: it needs rollout.async_steps=0 and rollout.fully_async=false",
        )
    check(a.max_sampling_rounds >= 0, "algorithm.max_sampling_rounds", f"must be >= 0, got {a.max_sampling_rounds}")
    buffer = a.overlong_buffer
    check(
        buffer is None or 0 < buffer <= config.rollout.max_new_tokens,
        "algorithm.overlong_buffer",
        f"must be null or in 1..rollout.max_new_tokens ({config.rollout.max_new_tokens}), got {buffer}",
    )
    check(a.overlong_penalty >= 0, "algorithm.overlong_penalty", f"must be >= 0, got {a.overlong_penalty}")
    for key in ("dynamic_sampling", "overlong_buffer", "overlong_filter"):
        check(
            not (multi_turn and getattr(a, key)),
            f"algorithm.{key}",
            "is for single-turn rollouts; multi-turn runs (environment.name) have environment.truncated",
        )


def _validate_rollout_correction(algorithm: AlgorithmConfig) -> None:
    """The rollout_* keys together (the loss package's RolloutCorrection names each bad one)."""
    problems = RolloutCorrection.problems(algorithm)
    if problems:
        raise ConfigError("; ".join(f"algorithm.{key}: {message}" for key, message in problems))
