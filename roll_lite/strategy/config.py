"""Settings of the training strategy (micro-batching, packing, loss scale, optimizer)."""

from __future__ import annotations

from dataclasses import dataclass, field

from roll_lite.lora.settings import LoraSettings

LR_SCHEDULES = ("constant", "cosine")
PARAM_DTYPES = ("float32", "bfloat16", "float64")
ENGINE_ROUTING = ("compare", "rollout")  # the router_replay values that need the rollout engine to record routing
ROUTER_REPLAY = (*ENGINE_ROUTING, "old")


@dataclass
class StrategyConfig:
    grad_accum_steps: int = 1  # A: micro-batches per rank per optimizer step (count mode)
    use_packing: bool = False  # pack each micro-batch's sequences into one row (varlen attention)
    max_tokens_per_micro_batch: int | None = None  # token-budget micro-batches instead of a count; needs packing
    trim_padding: bool = True  # cut each micro-batch to its longest row (padded: longest rows grouped together)
    apply_loss_scale: bool = True  # multiply micro-batch losses by D·A (losses with global denominators)
    max_grad_norm: float | None = 1.0  # None: no clipping (the norm is still reported)
    lr: float = 1e-5  # AdamW's learning rate (after warmup, before the schedule)
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    adam_beta1: float = 0.9  # AdamW's first-moment decay
    adam_beta2: float = 0.999  # AdamW's second-moment decay
    adam_eps: float = 1e-8  # AdamW's epsilon
    warmup_steps: int = 0  # optimizer steps of linear warm-up from lr/warmup_steps to lr
    lr_schedule: str = "constant"  # after warm-up: constant | cosine (to 0 at total_steps)
    total_steps: int = 0  # for the cosine schedule
    param_dtype: str = "float32"  # compute dtype under FSDP2 mixed precision (bfloat16 on GPU)
    logprob_chunk_size: int = 1024  # tokens per chunk of the LM head
    # the forward runs batch-invariant kernels (roll_lite/model/batch_invariant.py): a token's log-prob does
    # not depend on its micro-batch, padding or packing. rollout.exact turns it on for the actor
    batch_invariant: bool = False
    max_consecutive_skipped_steps: int | None = 3  # stop after this many nan/inf steps in a row; null: never
    # AdamW's fused kernel instead of foreach: on CPU its sqrt is the exact (IEEE) one on every CPU,
    # where foreach's goes through MKL's vector math, which rounds otherwise on AVX-512 than on AVX2
    # CPUs; reproducible=portable turns it on for the actor and the critic
    adamw_fused: bool = False
    # S: Ulysses sequence parallelism (docs/sequence-parallel.md). The role's ranks (workers.actor_dp, critic_dp;
    # the reference runs at the actor's S on workers.reference_dp) form D = ranks / S data-parallel groups of S
    # ranks; the S ranks of a group share its rows, each holding 1/S of every sequence. S must divide the role's
    # ranks and the model's attention heads, and the KV heads must be a multiple or a divisor of S (fewer KV heads
    # than S are repeated). Above 1: on Ray, every forward of the RL (the teachers too), SFT (and warm start), DPO
    # and reward-model pipelines; not yet rollout.exact
    sequence_parallel: int = 1
    # MoE policies (roll_lite/loss/aux.py), the actor's: weight of the load-balancing loss E/L · Σ_l Σ_e f_le · P_le
    # (Switch Transformer's, with f_le from the expert counts of the whole step over every rank and micro-batch,
    # as in Qwen's global-batch balancing), over every real token (prompt and response). 0: off; above 0 (or
    # moe_z_loss_coef above 0) the strategy counts the step's experts in a no-grad forward first, and the actor's
    # every training step (RL, and an SFT warm start) adds the losses to its loss; the critic's: only 0
    moe_aux_loss_coef: float = 0.0
    # MoE policies, the actor's: weight of the router z-loss, the mean over real tokens and layers of
    # logsumexp(router logits)² (ST-MoE). 0: off
    moe_z_loss_coef: float = 0.0
    # MoE policies, the actor's (docs/moe.md): null (off) | compare | rollout | old. rollout (R3): the old-log-prob
    # and training forwards use the experts the rollout engine chose for each prompt and response token, per layer
    # (the hf engine records them); compare: the engine records them and the trainer routes on its own, logging the
    # routing drift (moe/routing_drift) without replaying. Both need rollout.engine=hf; multi-turn trajectories and
    # partial rollouts keep each token's routing from the forward that first read it. old (R2, any engine, vLLM's
    # too): the old-log-prob forward records the trainer's own routing and every training forward of the step
    # replays it (a step with one update and no old-log-prob pass routes on its own: the same weights)
    router_replay: str | None = None
    # EP: expert parallelism for MoE policies (docs/moe.md), the actor's. The role's R ranks form R / EP groups of EP;
    # each rank of a group holds num_experts / EP experts of every MoE layer and the group's tokens go to their
    # experts' owner by all-to-all; every rank still trains on its own rows (D = R). EP must divide the role's ranks
    # and the model's experts; not with sequence_parallel above 1, LoRA, rollout.exact or gradient checkpointing.
    # The reference and the teachers run at 1 (every expert, FSDP2-sharded); the critic's: only 1
    expert_parallel: int = 1
    lora: LoraSettings = field(default_factory=LoraSettings)

    def validate(self, prefix: str = "") -> None:
        def fail(key, message):
            raise ValueError(f"{prefix}{key}: {message}")

        if self.grad_accum_steps < 1:
            fail("grad_accum_steps", f"must be >= 1, got {self.grad_accum_steps}")
        if self.max_tokens_per_micro_batch is not None:
            if self.max_tokens_per_micro_batch < 1:
                fail("max_tokens_per_micro_batch", f"must be >= 1 or null, got {self.max_tokens_per_micro_batch}")
            if not self.use_packing:
                fail("max_tokens_per_micro_batch", "token-budget micro-batches need use_packing=true")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            fail("max_grad_norm", f"must be > 0 or null, got {self.max_grad_norm}")
        if self.lr < 0:
            fail("lr", f"must be >= 0, got {self.lr}")
        if self.lr_schedule not in LR_SCHEDULES:
            fail("lr_schedule", f"'{self.lr_schedule}' is not one of {', '.join(LR_SCHEDULES)}")
        if self.lr_schedule == "cosine" and self.total_steps < 1:
            fail("total_steps", "the cosine schedule needs total_steps >= 1")
        if self.param_dtype not in PARAM_DTYPES:
            fail("param_dtype", f"'{self.param_dtype}' is not one of {', '.join(PARAM_DTYPES)}")
        if self.logprob_chunk_size < 1:
            fail("logprob_chunk_size", f"must be >= 1, got {self.logprob_chunk_size}")
        if self.max_consecutive_skipped_steps is not None and self.max_consecutive_skipped_steps < 1:
            fail("max_consecutive_skipped_steps", f"must be >= 1 or null, got {self.max_consecutive_skipped_steps}")
        if self.sequence_parallel < 1:
            fail("sequence_parallel", f"must be >= 1, got {self.sequence_parallel}")
        if self.expert_parallel < 1:
            fail("expert_parallel", f"must be >= 1, got {self.expert_parallel}")
        if self.expert_parallel > 1 and self.sequence_parallel > 1:
            fail(
                "expert_parallel",
                f"{self.expert_parallel} with {prefix}sequence_parallel={self.sequence_parallel}: the two are not "
                "composed yet; set one of them to 1",
            )
        if self.expert_parallel > 1 and self.lora.rank:
            fail(
                "expert_parallel",
                f"{self.expert_parallel} with LoRA ({prefix}lora.rank > 0) is not supported yet; use 1",
            )
        if self.router_replay is not None and self.router_replay not in ROUTER_REPLAY:
            fail("router_replay", f"'{self.router_replay}' is not one of null, {', '.join(ROUTER_REPLAY)}")
        for key in ("moe_aux_loss_coef", "moe_z_loss_coef"):
            if not getattr(self, key) >= 0:  # also catches nan
                fail(key, f"must be >= 0, got {getattr(self, key)}")
        self.lora.validate(f"{prefix}lora.")


