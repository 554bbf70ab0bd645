"""The optimizer step's helpers: the LR schedule's factor, and the global gradient norm (and clipping) over the
strategy's meshes."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from roll_lite.strategy.config import StrategyConfig
from roll_lite.strategy.expert_parallel import ExpertParallel, expert_parameters


def lr_lambda(config: StrategyConfig):
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.lr_schedule == "cosine":
            progress = min(1.0, (step - config.warmup_steps) / max(1, config.total_steps - config.warmup_steps))
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor


def _norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of `grads` whole over their mesh (a collective for DTensor shards)."""
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def clip_grad_norm(model: nn.Module, max_norm: float | None, expert_parallel: ExpertParallel | None = None) -> float:
    """The global gradient norm of the step (clipped to `max_norm` when finite). Under expert parallelism
    (roll_lite/strategy/expert_parallel.py) the expert parameters are this rank's experts, on a mesh of their own:
    their squared norm is summed over the EP group (each of its ranks holds other experts) and added to the other
    parameters' squared norm."""
    experts = expert_parameters(model) if expert_parallel is not None else []
    own = {id(param) for param in experts}
    params = [p for p in model.parameters() if p.grad is not None and id(p) not in own]
    expert_params = [p for p in experts if p.grad is not None]
    total_norm = _norm([p.grad for p in params])
    if expert_parallel is not None and expert_params:
        expert_square = _norm([p.grad for p in expert_params]) ** 2
        dist.all_reduce(expert_square, group=expert_parallel.group)
        total_norm = (total_norm**2 + expert_square).sqrt()
    if max_norm is not None and math.isfinite(total_norm.item()):
        for group in (params, expert_params):
            if group:
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total_norm)
    return float(total_norm.item())
