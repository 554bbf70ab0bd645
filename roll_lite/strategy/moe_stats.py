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
(not shifted like the next-token values), zero on padding.
"""

from __future__ import annotations

from typing import Callable

import torch

from roll_lite.data import DataProto
from roll_lite.model.moe import moe_routers, routing
from roll_lite.model.packing import row_lengths
from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.micro_batches import forward_micro_batch, forward_placeholder

REQUEST = "moe_aux_losses"


def wants_expert_counts(data: DataProto) -> bool:
    return bool(data.meta_info.get(REQUEST))


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


def routed_forward(model, micro_batch: DataProto, config: StrategyConfig, with_entropy: bool, sequence_parallel=None):
    """forward_micro_batch's outputs plus `router_logits` [rows, seq, layers, E] (module docstring)."""
    if sequence_parallel is not None:
        raise NotImplementedError("the MoE auxiliary losses do not run under sequence parallelism yet")
    with routing(model) as record:
        output = forward_micro_batch(model, micro_batch, config, with_entropy)
    output["router_logits"] = token_layout(record.router_logits(), micro_batch["attention_mask"], config.use_packing)
    return output


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
        with routing(model, keep_logits=False) as record:
            forward_micro_batch(model, micro_batch, config, with_entropy=False)
        mask = micro_batch["attention_mask"]
        experts = token_layout(torch.stack(record.experts), mask, config.use_packing)
        selected = experts[mask.bool()]  # [tokens, layers, k]; roll_lite.loss.aux.expert_counts, kept below loss
        counts += torch.nn.functional.one_hot(selected.long(), counts.shape[1]).sum(dim=(0, 2)).cpu()
        tokens += mask.bool().sum().cpu()
    total = all_reduce(torch.cat([counts.reshape(-1), tokens]))
    return {"moe_expert_counts": total[:-1].reshape(counts.shape), "moe_num_tokens": total[-1].clone()}
