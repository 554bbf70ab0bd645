"""MoE policies in a training step: the step's global expert counts, and each micro-batch's router logits.

A caller that trains with the MoE auxiliary losses (roll_lite/loss/aux.py) sets data.meta_info["moe_aux_losses"].
The strategy then, before the first backward of the step:
  1. runs a no-grad counting forward over this rank's micro-batches and counts, per MoE layer, the token-slots
     routed to each expert among the real tokens (attention_mask: prompt and response; never padding);
  2. all-reduces the counts and the token count over the data-parallel ranks, and injects them into every
     micro-batch's meta_info as `moe_expert_counts` ([layers, E], float64) and `moe_num_tokens`, the way it
     injects `batch_num_tokens`.
The weights do not change until the optimizer step, and routing is a deterministic function of the weights and
the token's context, so the counting forward routes every token as the training forward will: the counts are
exactly the step's. (It costs one no-grad forward per step; the old-log-prob pass at the same weights, or the
recorded routing under router replay, could supply them instead.)
The training forward then hands loss_func `router_logits`, [rows, seq, layers, E]: each token's own router logits
(not shifted like the next-token values), zero on padding. The actor's worker sets the request and wraps its
loss_func with roll_lite.loss.aux.moe_aux_loss_func when actor.moe_aux_loss_coef / moe_z_loss_coef are above 0.

Router replay (config.router_replay, the actor's): a batch with `routed_experts` [rows, seq, layers, k] (the rollout
engine's choice per token and MoE layer, -1 where it recorded none) is replayed in every forward of the strategy
(rollout: the counting, training and log-prob forwards route its tokens to those experts) or only compared with the
trainer's routing (compare). Under router_replay=old (R2) the column is the trainer's own: the old-log-prob pass of a
batch without one records it (recording_forward), and the step's training forwards replay it. Either way the forward also returns, per token, how many of its layers' recorded
routings the experts used / the router's own choice differ from (roll_lite.model.moe.routing_drift); a training
step reports their sums as `moe_routing/<name>@sum` metrics (the pipeline turns them into moe/routing_drift...).
"""

from __future__ import annotations

from typing import Callable

import torch

from roll_lite.data import DataProto
from roll_lite.model.moe import DRIFT_RAW, drift_sums, expert_counts, moe_routers, routing, routing_drift
from roll_lite.model.packing import row_lengths
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.micro_batches import LossFunc, call_loss_func, forward_micro_batch, forward_placeholder

REQUEST = "moe_aux_losses"
RECORDED = "routed_experts"  # the batch column of the engine's routing (or, router_replay=old, the trainer's own)
REPLAYED = ("rollout", "old")  # the router_replay values whose forwards use the recorded experts


def wants_expert_counts(data: DataProto) -> bool:
    return bool(data.meta_info.get(REQUEST))


def replays(data: DataProto, config: StrategyConfig) -> bool:
    """Whether the batch's forwards use (or compare with) the recorded routing: config.router_replay, and a batch
    that has it (an RL rollout's; an SFT warm start's rows route on their own)."""
    return config.router_replay is not None and RECORDED in data.batch


def records_own_routing(data: DataProto, config: StrategyConfig) -> bool:
    """router_replay=old (R2) and a batch without a recorded routing: its forward-only pass (the old log-probs)
    records the experts the trainer's routers choose, as the `routed_experts` column (recording_forward)."""
    return config.router_replay == "old" and RECORDED not in data.batch


def recording_forward(
    model, micro_batch: DataProto, config: StrategyConfig, with_entropy: bool, sequence_parallel=None
):
    """forward_micro_batch's outputs plus `routed_experts` [rows, seq, layers, k] (int16): the experts each real
    token was routed to (0 on padding; the caller masks it)."""
    if sequence_parallel is not None:
        raise NotImplementedError("router replay does not run under sequence parallelism yet")
    with routing(model, keep_logits=False) as record:
        output = forward_micro_batch(model, micro_batch, config, with_entropy)
    experts = torch.stack(record.experts)  # [layers, N, k]
    output[RECORDED] = token_layout(experts, micro_batch["attention_mask"], config.use_packing).to(torch.int16)
    return output


def forward_only_forward(data: DataProto, config: StrategyConfig) -> Callable:
    """The forward of a no-grad pass (log-probs, values): replaying or comparing a recorded routing, recording the
    trainer's own (router_replay=old), or the plain one."""
    if replays(data, config):
        return moe_forward
    return recording_forward if records_own_routing(data, config) else forward_micro_batch


def uses_moe_forward(data: DataProto, config: StrategyConfig) -> bool:
    return wants_expert_counts(data) or replays(data, config)


