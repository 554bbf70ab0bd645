"""The run configuration: omegaconf structured configs (dataclasses with defaults).

`load_config(path, overrides)` merges a YAML file and `key=value` overrides onto the defaults and
validates values. Any problem raises ConfigError with one line naming the key and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from roll_lite.loss import AGG_MODES, ROLLOUT_IS_LEVELS
from roll_lite.loss.advantages import ADVANTAGE_ESTIMATORS
from roll_lite.reproducibility import SETTINGS as REPRODUCIBLE_SETTINGS
from roll_lite.rewards import CHEAP_REWARDS, is_cheap
from roll_lite.rewards.checks import check_reward_config
from roll_lite.strategy.config import PARAM_DTYPES, StrategyConfig


class ConfigError(ValueError):
    pass


@dataclass
class ModelConfig:
    """A HF model built from this config (random init, nothing downloaded), or `pretrained_path`:
    a local folder saved with save_pretrained, or a hub id (org/name). The architecture keys below
    only apply to a model built from config."""

    model_type: str = "qwen2"
    hidden_size: int = 128
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 64
    tie_word_embeddings: bool = True
    pretrained_path: Optional[str] = None  # a local model folder or a hub id; null: build from the keys above
    tokenizer_path: Optional[str] = None  # a folder or hub id; null: pretrained_path's, else the built-in characters
    dtype: str = "float32"
    gradient_checkpointing: bool = False  # recompute activations in backward (actor, critic): less memory, slower
    trust_remote_code: bool = False  # run the model folder's own Python code (config.json auto_map); off: refuse


@dataclass
class DataConfig:
    """Prompt datasets (roll_lite/data/): JSONL / JSON, Parquet or Dataset.save_to_disk folders."""

    train_files: Any = field(default_factory=list)  # a path or a list of paths; rows are concatenated in order
    eval_files: Any = field(default_factory=list)  # held-out prompts for eval (none: no eval)
    prompt_key: str = "prompt"  # a string, or a list of chat messages [{role, content}, ...]
    answer_key: str = "answer"  # the ground truth handed to the reward (a string or a number)
    extra_keys: Optional[list[str]] = None  # fields passed to the reward; null: every other column
    apply_chat_template: bool = False  # render string prompts with the tokenizer's chat template (messages always are)
    max_prompt_length: Optional[int] = 1024  # longer prompts (in tokens) are left out, counted and logged; null: no limit
    shuffle: bool = True  # a new seeded order every epoch
    seed: Optional[int] = None  # null: the run's seed
    epochs: Optional[int] = None  # passes over the training prompts; null: unbounded (steps decides)
    eval_num_samples: int = 0  # k > 0: also sample k responses per eval prompt for eval/mean@k and eval/pass@k


@dataclass
class SFTConfig:
    """Supervised fine-tuning (roll_lite/data/sft.py): the SFT pipeline (configs/sft.yaml), or, in an RL
    config, a warm start of `steps` SFT steps on the actor before RL (0: none)."""

    train_files: Any = field(default_factory=list)  # a path or a list of paths (formats as data.train_files)
    eval_files: Any = field(default_factory=list)  # for eval/sft_loss (the SFT pipeline)
    prompt_key: str = "prompt"  # a string, or chat messages
    response_key: Optional[str] = "response"  # the target string; null: prompt_key holds whole conversations,
    # and the loss is on every assistant turn
    apply_chat_template: bool = False  # render string prompts + responses with the chat template (messages always are)
    max_length: Optional[int] = None  # longer sequences (in tokens) are left out, counted and logged; null: no limit
    shuffle: bool = True
    epochs: Optional[int] = None  # passes over the training rows; null: unbounded (steps decides)
    steps: int = 0  # optimizer steps (the SFT pipeline needs >= 1)
    batch_size: int = 64  # sequences per step; the loss is the mean over all their target tokens
    lr: float = 2e-3
    eval_every: int = 100  # the SFT pipeline: eval/sft_loss every this many steps and at the end


@dataclass
class RolloutConfig:
    engine: str = "hf"  # hf (transformers generate, CPU or GPU) | vllm (GPU)
    prompts_per_step: int = 4
    num_samples: int = 8  # completions per prompt (the GRPO group size)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_new_tokens: int = 10
    # the engine's weights: null = actor.param_dtype, the dtype the actor computes log-probs in (bfloat16
    # on GPU); the actor's weights are cast to it before each sync, which halves what travels for bf16
    dtype: Optional[str] = None
    # 0: strictly on-policy. N > 0: the batches of the next N steps are generated while this step
    # trains, with weights at most N steps old (rollout/staleness); the actor recomputes the old
    # log-probs, and algorithm.rollout_is corrects the gap to the stale weights that sampled
    async_steps: int = 0
    # true: the actor's process generates (hf engine) with a model whose tensors are the actor's own
    # parameters, so nothing is copied to sync the weights and no rollout process runs. Needs one actor
    # rank (workers.actor_dp=1) on CPU, on-policy (async_steps=0), no workers.offload, rollout.dtype = model.dtype.
    # null: true exactly when those hold (the same run, bit for bit, without a second process and copy);
    # false: a rollout worker of its own
    in_actor: Optional[bool] = None
    # rollout.engine=vllm only (roll_lite/rollout/vllm_engine.py): the fraction of each GPU vLLM takes for
    # its weights and KV cache (colocated, it shares the GPU with the actor, reference and critic);
    # release_memory: after each generation the engine sleeps (weights to CPU, KV cache dropped) and
    # wakes for the next one, so the colocated roles have the GPU while they run
    gpu_memory_utilization: float = 0.5
    release_memory: Optional[bool] = None  # null: true when colocated (workers.rollout_gpus=0), else false
    tensor_parallel_size: int = 1  # vllm's GPUs: 1 colocated, workers.rollout_gpus on GPUs of its own


@dataclass
class RewardConfig:
    # name -> weight: registered names or package.module:function import paths (roll_lite/rewards/).
    # A YAML file's or a `reward.functions={...}` override's dict replaces this one (no merging).
    functions: dict[str, float] = field(default_factory=lambda: {"exact_answer": 1.0})
    timeout_s: float = 5.0  # per call, for functions run in the guarded process (math, the user's)
    # Where the scoring runs. null: in the driver when every function is a cheap built-in string rule
    # (a Ray round trip to a reward worker would cost more than the scoring), else a reward worker of
    # its own; true: the driver (only for cheap built-ins); false: always a reward worker.
    in_driver: Optional[bool] = None


@dataclass
class AlgorithmConfig:
    advantage: str = "grpo"  # gae (PPO, needs the critic) | grpo | dr_grpo | rloo | reinforce_pp
    gamma: float = 1.0
    lam: float = 0.95
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: bool = False  # True: subtract kl_coef·KL from token rewards; False: KL as a loss term
    track_kl: bool = True  # run the reference model to report actor/kl even when kl_coef = 0
    entropy_coef: float = 0.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    dual_clip_c: Optional[float] = None
    value_clip: float = 0.2
    loss_agg_mode: str = "token-mean"
    seq_len_norm: Optional[float] = None  # seq-mean-token-sum-norm constant; default: rollout.max_new_tokens
    ppo_epochs: int = 1
    mini_batches: int = 1  # optimizer steps per epoch over the rollout batch
    # Conventions that differ between frameworks (README: "Algorithm options side by side with verl and ROLL").
    whiten_advantages: Optional[bool] = None  # null: whiten for gae and reinforce_pp, not for grpo, dr_grpo, rloo
    kl_clamp: Optional[float] = None  # null: the exact KL estimate; c > 0: clamp it to [-c, c] (verl: k3 to 10)
    # Truncated importance sampling on the rollout engine's log-probs (train / inference mismatch):
    # null: off; token: weight each token's loss by min(π_actor / π_rollout, cap); sequence: by the
    # capped product over the response. π_actor is always the actor's own (old_log_probs, or the
    # training forward's when on-policy), never the engine's.
    rollout_is: Optional[str] = None
    rollout_is_cap: float = 2.0


@dataclass
class WorkersConfig:
    actor_dp: int = 1  # D: actor ranks (one torch.distributed group)
    # null: workers.actor_dp on GPUs (rank i of each role shares the actor rank i's GPU, so they must be
    # equal), 1 on CPU
    critic_dp: Optional[int] = None
    reference_dp: Optional[int] = None
    actor_cpus: float = 1.0  # Ray CPUs reserved per actor rank (placement group bundle)
    rollout_cpus: float = 1.0
    torch_threads: int = 2  # torch threads per worker process
    # GPUs (workers/placement.py): 1 gives each actor rank a GPU, with rank i of the reference and the
    # critic, and the rollout worker, colocated on the same GPUs; 0: CPU only.
    gpus_per_rank: float = 0.0
    # GPUs of the rollout worker's own: 0 = it shares actor rank 0's GPU (colocated, the default); N >= 1 =
    # N GPUs on one node for it alone (disaggregated; with rollout.engine=vllm, rollout.tensor_parallel_size=N)
    rollout_gpus: int = 0
    placement: str = "pack"  # the actor's bundles: pack (fill a node first) | spread (one per node where possible)
    # A worker call (a step's generate, train_step, ...) that has not answered after call_timeout_s stops
    # the run (a worker that is alive but stuck); a warning names the waiting ranks every stall_warning_s.
    call_timeout_s: float = 1800.0
    stall_warning_s: float = 300.0
    # shared memory of a local Ray cluster's object store (weight sync, batches); a cluster joined with
    # ray.address keeps its own. Weight sync puts one copy of the weights in it: give a 0.5 B model >= 2048.
    object_store_mb: int = 512
    # GPUs: between its calls each model worker keeps its parameter shards and optimizer state on CPU,
    # and the rollout worker returns its cached GPU memory, so colocated roles fit a model a GPU could
    # not hold for all of them at once; costs a CPU <-> GPU copy of the weights per call. No effect on CPU.
    offload: bool = False


@dataclass
class CheckpointConfig:
    """Checkpoints under <output_dir>/<run_name>/checkpoints/step_N (roll_lite/checkpoint/)."""

    every: int = 50  # save every this many steps, and after the last one; 0: only after the last one
    keep_last: Optional[int] = 2  # keep this many newest checkpoints; null: all
    enabled: bool = True  # false: never save (resume=auto then has nothing to resume from)


@dataclass
class RunConfig:
    pipeline: str = "roll_lite.pipelines.ppo:PPOPipeline"  # import path of the pipeline class
    run_name: str = "ppo_reverse_digits"
    output_dir: str = "outputs"
    seed: int = 0
    steps: int = 200
    eval_every: int = 25
    ray_address: Optional[str] = None  # join this cluster; default: RAY_ADDRESS, else a local one
    wandb_mode: str = "disabled"  # online | offline | disabled
    wandb_project: str = "roll_lite"
    # CPU kernels of every process (roll_lite/reproducibility.py): machine = this machine's fastest (runs
    # repeat bit for bit on the same CPU type); portable = one kernel set every x86-64 CPU with AVX2 runs alike
    reproducible: str = "machine"
    save_model: bool = True  # write the trained policy and tokenizer to <output_dir>/<run_name>/final
    # auto: continue from the run directory's latest checkpoint, start fresh when the directory is new;
    # none: start fresh (refused when the run directory already holds a run); or a checkpoint folder.
    resume: Optional[str] = "auto"
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: StrategyConfig = field(default_factory=lambda: StrategyConfig(lr=2e-4, max_grad_norm=1.0))
    critic: StrategyConfig = field(default_factory=lambda: StrategyConfig(lr=1e-3, max_grad_norm=1.0))
    workers: WorkersConfig = field(default_factory=WorkersConfig)


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


def _one_of(value: Any, allowed, key: str) -> None:
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
    if rollout.engine == "vllm":
        _validate_vllm(rollout, config.workers)
    if rollout.in_actor:
        _validate_in_actor(config)
    try:  # registered names, or import paths imported here, before Ray starts (roll_lite/rewards/checks.py)
        check_reward_config(config.reward.functions, config.reward.timeout_s)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if config.reward.in_driver and (guarded := rewards_needing_a_worker(config.reward.functions)):
        raise ConfigError(f"reward.in_driver: true scores only cheap built-in rules ({', '.join(sorted(CHEAP_REWARDS))}) "
                          f"in the driver; {', '.join(guarded)} run(s) in the reward worker's guarded process. "
                          "Set reward.in_driver=null")
    algorithm = config.algorithm
    _one_of(algorithm.advantage, ADVANTAGE_ESTIMATORS, "algorithm.advantage")
    _one_of(algorithm.kl_estimator, ("k1", "k2", "k3"), "algorithm.kl_estimator")
    _one_of(algorithm.loss_agg_mode, AGG_MODES, "algorithm.loss_agg_mode")
    _check(algorithm.kl_coef >= 0, "algorithm.kl_coef", "must be >= 0")
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
    for key in ("call_timeout_s", "stall_warning_s"):
        _check(getattr(config.workers, key) > 0, f"workers.{key}", f"must be > 0 seconds, got {getattr(config.workers, key)}")
    for key in ("actor_dp", "critic_dp", "reference_dp", "torch_threads"):
        _check(getattr(config.workers, key) >= 1, f"workers.{key}", "must be >= 1")
    for key in ("actor_cpus", "rollout_cpus"):
        _check(getattr(config.workers, key) >= 0, f"workers.{key}", f"must be >= 0, got {getattr(config.workers, key)}")
    _check(w.object_store_mb >= 64, "workers.object_store_mb", f"must be >= 64, got {w.object_store_mb}")


def rewards_needing_a_worker(functions: dict) -> list[str]:
    """The reward functions that are not cheap built-ins: they run in the reward worker's guarded
    process (roll_lite/rewards/runner.py), so a run with any of them has a reward worker."""
    return [name for name in functions if not is_cheap(name)]


def in_actor_blockers(config: RunConfig) -> list[tuple[str, str]]:
    """(key, the value rollout.in_actor needs) for each setting that rules it out; none: it can run."""
    needs = [("rollout.engine", config.rollout.engine == "hf", "hf"),
             ("workers.actor_dp", config.workers.actor_dp == 1, "1 (one rank holds every parameter)"),
             ("rollout.async_steps", config.rollout.async_steps == 0, "0 (one process cannot train and generate at once)"),
             ("workers.offload", not config.workers.offload, "false (offload moves the parameters)"),
             ("workers.gpus_per_rank", not config.workers.gpus_per_rank, "0 (built for CPU; on GPUs use rollout.engine=vllm)"),
             ("rollout.dtype", rollout_dtype(config) == config.model.dtype, f"model.dtype ({config.model.dtype})")]
    return [(key, value) for key, ok, value in needs if not ok]


def _validate_in_actor(config: RunConfig) -> None:
    """rollout.in_actor: the engine's weights are the actor's parameters themselves (views)."""
    blockers = in_actor_blockers(config)
    if blockers:
        key, value = blockers[0]
        raise ConfigError(f"{key}: rollout.in_actor=true needs {key}={value}")


def _validate_vllm(rollout: RolloutConfig, workers: WorkersConfig) -> None:
    from roll_lite.rollout.vllm_engine import vllm_logprobs_mode

    _check(workers.gpus_per_rank > 0, "rollout.engine",
           "vllm runs on a GPU: set workers.gpus_per_rank=1 (or rollout.engine=hf on CPU)")
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


def _check_reward_weights(layer, path: Path | None = None) -> None:
    """`reward.functions={exact_answer:1.0}` is YAML for {'exact_answer:1.0': null}: in a flow mapping a
    colon separates a key from its value only when a space follows it (import paths keep theirs:
    `my_pkg.rewards:score`). Say so, instead of omegaconf's "is not Optional"."""
    reward = layer.get("reward") if isinstance(layer, DictConfig) else None
    functions = reward.get("functions") if isinstance(reward, DictConfig) else None
    if not isinstance(functions, DictConfig):
        return
    entries = OmegaConf.to_container(functions)
    unweighted = [name for name, weight in entries.items() if weight is None]
    if not unweighted:
        return

    def written_right(name: str, weight) -> str:
        spec, _, tail = str(name).rpartition(":")
        if weight is None and spec:
            try:
                weight = float(tail) if tail.strip() else 1.0
                name = spec
            except ValueError:
                weight = 1.0
        return f"{name}: {1.0 if weight is None else weight}"

    fixed = "{" + ", ".join(written_right(name, weight) for name, weight in entries.items()) + "}"
    example = (f"functions: {fixed}" if path else
               f"reward.functions={fixed} (quote the override in the shell: 'reward.functions={fixed}')")
    raise ConfigError(f"reward.functions: {', '.join(map(repr, unweighted))} {'has' if len(unweighted) == 1 else 'have'} "
                      f"no weight{f' in {path}' if path else ''}: YAML flow mappings need a space after the colon, "
                      f"e.g. {example}")


