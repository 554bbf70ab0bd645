"""Settings of the training strategy (micro-batching, packing, loss scale, optimizer)."""

from __future__ import annotations

from dataclasses import dataclass, field

from roll_lite.lora.settings import LoraSettings

LR_SCHEDULES = ("constant", "cosine")
PARAM_DTYPES = ("float32", "bfloat16", "float64")


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
        self.lora.validate(f"{prefix}lora.")
