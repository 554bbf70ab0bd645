"""Values of a merged RunConfig checked key by key; each problem is a ConfigError naming the key.

validate(config) checks the run's own keys, data.* and workers.* here, and every other section with the
checks of its own module, in this order: validation_beyond_rl.py (sft.*, preference.*, distill.*),
validation_rollout.py (rollout.*; environment.*, the multi-turn rollouts), validation_rewards.py
(reward.*) and validation_algorithm.py (algorithm.*); workers.node_labels in node_labels.py. The derived
values live beside their section's checks (rollout_dtype and in_actor_blockers in validation_rollout.py,
rewards_needing_a_worker in validation_rewards.py, pinned_apart in node_labels.py).
"""

from __future__ import annotations

from roll_lite.config.backend import validate_backend
from roll_lite.config.key_checks import check, file_list, one_of
from roll_lite.config.node_labels import validate_node_labels
from roll_lite.config.schema import DataConfig, RunConfig
from roll_lite.config.trace import validate_trace
from roll_lite.config.validation_algorithm import validate_algorithm
from roll_lite.config.validation_beyond_rl import (
    validate_distill,
    validate_preference,
    validate_sft,
    validate_sft_source,
)
from roll_lite.config.validation_moe import validate_moe
from roll_lite.config.validation_rewards import validate_reward
from roll_lite.config.validation_rollout import validate_environment, validate_rollout
from roll_lite.config.validation_sources import validate_source
from roll_lite.config.validation_vision import validate_vision
from roll_lite.errors import ConfigError
from roll_lite.rewards.routing import reads_text
from roll_lite.runtime.reproducibility import SETTINGS as REPRODUCIBLE_SETTINGS
from roll_lite.strategy.config import PARAM_DTYPES, sequence_parallel_problem


def validate(config: RunConfig) -> None:
    check(":" in config.pipeline, "pipeline", f"'{config.pipeline}' is not of the form package.module:Class")
    check(config.steps >= 0, "steps", f"must be >= 0, got {config.steps}")
    check(config.eval_every >= 1, "eval_every", f"must be >= 1, got {config.eval_every}")
    one_of(config.wandb_mode, ("online", "offline", "disabled"), "wandb_mode")
    one_of(config.reproducible, REPRODUCIBLE_SETTINGS, "reproducible")
    check(
        bool(config.run_name) and "/" not in config.run_name and config.run_name not in (".", ".."),
        "run_name",
        f"must be a folder name (no '/'), got {config.run_name!r}",
    )
    check(bool(config.resume), "resume", "must be auto, none or the path of a checkpoint folder")
    check(
        config.checkpoint.every >= 0,
        "checkpoint.every",
        f"must be >= 0 (0: only at the end), got {config.checkpoint.every}",
    )
    check(
        config.checkpoint.keep_last is None or config.checkpoint.keep_last >= 1,
        "checkpoint.keep_last",
        f"must be >= 1 or null (keep all), got {config.checkpoint.keep_last}",
    )
    validate_trace(config.trace)
    one_of(config.model.dtype, PARAM_DTYPES, "model.dtype")
    _validate_data(config.data)
    validate_sft(config.sft)
    validate_sft_source(config.sft, config.data)
    validate_preference(config.preference)
    validate_distill(config)
    validate_rollout(config)
    validate_reward(config)
    validate_environment(config)
    validate_algorithm(config)
    _validate_roles(config)
    _validate_workers(config)
    validate_backend(config)


def _validate_roles(config: RunConfig) -> None:
    """actor.* and critic.*: each a StrategyConfig, which checks its own keys."""
    for name in ("actor", "critic"):
        check(getattr(config, name).lr > 0, f"{name}.lr", f"must be > 0, got {getattr(config, name).lr}")
        try:
            getattr(config, name).validate(f"{name}.")
        except ValueError as error:
            raise ConfigError(str(error)) from None
        _validate_sequence_parallel(config, name)
    validate_moe(config)
    validate_vision(config)


def _validate_sequence_parallel(config: RunConfig, role: str) -> None:
    """<role>.sequence_parallel against the role's ranks (the actor's S also the reference's, on
    workers.reference_dp) and, for a model built from the `model` keys, its heads (a pretrained model's heads
    are checked by pipelines/preflight.py, which reads its config.json); then the forwards that do not split
    sequences yet."""
    degree = getattr(config, role).sequence_parallel
    built = config.model.pretrained_path is None
    heads = config.model.num_attention_heads if built else None
    kv_heads = config.model.num_key_value_heads if built else None
    for ranks_key in (f"{role}_dp", "reference_dp") if role == "actor" else (f"{role}_dp",):
        problem = sequence_parallel_problem(degree, getattr(config.workers, ranks_key), heads, kv_heads)
        check(problem is None, f"{role}.sequence_parallel", f"{problem}".replace("the role's", f"workers.{ranks_key}:"))
    if degree == 1 or role != "actor":
        return
    # The RL actor, critic, reference and distillation teachers, SFT (its pipeline and the warm start), DPO and the
    # reward model split sequences (docs/sequence-parallel.md); the exact rollout mode not yet.
    check(
        not config.rollout.exact,
        "actor.sequence_parallel",
        f"{degree}: the exact rollout mode (bit for bit unverified there) does not split sequences yet; use 1, or "
        "rollout.exact=false",
    )
    actor = config.actor
    for key, used in (
        ("router_replay", actor.router_replay is not None),
        ("moe_aux_loss_coef", actor.moe_aux_loss_coef > 0),
        ("moe_z_loss_coef", actor.moe_z_loss_coef > 0),
    ):
        check(
            not used,
            "actor.sequence_parallel",
            f"{degree} with actor.{key}: MoE router replay and auxiliary losses do not split sequences yet; use 1, "
            f"or turn actor.{key} off",
        )