def sequence_parallel_problem(degree: int, ranks: int, heads: int | None, kv_heads: int | None) -> str | None:
    """Why a sequence-parallel degree cannot run on `ranks` ranks with a model of `heads` query and
    `kv_heads` key / value heads (None: unknown, not checked), or None when it can. Ulysses gives each of
    the S ranks 1/S of the query heads; key / value heads go the same way when S divides them, and when
    there are fewer of them than S, each is repeated S / kv_heads times (then S must be a multiple of them)."""
    if degree == 1:
        return None
    if ranks % degree:
        return f"{degree} does not divide the role's {ranks} ranks (D = ranks / S data-parallel groups)"
    if heads is not None and heads % degree:
        return f"{degree} does not divide the model's {heads} attention heads (each rank attends with heads / S)"
    if kv_heads is not None and kv_heads % degree and degree % kv_heads:
        return (
            f"the model's {kv_heads} key / value heads are neither a multiple of {degree} nor a divisor of it "
            "(fewer than S are repeated to S, which needs S to be a multiple of them)"
        )
    return None


def expert_parallel_problem(degree: int, ranks: int, num_experts: int | None) -> str | None:
    """Why an expert-parallel degree cannot run on `ranks` ranks with a model of `num_experts` experts per MoE
    layer (None: unknown, not checked), or None when it can: every rank of an EP group owns num_experts / EP."""
    if degree == 1:
        return None
    if ranks % degree:
        return f"{degree} does not divide the role's {ranks} ranks (R / EP groups of EP ranks)"
    if num_experts is not None and num_experts % degree:
        return f"{degree} does not divide the model's {num_experts} experts (each rank of a group owns experts / EP)"
    return None
