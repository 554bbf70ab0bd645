"""MoE auxiliary losses as pure functions of one micro-batch's router logits and the step's global expert counts.

Load balancing (Switch Transformer, Fedus et al. 2021, eq. 4: loss = N · Σ_e f_e · P_e), with f_e taken over the
global batch as in Qwen's global-batch load balancing (Qiu et al. 2025, "Demons in the Detail"):

    loss = (E / L) · Σ_l Σ_e f_le · P_le
    f_le = c_le / (k · T)        c_le: token-slots routed to expert e in layer l over the whole step (D × A)
    P_le = (1 / T) · Σ_t p_tle    p_tle = softmax(router logits of token t in layer l)_e

T is the step's number of counted tokens, E the experts, k the experts per token, L the MoE layers. With top-k
routing f sums to 1 over e, so a perfectly balanced router scores 1. The counts are not differentiable (as in
Switch); the gradient flows through P. Router z-loss (ST-MoE, Zoph et al. 2022, eq. 5), averaged over layers:

    z = (1 / L) · (1 / T) · Σ_l Σ_t logsumexp_e(router logits_tl)²

Both are sums over tokens divided by global constants (c, T), so a micro-batch's value — its own tokens' sum over
the injected global c and T — adds up over micro-batches and data-parallel ranks to the global batch's value, and so
do the gradients. Which tokens count is the caller's `mask` (roll_lite counts every non-pad token: prompt and
response, since the experts process both; padding never counts).

In training (moe_aux_loss_func) c and T come from the strategy: a caller that sets meta_info["moe_aux_losses"]
gets `moe_expert_counts` and `moe_num_tokens` injected into every micro-batch, from a no-grad counting forward
at the step's weights, summed over all micro-batches and data-parallel ranks (roll_lite/strategy/moe_stats.py),
and the model output's `router_logits` [rows, seq, layers, E].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from roll_lite.data.proto import DataProto
    from roll_lite.strategy.micro_batches import LossFunc


def load_balancing_loss(
    router_logits: torch.Tensor, mask: torch.Tensor, global_counts: torch.Tensor, global_tokens: float
) -> torch.Tensor:
    """This micro-batch's share of the global load-balancing loss (module docstring).

    router_logits: [layers, N, E] (moe.Routing.router_logits), N the micro-batch's tokens flattened as the
    router flattens input_ids; mask: input_ids-shaped, N elements; global_counts: [layers, E] over the step;
    global_tokens: T, the step's counted tokens."""
    layers, _, num_experts = router_logits.shape
    if global_tokens <= 0:
        return router_logits.sum() * 0.0
    top_k = global_counts[0].sum() / global_tokens
    fractions = global_counts.to(router_logits.dtype) / (top_k * global_tokens)  # [layers, E]
    weights = mask.reshape(1, -1, 1).to(router_logits.dtype)
    probs = torch.softmax(router_logits, dim=-1)
    prob_sums = (probs * weights).sum(dim=1) / global_tokens  # [layers, E]
    return (fractions * prob_sums).sum() * num_experts / layers


def router_z_loss(router_logits: torch.Tensor, mask: torch.Tensor, global_tokens: float) -> torch.Tensor:
    """This micro-batch's share of the global router z-loss (module docstring); arguments as load_balancing_loss."""
    layers = router_logits.shape[0]
    if global_tokens <= 0:
        return router_logits.sum() * 0.0
    squares = torch.logsumexp(router_logits, dim=-1) ** 2  # [layers, N]
    return (squares * mask.reshape(1, -1).to(router_logits.dtype)).sum() / (layers * global_tokens)


def micro_batch_aux_losses(batch: DataProto, output: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(load balancing, z-loss): this micro-batch's shares, from output['router_logits'] [rows, seq, layers, E]
    over its real tokens (attention_mask) and the injected global counts."""
    logits = output["router_logits"]
    flat = logits.permute(2, 0, 1, 3).reshape(logits.shape[2], -1, logits.shape[3])  # [layers, rows * seq, E]
    mask = batch["attention_mask"]
    counts, tokens = batch.meta_info["moe_expert_counts"], float(batch.meta_info["moe_num_tokens"])
    return load_balancing_loss(flat, mask, counts.to(flat.device), tokens), router_z_loss(flat, mask, tokens)


def moe_aux_loss_func(loss_func: LossFunc, aux_coef: float, z_coef: float) -> LossFunc:
    """`loss_func` + aux_coef · load balancing + z_coef · router z-loss (the module docstring's global forms)."""

    def with_aux_losses(
        batch: DataProto, output: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, metrics = loss_func(batch, output)
        balance, z = micro_batch_aux_losses(batch, output)
        metrics = {**metrics, "moe_load_balancing_loss@sum": balance.detach(), "moe_z_loss@sum": z.detach()}
        return loss + aux_coef * balance + z_coef * z, metrics

    return with_aux_losses