def _validate_workers(config: RunConfig) -> None:
    w = config.workers
    check(
        w.gpus_per_rank in (0, 1),
        "workers.gpus_per_rank",
        f"must be 0 (CPU) or 1 (a GPU per rank: nccl needs one device per rank), got {w.gpus_per_rank}",
    )
    check(w.placement in ("pack", "spread"), "workers.placement", f"must be pack or spread, got '{w.placement}'")
    check(w.rollout_gpus >= 0, "workers.rollout_gpus", f"must be >= 0 (0: colocated), got {w.rollout_gpus}")
    if w.rollout_gpus:
        check(w.gpus_per_rank > 0, "workers.rollout_gpus", "GPUs of the rollout's own need workers.gpus_per_rank=1")
        check(
            config.rollout.engine == "vllm" or w.rollout_gpus == 1,
            "workers.rollout_gpus",
            f"the hf engine generates on one GPU, got {w.rollout_gpus} (rollout.engine=vllm uses several)",
        )
    check(
        w.reward_gpus in (0, 1),
        "workers.reward_gpus",
        f"must be 0 (a share of actor rank 0's GPU) or 1 (a GPU of its own), got {w.reward_gpus}",
    )
    if w.reward_gpus:
        check(
            w.gpus_per_rank > 0, "workers.reward_gpus", "a GPU of the reward worker's own needs workers.gpus_per_rank=1"
        )
        check(
            reads_text(config.reward),
            "workers.reward_gpus",
            "the reward worker takes a GPU for reward models and judges, and this run has none (reward.models, "
            "reward.judges)",
        )
    if w.gpus_per_rank:
        for key in ("reference_dp", "critic_dp"):
            check(
                getattr(w, key) == w.actor_dp,
                f"workers.{key}",
                f"with workers.gpus_per_rank=1 the roles share the actor's GPUs: set it to workers.actor_dp={w.actor_dp}",
            )
    if w.one_process_per_rank:
        for key in ("reference_dp", "critic_dp"):
            check(
                getattr(w, key) == w.actor_dp,
                f"workers.{key}",
                f"workers.one_process_per_rank=true puts rank i of each role in actor rank i's process: set it to "
                f"workers.actor_dp={w.actor_dp}, or set workers.one_process_per_rank=false",
            )
    for key in ("call_timeout_s", "stall_warning_s"):
        check(
            getattr(config.workers, key) > 0,
            f"workers.{key}",
            f"must be > 0 seconds, got {getattr(config.workers, key)}",
        )
    for key in ("actor_dp", "critic_dp", "reference_dp", "torch_threads"):
        check(getattr(config.workers, key) >= 1, f"workers.{key}", "must be >= 1")
    for key in ("actor_cpus", "rollout_cpus"):
        check(getattr(config.workers, key) >= 0, f"workers.{key}", f"must be >= 0, got {getattr(config.workers, key)}")
    check(w.object_store_mb >= 64, "workers.object_store_mb", f"must be >= 64, got {w.object_store_mb}")
    validate_node_labels(config)


def _validate_data(data: DataConfig) -> None:
    """Values only; the files themselves are checked by roll_lite.data.prompts before anything starts."""
    data.train_files = file_list(data.train_files, "data.train_files")
    data.eval_files = file_list(data.eval_files, "data.eval_files")
    check(bool(data.prompt_key), "data.prompt_key", "must name the prompt column")
    check(bool(data.answer_key), "data.answer_key", "must name the answer column")
    check(
        data.answer_key != data.prompt_key, "data.answer_key", f"must differ from data.prompt_key ('{data.prompt_key}')"
    )
    check(
        data.max_prompt_length is None or data.max_prompt_length >= 1,
        "data.max_prompt_length",
        f"must be >= 1 or null (no limit), got {data.max_prompt_length}",
    )
    check(
        data.epochs is None or data.epochs >= 1, "data.epochs", f"must be >= 1 or null (unbounded), got {data.epochs}"
    )
    for domain, weight in data.domain_weights.items():
        check(
            isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight >= 0,
            f"data.domain_weights.{domain}",
            f"must be a number >= 0 (0 leaves the domain out), got {weight!r}",
        )
    check(not data.domain_weights or any(data.domain_weights.values()), "data.domain_weights", "needs a weight > 0")
    check(
        not data.domain_weights or data.epochs is None,
        "data.epochs",
        "must be null with data.domain_weights (each domain is drawn by its weight, without end)",
    )
    validate_source(data)
    check(
        data.eval_num_samples >= 0,
        "data.eval_num_samples",
        f"must be >= 0 (0: greedy eval only), got {data.eval_num_samples}",
    )
