"""FSDP2 training strategy: the only place that touches torch.distributed and fully_shard.

A step on each of the D ranks (each holding its share of the global batch):
  1. sum every loss mask over the rank's whole share, all-reduce -> global token / sample counts;
  2. split the share into micro-batches (count or token budget, optionally packed), and make every
     rank run the same number of forward/backward passes (short ranks run placeholder passes);
  3. per micro-batch: forward, loss_func with the global counts in meta_info, backward of
     loss · D·A / A (FSDP2 then averages over D, so the step's gradient is that of Σ losses);
  4. clip the global grad norm, optimizer and LR-scheduler step; reduce metrics over ranks.

On one rank with nothing to cast (param_dtype = the model's dtype) the model is not wrapped: FSDP2
would cut each tensor into one shard and run its hooks around every layer for the same values
(1.43x the bare step on vs_trl's GRPO batch on CPU, benchmarks/one_rank.py); tests/test_strategy.py
checks that the two agree bit for bit.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from roll_lite.data import DataProto, undo_permutation
from roll_lite.model.attention import packed_attention_path
from roll_lite.model.modeling import decoder_layers
from roll_lite.runtime.metrics import reduce_metrics, to_float
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.distributed import broadcast_from_rank0, init_distributed, resolve_device
from roll_lite.strategy.expert_parallel import ExpertParallel, expert_parallel_mesh, shard_experts, whole_experts
from roll_lite.strategy.micro_batches import (
    LossFunc,
    forward_placeholder,
    global_stats_meta,
    local_mask_sums,
    loss_mask_keys,
    micro_batch_groups,
    pad_columns,
    pad_to_count,
    select_micro_batch,
    split_micro_batches,
    train_micro_batches,
)
from roll_lite.strategy.moe_stats import forward_only_forward, moe_step_setup, uses_moe_forward
from roll_lite.strategy.non_finite import NonFiniteStepsError, describe_non_finite, skipped_step_message
from roll_lite.strategy.optim import clip_grad_norm, lr_lambda
from roll_lite.strategy.sequence_parallel import SequenceParallel, sequence_parallel_mesh
from roll_lite.strategy.vision_inputs import policy_head, scalar_head

logger = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _dtype_of(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _check_sequence_parallel(lm: nn.Module, degree: int, world_size: int) -> None:
    from roll_lite.strategy.config import sequence_parallel_problem

    heads = getattr(lm.config, "num_attention_heads", None)
    problem = sequence_parallel_problem(degree, world_size, heads, getattr(lm.config, "num_key_value_heads", heads))
    if problem is not None:
        raise ValueError(f"strategy.sequence_parallel: {problem}")


class FSDP2Strategy:
    """FSDP2 over the default process group. `head` picks what the model returns: 'log_probs'
    (policy, reference), 'value' (critic) or 'score' (a reward model in training, its new head drawn
    from `head_seed`); `trainable=False` builds no optimizer (reference). With config.sequence_parallel
    = S > 1 the ranks form D = ranks / S groups of S (sequence_parallel.py): give the S ranks of data-parallel
    rank `dp_rank` the same share of the global batch. With config.expert_parallel = EP > 1 (an MoE model) every rank
    holds num_experts / EP experts of each MoE layer (expert_parallel.py) and is still a data-parallel rank of its own."""

    def __init__(
        self,
        lm: nn.Module,
        config: StrategyConfig,
        *,
        head: str = "log_probs",
        trainable: bool = True,
        device: torch.device | None = None,
        shard_single_rank: bool = False,
        head_seed: int = 0,
    ):
        config.validate("strategy.")
        self.config = config
        self.device = resolve_device(device)
        self.rank, self.world_size = init_distributed(self.device)
        # S = EP = 1: no mesh of its own, FSDP2 on the default group's one-dimensional mesh (_shard)
        self.mesh: DeviceMesh | None = None
        self.sequence_parallel: SequenceParallel | None = None
        self.expert_parallel: ExpertParallel | None = None  # EP > 1: this rank's EP group (expert_parallel.py)
        if config.expert_parallel > 1:
            self.mesh, self.expert_parallel = expert_parallel_mesh(
                lm, config.expert_parallel, self.device.type, self.world_size
            )
        if config.sequence_parallel > 1:
            _check_sequence_parallel(lm, config.sequence_parallel, self.world_size)
            self.mesh, self.sequence_parallel = sequence_parallel_mesh(
                self.device.type, self.world_size, config.sequence_parallel
            )
        sp = self.sequence_parallel
        self.dp_size: int = sp.dp_size if sp else self.world_size  # D, and this rank's place among them
        self.dp_rank: int = sp.dp_rank if sp else self.rank
        if head == "log_probs":
            model = policy_head(lm.to(self.device), config.logprob_chunk_size)  # a VLM's: vision.py
        elif head in ("value", "score"):  # a VLM's too: vision_inputs.py
            model = scalar_head(lm.to(self.device), head, seed=head_seed).to(self.device)
        else:
            raise ValueError(f"unknown head '{head}'; choose log_probs, value or score")
        self.sharded = self.world_size > 1 or shard_single_rank or DTYPES[config.param_dtype] != _dtype_of(model)
        self.model = self._shard(model) if self.sharded else model
        self.optimizer = self.scheduler = None
        self.skipped_in_a_row = 0
        self.offloaded = False
        self.frozen_in_checkpoint = False  # checkpoints hold frozen parameters too (roll_lite/strategy/checkpoint.py)
        if trainable:
            self.reset_optimizer()
        self.attention_path, why = packed_attention_path(self.device, DTYPES[config.param_dtype])
        if self.rank == 0:
            how = (
                f"FSDP2 on {self.world_size} rank(s), {dist.get_backend()} backend"
                if self.sharded
                else "one rank, nothing to cast: the model trains unwrapped (FSDP2 would make one shard of each tensor)"
            )
            logger.info("%s, device %s; packed attention: %s (%s)", how, self.device, self.attention_path, why)

    def reset_optimizer(self, lr: float | None = None) -> None:
        """A fresh AdamW (no moments) and LR schedule, at `lr` or the configured one."""
        config = self.config
        # After a no_grad forward (compute_log_probs) the root module keeps its parameters unsharded
        # (FSDP2 reshards the root only after backward) and model.parameters() would hand the
        # optimizer those transient tensors: the embeddings and final norm would never train.
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        # foreach: one fused op per step instead of a Python loop of DTensor ops (torch only
        # picks it by default for CUDA tensors; on CPU the loop was ~35 % of a tiny train step).
        # fused (adamw_fused): one kernel per tensor whose sqrt is exact on every CPU (StrategyConfig).
        kernel = {"fused": True} if config.adamw_fused else {"foreach": True}
        self.optimizer = torch.optim.AdamW(
            self.trainable_parameters(),
            lr=config.lr if lr is None else lr,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
            **kernel,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(config))

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What the optimizer steps: every parameter, or with LoRA (roll_lite/lora/adapters.py) the adapters
        alone. Frozen parameters get no gradient, so clipping and the non-finite guard skip them too."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def has_frozen_parameters(self) -> bool:
        return any(not p.requires_grad for p in self.model.parameters())

    # -- memory between phases (colocated roles) ----------------------------------------------

    def offload(self) -> None:
        """Move this rank's parameter shards and AdamW state to CPU, drop the gradients, and hand
        the freed GPU memory back to the driver, so a colocated role (the rollout engine, the
        reference) can use it. On CPU there is nothing to do. `onload` undoes it; nothing else
        may touch the model in between."""
        if self.device.type != "cuda" or self.offloaded:
            return
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)  # the step's gradients are spent by now
        self.model.to("cpu")  # FSDP2 moves the sharded parameters (DTensor local shards)
        self._move_optimizer_state(torch.device("cpu"))
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self.offloaded = True

    def onload(self) -> None:
        if not self.offloaded:
            return
        self.model.to(self.device)
        self._move_optimizer_state(self.device)
        self.offloaded = False

    def _move_optimizer_state(self, device: torch.device) -> None:
        if self.optimizer is None:
            return
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":  # AdamW keeps its step count on CPU
                    state[key] = value.to(device, non_blocking=True)

    def _shard(self, model: nn.Module) -> nn.Module:
        # Every rank must start from the same weights: take rank 0's (in a few flattened broadcasts).
        broadcast_from_rank0([tensor.data for tensor in list(model.parameters()) + list(model.buffers())])
        compute_dtype, model_dtype = DTYPES[self.config.param_dtype], _dtype_of(model)
        mp_policy = MixedPrecisionPolicy()
        if compute_dtype != model_dtype:
            mp_policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        mesh = self.mesh if self.mesh is not None else init_device_mesh(self.device.type, (self.world_size,))
        if self.expert_parallel is not None:  # the experts first: the layers' fully_shard then leaves them
            shard_experts(model, self.expert_parallel, mp_policy)
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
        fully_shard(model, mesh=mesh, mp_policy=mp_policy)
        return model

    # -- collectives --------------------------------------------------------------------------

    def _all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        on_device = tensor.to(self.device)
        dist.all_reduce(on_device, op=op, group=group)
        return on_device.cpu()

    def _same_count_on_all_ranks(self, count: int) -> int:
        return int(self._all_reduce(torch.tensor([count], dtype=torch.long), dist.ReduceOp.MAX).item())

    def _gather_records(self, records: list[dict]) -> list[dict]:
        local = [{name: to_float(value) for name, value in record.items()} for record in records]
        if self.sequence_parallel is not None and self.sequence_parallel.rank:
            local = []  # the group's first rank reports; the others hold the same values
        if self.world_size == 1:
            return local
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, local)
        return [record for rank_records in gathered for record in rank_records]

    # -- training -----------------------------------------------------------------------------

    def train_step(self, data: DataProto, loss_func: LossFunc) -> dict[str, float]:
        """One optimizer step on this rank's share of the global batch; returns reduced metrics."""
        if self.optimizer is None:
            raise RuntimeError("this strategy was built with trainable=False (e.g. a reference model)")
        keys = loss_mask_keys(data)
        sums, sp = local_mask_sums(data, keys), self.sequence_parallel
        if sp is not None:  # counted over the D groups only: a token once, not once per rank of its group
            sp.check_same_rows(sums, len(data), self.device)
        stats_meta = global_stats_meta(self._all_reduce(sums, group=sp.dp_group if sp else None), keys)
        micro_batches = split_micro_batches(data, self.config)
        num_micro_batches = self._same_count_on_all_ranks(len(micro_batches))

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        padded, forward = pad_to_count(micro_batches, num_micro_batches), None
        if uses_moe_forward(data, self.config):  # MoE aux losses' global counts, router replay (moe_stats.py)
            reduce = functools.partial(self._all_reduce, group=sp.dp_group if sp else None)
            moe_meta, forward, loss_func = moe_step_setup(
                self.model, data, padded, self.config, self.device, reduce, loss_func
            )
            stats_meta.update(moe_meta)
        records = train_micro_batches(
            self.model,
            padded,
            loss_func,
            stats_meta,
            self.config,
            self.dp_size,
            self.device,
            self.sequence_parallel,
            forward=forward,
        )
        grad_norm = self._clip_grad_norm()
        skipped = not math.isfinite(grad_norm)
        if skipped:
            self._skip_step(grad_norm, data, keys)
        else:
            self.skipped_in_a_row = 0
            self.optimizer.step()
        lr = self.scheduler.get_last_lr()[0]
        with warnings.catch_warnings():  # the schedule counts skipped steps too, on purpose
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            self.scheduler.step()

        metrics = reduce_metrics(self._gather_records(records))
        metrics.update(grad_norm=grad_norm, lr=lr, num_micro_batches=num_micro_batches, skipped_step=float(skipped))
        if self.device.type == "cuda":
            metrics["peak_memory_gib"] = self._peak_memory_gib()
        return metrics

    def _peak_memory_gib(self) -> float:
        """The most GPU memory this process's tensors held since the last call, largest over ranks."""
        peak = torch.tensor([torch.cuda.max_memory_allocated(self.device) / 2**30], dtype=torch.float64)
        torch.cuda.reset_peak_memory_stats(self.device)
        return float(self._all_reduce(peak, dist.ReduceOp.MAX).item())

    def _skip_step(self, grad_norm: float, data: DataProto, mask_keys: list[str]) -> None:
        self.skipped_in_a_row += 1
        limit, finding = self.config.max_consecutive_skipped_steps, describe_non_finite(data, mask_keys)
        if limit is not None and self.skipped_in_a_row >= limit:
            raise NonFiniteStepsError(grad_norm, self.skipped_in_a_row, self.rank, finding)
        logger.warning(skipped_step_message(grad_norm, self.skipped_in_a_row, self.rank, finding))

    def _clip_grad_norm(self) -> float:
        return clip_grad_norm(self.model, self.config.max_grad_norm, self.expert_parallel)

    # -- inference ----------------------------------------------------------------------------

    def compute_log_probs(self, data: DataProto, with_entropy: bool = False) -> DataProto:
        """Token-aligned 'log_probs' (and 'entropy') of every row, micro-batched as in training."""
        return self._forward_only(data, with_entropy)

    def compute_values(self, data: DataProto) -> DataProto:
        """Token-aligned 'values' of every row (critic)."""
        return self._forward_only(data, with_entropy=False)

    @torch.no_grad()
    def _forward_only(self, data: DataProto, with_entropy: bool) -> DataProto:
        self.model.eval()
        groups = micro_batch_groups(data, self.config)
        num_micro_batches = self._same_count_on_all_ranks(len(groups))
        forward = forward_only_forward(data, self.config)  # router replay
        outputs, order = [], []
        for index in range(num_micro_batches):
            group = groups[index] if index < len(groups) else []
            if not group:
                forward_placeholder(self.model, self.device)
                continue
            micro_batch = select_micro_batch(data, group, self.config).to(self.device)
            output = forward(self.model, micro_batch, self.config, with_entropy, self.sequence_parallel)
            width = data["input_ids"].shape[1]  # back to the batch's width: zeros on padding, as untrimmed
            outputs.append(DataProto({name: pad_columns(value.cpu(), width) for name, value in output.items()}))
            order.extend(group)
        if not outputs:
            return DataProto()
        return undo_permutation(DataProto.concat(outputs), order)

    def save_checkpoint(self, folder) -> None:
        """Model and optimizer shards (DCP), LR schedule: a collective (roll_lite/strategy/checkpoint.py)."""
        from roll_lite.strategy.checkpoint import save_sharded

        save_sharded(self, Path(folder))

    def load_checkpoint(self, folder) -> None:
        """Load what save_checkpoint wrote, from any number of ranks (DCP reshards)."""
        from roll_lite.strategy.checkpoint import load_sharded

        load_sharded(self, Path(folder))

    def full_state_dict(self, trainable_only: bool = False) -> dict[str, torch.Tensor]:
        """The full (unsharded) HF state dict on CPU, on every rank (weight sync, export); with
        `trainable_only`, only the parameters that train (LoRA: the adapters). On one rank its tensors
        may be the parameters themselves: copy what must outlive the next optimizer step."""
        if self.world_size == 1:  # each shard is the whole tensor: no gather (16 ms -> 2 ms for 1 M params on CPU)
            state = {name: value.cpu() for name, value in self.own_parameters().items()}
            if not trainable_only:
                return state
            trainable = (name.removeprefix("lm.") for name, p in self.model.named_parameters() if p.requires_grad)
            return {name: state[name] for name in trainable}
        # cpu_offload=True would leave the dict empty on ranks other than 0
        options = StateDictOptions(full_state_dict=True, ignore_frozen_params=trainable_only)
        state = get_model_state_dict(self.model, options=options)
        state = {name.removeprefix("lm."): value.detach().cpu() for name, value in state.items()}
        if self.expert_parallel is not None:
            whole_experts(state, self.model, self.expert_parallel, self.device)
        return state

    def own_parameters(self) -> dict[str, torch.Tensor]:
        """One rank only: the HF-named parameters (and buffers) themselves, detached, no copy. Their
        values change with every optimizer step (rollout.in_actor generates with them)."""
        if self.world_size != 1:
            raise RuntimeError(
                f"own_parameters: every rank holds a shard ({self.world_size} ranks); use full_state_dict"
            )
        return {
            name.removeprefix("lm."): (value.to_local() if isinstance(value, DTensor) else value).detach()
            for name, value in self.model.state_dict().items()
        }

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load a full HF state dict (e.g. the actor's, into the reference or the critic's backbone)."""
        prefixed = {f"lm.{name}": value for name, value in state.items()}
        options = StateDictOptions(full_state_dict=True, strict=False)
        result = set_model_state_dict(self.model, prefixed, options=options)
        missing = [key for key in result.missing_keys if not key.startswith(("value_head.", "score."))]
        if missing or result.unexpected_keys:
            raise KeyError(f"load_full_state_dict: missing {missing}, unexpected {result.unexpected_keys}")
