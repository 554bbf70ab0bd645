"""Expert parallelism (EP) composed with FSDP2: each rank holds num_experts / EP experts of every MoE layer.

The mesh. A role's R ranks form one DeviceMesh of shape (EP, R / EP), dims ("ep", "edp"): R / EP groups of EP
consecutive ranks (rank g·EP + e sits at (e, g), so a group's all-to-alls stay on one node when EP divides a node's
GPUs; "ep" comes first because it is the outer split of an expert tensor, below).
Every rank is still a data-parallel rank of its own (D = R): it trains on its own share of the global batch, as at
EP = 1. EP changes where the experts live, not which rows a rank sees.
- Non-expert parameters (embeddings, attention, norms, routers, shared experts, the head): FSDP2 over the mesh
  flattened to its R ranks ("ep_edp"), exactly as without EP: every rank holds 1/R of them.
- Expert parameters (each block.experts' stacked [E, ...] weights): rank g·EP + e keeps experts
  [e·E/EP, (e+1)·E/EP), and FSDP2 shards that slice (along the expert dim) over the "edp" dim: the R / EP ranks,
  one per EP group, that own the same experts. Every rank stores 1/R of the expert weights too, but an all-gather
  only ever materialises a rank's own E/EP experts. Sharding the experts over all R ranks instead would all-gather
  every expert onto every rank in each forward: no memory saved where it matters, and nothing for EP to do.
  Seen whole, an expert tensor [E, ...] is Shard(0) over "ep" then Shard(0) over "edp" on this mesh: that view
  (global_expert_view) is what sharded checkpoints write, so DCP saves one tensor and reshards it on load, to any
  EP and any number of ranks.

Dispatch and combine. In each MoE block the router (a non-expert parameter, the same on every rank) picks k experts
per token exactly as at EP = 1, so the counting forward, router replay and the aux losses see the same routing
(roll_lite/model/moe.py's hooks sit on the router). The experts module's forward is replaced: its (token, slot)
pairs are sorted by expert, hence by owning rank; one all-to-all swaps the per-expert counts, a second sends the
token states to their experts' owner (uneven splits), the owner runs its local experts with unit weights, the
reverse all-to-all brings the results home, and the token's own rank puts them back in (token, slot) order and sums
them with the routing weights (so the weights' gradient, and the router's, stays on that rank). The all-to-all's
backward is the all-to-all with the split sizes swapped (it is a permutation across ranks; its transpose is its
inverse). A rank that receives no tokens still takes part in every exchange, forward and backward, and ties its
(empty) expert output to its expert weights, so every rank makes the same collective calls and reduces a gradient.

The gradient scale. Rank r's micro-batch losses carry loss_scale = D·A (D = R), and FSDP2 averages a non-expert
gradient over the R ranks: Σ_r ∇L_r, as at EP = 1. An expert's gradient on its owner already sums the contributions
of the tokens of every rank of its EP group (the backward all-to-all brought them home to the expert), and FSDP2
then averages it over the R / EP "edp" ranks that own the same expert, which covers every rank once: that divides
by R / EP where R is needed. So the local experts' weight gradient is multiplied by 1 / EP inside the graph, with
the gradient of the tokens they read multiplied back by EP (_ScaleGrad on either side: the tokens' path into the
attention and the router stays as at EP = 1). FSDP2's set_gradient_divide_factor(R) would say the same, but torch
2.13 divides twice on a one-rank "edp" mesh (R = EP) with float64 gradients: its pre-divide and then the factor.
Gradient-norm clipping adds the squared norms of the two kinds of parameters, the experts' summed over the EP group
(roll_lite/strategy/optim.py). tests/test_exactness_ep.py checks the loss and every gradient against one
forward/backward over the global batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from roll_lite.model.moe import moe_blocks
from roll_lite.strategy.config import expert_parallel_problem


@dataclass(frozen=True)
class ExpertParallel:
    size: int  # EP
    rank: int  # this rank's place in its EP group: it owns experts [rank·E/EP, (rank+1)·E/EP)
    group: dist.ProcessGroup  # its EP group (the all-to-alls)
    expert_mesh: DeviceMesh  # the "edp" ranks that own the same experts (FSDP2 shards the experts over them)
    world_size: int  # R = D
    mesh: DeviceMesh  # the whole (EP, R / EP) mesh


_MESHES: dict[tuple, tuple[DeviceMesh, ExpertParallel]] = {}


def expert_parallel_mesh(lm: nn.Module, degree: int, device_type: str, world_size: int):
    """(the (EP, R / EP) mesh flattened, which FSDP2 shards the non-expert parameters over; this rank's
    ExpertParallel), built once per process and default group. Raises ValueError naming strategy.expert_parallel
    when `lm` is not an MoE model or the degree does not fit the ranks and the experts."""
    blocks = moe_blocks(lm)
    if not blocks:
        raise ValueError(f"strategy.expert_parallel: {degree} needs an MoE model; {type(lm).__name__} has no experts")
    problem = expert_parallel_problem(degree, world_size, blocks[0].experts.num_experts)
    if problem is not None:
        raise ValueError(f"strategy.expert_parallel: {problem}")
    key = (device_type, world_size, degree, dist.group.WORLD)
    if key not in _MESHES:
        ranks = torch.arange(world_size).view(world_size // degree, degree).T  # [e, g] = g·EP + e
        mesh = DeviceMesh(device_type, ranks, mesh_dim_names=("ep", "edp"))
        ep_rank, group = mesh.get_local_rank("ep"), mesh.get_group("ep")
        _MESHES[key] = (mesh._flatten("ep_edp"), ExpertParallel(degree, ep_rank, group, mesh["edp"], world_size, mesh))
    return _MESHES[key]


def shard_experts(model: nn.Module, ep: ExpertParallel, mp_policy: MixedPrecisionPolicy) -> None:
    """Keep this rank's experts of every MoE block, dispatch its tokens to their owners, and FSDP2-shard the
    experts over the "edp" ranks (module docstring). Call on every rank's same weights, before the decoder layers
    and the root are sharded (their fully_shard then leaves the experts' parameters to this one)."""
    for block in moe_blocks(model):
        experts = block.experts
        count = experts.num_experts // ep.size
        start = ep.rank * count
        for name, param in list(experts.named_parameters(recurse=False)):
            own = nn.Parameter(param.detach()[start : start + count].clone(), requires_grad=param.requires_grad)
            setattr(experts, name, own)
        experts.num_experts = count  # the experts module's ids are local ones from now on (0 .. count - 1)
        experts.forward = functools.partial(_dispatched_forward, experts, experts.forward, ep)
        fully_shard(experts, mesh=ep.expert_mesh, mp_policy=mp_policy)


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters EP splits (after shard_experts: this rank's experts, sharded over the "edp" ranks)."""
    return [param for block in moe_blocks(model) for param in block.experts.parameters()]


def whole_experts(state: dict[str, torch.Tensor], model: nn.Module, ep: ExpertParallel, device) -> None:
    """In a full state dict (HF names, this rank's experts whole over "edp"), replace every expert tensor by all
    E experts: the EP group's slices, all-gathered in rank order (a collective: every rank calls it)."""
    experts = {id(block.experts) for block in moe_blocks(model)}
    for module_name, module in model.named_modules():
        if id(module) not in experts:
            continue
        for param_name, _ in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}".removeprefix("lm.")
            if name not in state:  # ignore_frozen_params left it out
                continue
            local = state[name].to(device).contiguous()
            pieces = [torch.empty_like(local) for _ in range(ep.size)]
            dist.all_gather(pieces, local, group=ep.group)
            state[name] = torch.cat(pieces).cpu()


def global_expert_view(tensor: DTensor, ep: ExpertParallel) -> DTensor:
    """An expert tensor of this rank (its E / EP experts, FSDP2's Shard(0) over "edp") as its piece of the whole
    [E, ...] tensor: Shard(0) over "ep", then over "edp" (the same chunks FSDP2 cut). It shares the storage, so
    DCP's load writes into the parameter or optimizer state itself."""
    shape = torch.Size((tensor.shape[0] * ep.size, *tensor.shape[1:]))
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(
        tensor.to_local(), ep.mesh, (Shard(0), Shard(0)), run_check=False, shape=shape, stride=stride
    )


def checkpoint_view(state: dict, model: nn.Module, ep: ExpertParallel) -> dict:
    """A sharded state dict ({'model': {fqn: DTensor}, 'optimizer': {'state': {fqn: {name: DTensor}}, ...}}) with
    every expert tensor replaced by its global_expert_view; the other entries are the same objects."""
    experts = {id(param) for param in expert_parameters(model)}
    names = {name for name, param in model.named_parameters() if id(param) in experts}

    def view(value):
        return global_expert_view(value, ep) if isinstance(value, DTensor) else value

    viewed = {**state, "model": {k: view(v) if k in names else v for k, v in state["model"].items()}}
    if "optimizer" in state:
        per_param = state["optimizer"]["state"]
        per_param = {k: {n: view(t) for n, t in v.items()} if k in names else v for k, v in per_param.items()}
        viewed["optimizer"] = {**state["optimizer"], "state": per_param}
    return viewed


def _exchange(x: torch.Tensor, receive_sizes: list[int], send_sizes: list[int], group) -> torch.Tensor:
    """all_to_all_single: rows [Σ send_sizes[:j], +send_sizes[j]) go to rank j; rank j's rows for this rank
    arrive as the j-th of `receive_sizes`' blocks."""
    received = x.new_empty((sum(receive_sizes), *x.shape[1:]))
    dist.all_to_all_single(received, x.contiguous(), receive_sizes, send_sizes, group=group)
    return received


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, receive_sizes, send_sizes, group):
        ctx.sizes, ctx.group = (receive_sizes, send_sizes), group
        return _exchange(x, receive_sizes, send_sizes, group)

    @staticmethod
    def backward(ctx, grad):
        receive_sizes, send_sizes = ctx.sizes  # the gradient goes back the way the rows came
        return _exchange(grad, send_sizes, receive_sizes, ctx.group), None, None, None