def _replace_reward_functions(merged, layer) -> None:
    """A layer that sets reward.functions gives the whole set: replace, do not merge with the defaults."""
    reward = layer.get("reward") if isinstance(layer, DictConfig) else None
    functions = reward.get("functions") if isinstance(reward, DictConfig) else None
    if functions is not None:
        OmegaConf.update(merged, "reward.functions", functions, merge=False)


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


def rollout_dtype(config: "RunConfig") -> str:
    """The rollout engine's weight dtype: rollout.dtype, else the actor's compute dtype."""
    return config.rollout.dtype or config.actor.param_dtype


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Defaults <- YAML file <- key=value overrides, validated; raises ConfigError."""
    try:
        merged = OmegaConf.structured(RunConfig)
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise ConfigError(f"--config: no such file '{path}'")
            layer = _load_yaml(path)
            _check_reward_weights(layer, path)
            merged = OmegaConf.merge(merged, layer)
            _replace_reward_functions(merged, layer)
        for override in overrides:
            if "=" not in override:
                raise ConfigError(f"override '{override}' is not of the form key=value")
        for override in overrides:  # in order: `reward.functions={...}` replaces, `reward.functions.NAME=w` sets one
            layer = OmegaConf.from_dotlist([override])
            _check_reward_weights(layer)
            merged = OmegaConf.merge(merged, layer)
            if override.partition("=")[0].strip() == "reward.functions":
                _replace_reward_functions(merged, layer)
        config: RunConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "config"
        message = str(error).splitlines()[0]
        raise ConfigError(f"{key}: {message}") from None
    for key in ("critic_dp", "reference_dp"):
        if getattr(config.workers, key) is None:
            setattr(config.workers, key, config.workers.actor_dp if config.workers.gpus_per_rank else 1)
    if config.rollout.release_memory is None:
        config.rollout.release_memory = config.workers.rollout_gpus == 0
    if config.rollout.in_actor is None:
        config.rollout.in_actor = not in_actor_blockers(config)
    if config.reward.in_driver is None:
        config.reward.in_driver = not rewards_needing_a_worker(config.reward.functions)
    validate(config)
    if config.model.tokenizer_path is None:  # the tokenizer comes from the model's folder / hub id
        config.model.tokenizer_path = config.model.pretrained_path
    return config


def _load_yaml(path: Path):
    try:
        return OmegaConf.load(path)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"--config: {where}: YAML syntax error: {problem}") from None


def to_yaml(config: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))