def _packed_like_tokens(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[rows, seq, ...] -> [1, total, ...]: each row's tokens back to back, as pack_rows lays out input_ids."""
    return torch.cat([values[i, :length] for i, length in enumerate(row_lengths(attention_mask))])[None]


def _routing_of(model, micro_batch: DataProto, config: StrategyConfig, keep_logits: bool):
    """roll_lite.model.moe.routing around one micro-batch's forward, replaying its recorded experts under
    router_replay=rollout or old (laid out as the forward lays out input_ids: padded, or packed)."""
    forced = None
    if config.router_replay in REPLAYED and RECORDED in micro_batch.batch:
        forced = micro_batch[RECORDED]
        if config.use_packing:
            forced = _packed_like_tokens(forced, micro_batch["attention_mask"])
    return routing(model, replay=forced, keep_logits=keep_logits)


def token_layout(values: torch.Tensor, attention_mask: torch.Tensor, packed: bool) -> torch.Tensor:
    """Per-layer router values [layers, N, X] of one forward (N its tokens, as the router flattens them: rows × seq,
    or a packed row's total) -> [rows, seq, layers, X], zero on padding."""
    rows, seq = attention_mask.shape
    if packed:
        lengths = torch.tensor(row_lengths(attention_mask), device=values.device)
        starts = torch.cumsum(lengths, 0) - lengths
        source = (starts[:, None] + torch.arange(seq, device=values.device)[None]).clamp(max=values.shape[1] - 1)
        laid_out = values[:, source].permute(1, 2, 0, 3)
    else:
        laid_out = values.reshape(values.shape[0], rows, seq, -1).permute(1, 2, 0, 3)
    keep = attention_mask.bool().to(values.device)[..., None, None]
    return torch.where(keep, laid_out, torch.zeros((), dtype=values.dtype, device=values.device))


def moe_forward(model, micro_batch: DataProto, config: StrategyConfig, with_entropy: bool, sequence_parallel=None):
    """forward_micro_batch's outputs, with router replay (module docstring); plus `router_logits` [rows, seq,
    layers, E] in a step with the auxiliary losses (its meta_info holds the injected counts), and the routing
    drift columns (roll_lite.model.moe.routing_drift) for a batch with recorded routing."""
    if sequence_parallel is not None:
        raise NotImplementedError(
            "the MoE auxiliary losses and router replay do not run under sequence parallelism yet"
        )
    keep_logits = "moe_expert_counts" in micro_batch.meta_info
    mask, packed = micro_batch["attention_mask"], config.use_packing
    with _routing_of(model, micro_batch, config, keep_logits) as record:
        output = forward_micro_batch(model, micro_batch, config, with_entropy)
    if keep_logits:
        output["router_logits"] = token_layout(record.router_logits(), mask, packed)
    if replays(micro_batch, config):
        used, own = (token_layout(torch.stack(experts), mask, packed) for experts in (record.experts, record.own))
        output.update(routing_drift(used, own, micro_batch[RECORDED], mask))
    return output


def with_drift_sums(loss_func: LossFunc) -> LossFunc:
    """loss_func (checked: call_loss_func), its metrics plus the drift sums of a batch with recorded routing."""

    def with_moe(batch: DataProto, output: dict) -> tuple[torch.Tensor, dict]:
        loss, metrics = call_loss_func(loss_func, batch, output)
        if "routing_known" in output:
            sums = drift_sums(output, batch["attention_mask"])
            metrics = {**metrics, **{f"{DRIFT_RAW}{name}@sum": value for name, value in sums.items()}}
        return loss, metrics

    return with_moe


def moe_step_setup(
    model,
    data: DataProto,
    micro_batches: list[DataProto | None],
    config: StrategyConfig,
    device: torch.device,
    all_reduce: Callable[[torch.Tensor], torch.Tensor],
    loss_func: LossFunc,
) -> tuple[dict, Callable, LossFunc]:
    """(meta_info to inject, the forward, the loss_func) of a training step that uses_moe_forward."""
    meta = {}
    if wants_expert_counts(data):
        meta = global_expert_meta(model, micro_batches, config, device, all_reduce)
    return meta, moe_forward, with_drift_sums(loss_func)


@torch.no_grad()
def global_expert_meta(
    model,
    micro_batches: list[DataProto | None],
    config: StrategyConfig,
    device: torch.device,
    all_reduce: Callable[[torch.Tensor], torch.Tensor],
) -> dict:
    """The counting forward (module docstring): {'moe_expert_counts', 'moe_num_tokens'} over the whole step.
    `micro_batches` is this rank's list padded to the ranks' common count (None: a placeholder pass, so that all
    ranks make the same FSDP2 collective calls); `all_reduce` sums over the data-parallel ranks."""
    routers = moe_routers(model)
    if not routers:
        raise ValueError(f"meta_info['{REQUEST}'] is set but the model has no MoE router")
    counts = torch.zeros(len(routers), routers[0].num_experts, dtype=torch.float64)
    tokens = torch.zeros(1, dtype=torch.float64)
    for micro_batch in micro_batches:
        if micro_batch is None or len(micro_batch) == 0:
            forward_placeholder(model, device)
            continue
        micro_batch = micro_batch.to(device)
        with _routing_of(model, micro_batch, config, keep_logits=False) as record:
            forward_micro_batch(model, micro_batch, config, with_entropy=False)
        mask = micro_batch["attention_mask"]
        experts = token_layout(torch.stack(record.experts), mask, config.use_packing)
        counts += expert_counts(experts, mask, counts.shape[1]).cpu()
        tokens += mask.bool().sum().cpu()
    total = all_reduce(torch.cat([counts.reshape(-1), tokens]))
    return {"moe_expert_counts": total[:-1].reshape(counts.shape), "moe_num_tokens": total[-1].clone()}