def restore_slot_order(returned: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """The expert outputs, sent and returned in `order` (sorted by expert), back in (token, slot) order."""
    return returned[torch.argsort(order)]


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by `factor`."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def _local_experts(
    experts: nn.Module, local_forward, ep: ExpertParallel, tokens: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """The local experts on the tokens sent to them, unit weights. Their weights' gradient is scaled by 1 / EP and
    the tokens' is not (module docstring: the gradient scale)."""
    if tokens.shape[0] == 0:  # still in the graph: the backward exchange and the experts' reduction must run
        anchor = sum(param.sum() for param in experts.parameters(recurse=False)) * 0.0
        return tokens * 0.0 + anchor
    ones = torch.ones(tokens.shape[0], 1, dtype=tokens.dtype, device=tokens.device)
    computed = local_forward(_ScaleGrad.apply(tokens, float(ep.size)), ids[:, None], ones)
    return _ScaleGrad.apply(computed, 1.0 / ep.size)


def _dispatched_forward(
    experts: nn.Module, local_forward, ep: ExpertParallel, hidden: torch.Tensor, top_k_index, top_k_weights
) -> torch.Tensor:
    """The experts module's forward at EP > 1: hidden [N, H], top_k_index / top_k_weights [N, k] (global ids)."""
    tokens, k = top_k_index.shape
    local = experts.num_experts
    slots = top_k_index.reshape(-1)
    order = torch.argsort(slots, stable=True)
    counts = torch.bincount(slots, minlength=local * ep.size).view(ep.size, local)
    received_counts = torch.empty_like(counts)
    dist.all_to_all_single(received_counts, counts, group=ep.group)
    send_sizes, receive_sizes = counts.sum(1).tolist(), received_counts.sum(1).tolist()
    received = _AllToAll.apply(hidden[order // k], receive_sizes, send_sizes, ep.group)
    ids = torch.arange(local, device=hidden.device).repeat(ep.size).repeat_interleave(received_counts.reshape(-1))
    computed = _local_experts(experts, local_forward, ep, received, ids)
    returned = _AllToAll.apply(computed, send_sizes, receive_sizes, ep.group)
    per_slot = restore_slot_order(returned, order).view(tokens, k, -1)
    return (per_slot * top_k_weights[..., None].to(per_slot.dtype)).sum(1).to(hidden.dtype)
