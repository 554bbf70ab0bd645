"""Ulysses sequence parallelism: the device mesh, the all-to-all on attention heads, the sharded forward.

The mesh. A role's R ranks form one DeviceMesh of shape (D, S), dims ("dp", "sp"): D = R / S data-parallel
groups of S consecutive ranks (rank = d·S + s, so a group's all-to-alls stay on one node when S divides
a node's GPUs). The S ranks of a group get the same rows; each runs the decoder on a contiguous 1/S slice
of every micro-batch's sequence dimension (a packed row, or the padded columns), padded to a multiple of S.
FSDP2 shards the parameters over the mesh flattened to its R ranks ("dp_sp"), so every rank holds 1/R of
them, as at S = 1: the S ranks of a group run different tokens through the same weights, and sharding them
over D only would keep S copies of every shard and of the optimizer state for no gain (torchtitan and verl
shard over the flattened mesh for the same reason). Nothing else creates process groups.

Attention. Before attention, an all-to-all turns [rows, heads, tokens / S] into [rows, heads / S, tokens]:
each rank attends over the whole sequence with 1/S of the heads, with the whole sequence's cu_seqlens (a
packed row) or 4-D mask (a padded one); a second all-to-all turns the output back. Rotary position ids are
each slice's part of the whole sequence's (they restart per sequence of a packed row, never per slice).
Fewer key / value heads than S are repeated to S first (roll_lite/model/attention.py). On CPU the
exchange is gloo's all_to_all, which torch 2.13 implements: the tests run the real collective, not an
emulation.

The head and the loss. The LM head runs on each rank's slice: its targets are the next tokens of the whole
sequence, shifted before slicing, so a slice's last position predicts the next slice's first token; no rank
holds more than its slice's logits, one chunk at a time. The per-token outputs (log-probs, entropy, values:
[rows, tokens], not logits) are then all-gathered in the group, with an autograd function whose backward
keeps this rank's slice of the gradient (a reward model's scores, which read one position ahead, are
moved there after the gather, as a whole row: a slice's last score is the next slice's first). So loss_func sees whole sequences on every rank of the group,
exactly as at S = 1: every agg mode, per-sequence losses and a user's own loss_func need nothing new, and
the global counts (batch_num_tokens, global_valid_samples) are all-reduced over the "dp" group only: each
token is counted once, not S times.

The scale. Each of the S ranks computes the same micro-batch loss L from the gathered outputs, and its
backward sends dL/d(its slice's outputs) through its slice's graph (the all-to-alls carry each gradient
to the rank whose tokens produced it), so a rank's gradient g_{d,s} is the part of ∇L that flows through
its slice, and Σ_s g_{d,s} = ∇L_d. FSDP2 averages over all D·S ranks, so the backward of L · (D·A / A) · S
(loss_scale = D·A as at S = 1, over A, times S) gives (1/(D·S)) Σ_{d,s} D·S · g_{d,s} = Σ_d ∇L_d: the gradient of
one forward/backward over the global batch (tests/test_exactness_sp.py, float64, ≤ 1e-10). Metrics are
reported by the group's first rank only (its S ranks hold the same values).

Images. A vision-language head (roll_lite/model/vision_sp.py) is given the whole sequence's ids and its
slice: it merges its images and lays out M-RoPE over the whole sequence before slicing. Its vision tower runs
whole on every rank of the group; `whole_gradient` gives each rank's tower the group's summed feature gradient
/ S, so that the tower's gradient is counted once too (tests/test_exactness_vision.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from roll_lite.model.modeling import CausalLMWithLogProbs, CausalLMWithScoreHead

_MESHES: dict[tuple, tuple[DeviceMesh, SequenceParallel]] = {}


def sequence_parallel_mesh(device_type: str, world_size: int, degree: int) -> tuple[DeviceMesh, SequenceParallel]:
    """(the (D, S) mesh flattened, which FSDP2 shards over; this rank's exchange), built once per process
    and default group: every strategy of a process (actor, reference) shares its groups."""
    key = (device_type, world_size, degree, dist.group.WORLD)
    if key not in _MESHES:
        mesh = init_device_mesh(device_type, (world_size // degree, degree), mesh_dim_names=("dp", "sp"))
        _MESHES[key] = (mesh._flatten("dp_sp"), SequenceParallel(mesh))
    return _MESHES[key]


def _all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Rank r sends its j-th piece along scatter_dim to rank j and concatenates, along gather_dim, the
    r-th pieces of every rank in rank order."""
    pieces = [piece.contiguous() for piece in x.chunk(dist.get_world_size(group), dim=scatter_dim)]
    received = [torch.empty_like(piece) for piece in pieces]
    dist.all_to_all(received, pieces, group=group)
    return torch.cat(received, dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims  # the transpose of an all-to-all is the all-to-all back
        return _all_to_all(grad.contiguous(), ctx.group, gather_dim, scatter_dim), None, None, None


class _GatherSequence(torch.autograd.Function):
    """[rows, tokens / S, ...] slices -> [rows, tokens, ...] on every rank of the group. Every rank then
    computes the same loss from the same whole tensor, so the gradient of its own slice is its slice of
    the incoming gradient: nothing to sum."""

    @staticmethod
    def forward(ctx, x, group, rank):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.rank, ctx.width = rank, x.shape[1]
        ctx.set_materialize_grads(False)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None, None
        return grad.narrow(1, ctx.rank * ctx.width, ctx.width).contiguous(), None, None


class _WholeGradient(torch.autograd.Function):
    """Identity forward on the S ranks of a group; backward: the group's sum of the incoming gradients, over
    `share` (S: each rank's part of it). For a module every rank of the group runs on the whole micro-batch's
    inputs (a vision-language model's tower, roll_lite/model/vision_sp.py), each rank's output gradient is
    nonzero at its own slice's rows only: the sum adds exact zeros and gives every rank the whole gradient,
    which its module then back-propagates as one unsplit backward would, so its S ranks' gradients sum to
    the micro-batch's once."""

    @staticmethod
    def forward(ctx, x, group, share):
        ctx.group, ctx.share = group, share
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad / ctx.share, None, None


def full_sequence_mask(valid: torch.Tensor) -> torch.Tensor:
    """[rows, 1, tokens, tokens] bool: causal over the row's valid tokens (right-padded `valid` [rows,
    tokens]); each position also attends to itself, so a padding query is never left with no key (sdpa
    would return nan there, which nothing reads but a backward could still carry)."""
    tokens = valid.shape[1]
    causal = torch.ones(tokens, tokens, dtype=torch.bool, device=valid.device).tril()
    itself = torch.eye(tokens, dtype=torch.bool, device=valid.device)
    return ((causal[None] & valid[:, None, :]) | itself)[:, None]


class SequenceParallel:
    """This rank's place in the (D, S) mesh, the Ulysses exchange the attention calls (`degree`,
    `all_to_all`) and the sharded forward (`run`)."""

    def __init__(self, mesh: DeviceMesh):
        self.group, self.dp_group = mesh["sp"].get_group(), mesh["dp"].get_group()
        self.degree, self.rank = mesh["sp"].size(), mesh["sp"].get_local_rank()
        self.dp_size, self.dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()

    def all_to_all(self, x: torch.Tensor, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        return _AllToAll.apply(x, self.group, scatter_dim, gather_dim)

    def gather_sequence(self, x: torch.Tensor) -> torch.Tensor:
        return _GatherSequence.apply(x, self.group, self.rank)

    def sequence_mask(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The whole sequence's [rows, 1, tokens, tokens] mask of a padded batch (full_sequence_mask)."""
        return full_sequence_mask(attention_mask.bool())

    def whole_gradient(self, x: torch.Tensor) -> torch.Tensor:
        """x as is; its backward gets the group's whole gradient / S (_WholeGradient)."""
        return _WholeGradient.apply(x, self.group, self.degree) if x.requires_grad else x

    def run(
        self,
        model,
        input_ids,
        position_ids,
        attention_mask=None,
        cu_seqlens=None,
        max_seqlen=None,
        gather_ids=None,
        **head_options,
    ) -> dict[str, torch.Tensor]:
        """What model(input_ids, position_ids, ...) returns (next-token aligned [rows, tokens] outputs),
        computed on this rank's slice of the tokens and gathered. Called by forward_micro_batch."""
        length = input_ids.shape[1]
        pad = -length % self.degree
        input_ids = F.pad(input_ids, (0, pad))
        targets = torch.roll(input_ids, shifts=-1, dims=1)  # the whole sequence's next tokens
        if cu_seqlens is not None:  # packed: the padding is one more sequence, attending to itself
            position_ids = torch.cat([position_ids, torch.arange(pad, device=position_ids.device)[None]], dim=1)
            if pad:
                cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_tensor([length + pad])])
                max_seqlen = max(int(max_seqlen), pad)
            attention = dict(cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        else:  # padded: the mask of the whole sequence; a dict is used by transformers' decoders as is
            position_ids = F.pad(position_ids, (0, pad))
            valid = F.pad(attention_mask, (0, pad)).bool()
            attention = dict(attention_mask={"full_attention": full_sequence_mask(valid)})
        width = input_ids.shape[1] // self.degree
        mine = slice(self.rank * width, (self.rank + 1) * width)
        if gather_ids is not None:
            head_options["gather_ids"] = F.pad(gather_ids, (0, 0, 0, pad))[:, mine]
        if isinstance(model, CausalLMWithLogProbs):
            head_options["targets"] = targets[:, mine]
        if getattr(model, "slices_whole_sequence", False):  # a vision head: merges its images whole, then slices
            if cu_seqlens is None:
                attention = dict(attention_mask=F.pad(attention_mask, (0, pad)))
            outputs = model(
                input_ids, position_ids, **attention, sequence_parallel=self, sequence_slice=mine, **head_options
            )
        else:
            outputs = model(
                input_ids[:, mine], position_ids[:, mine], **attention, sequence_parallel=self, **head_options
            )
        whole = {name: self.gather_sequence(values) for name, values in outputs.items()}
        if isinstance(model, CausalLMWithScoreHead):  # one position ahead, as its forward does at S = 1
            whole = {name: torch.roll(values, shifts=-1, dims=1) for name, values in whole.items()}
        return {name: values[:, :length] for name, values in whole.items()}

    def check_same_rows(self, mask_sums: torch.Tensor, rows: int, device: torch.device) -> None:
        """The S ranks of a group must hold the same rows: compare their counts (cheap, and a wrong split
        would otherwise hang in an all-to-all of unequal sizes or train on mismatched slices)."""
        mine = torch.cat([mask_sums.flatten(), torch.tensor([float(rows)], dtype=torch.float64)]).to(device)
        parts = [torch.empty_like(mine) for _ in range(self.degree)]
        dist.all_gather(parts, mine, group=self.group)
        if any(not torch.equal(part, mine) for part in parts):
            raise ValueError(
                "sequence_parallel: the ranks of a data-parallel group were given different rows; each group "
                f"of {self.degree} consecutive ranks must get the same share (its data-parallel rank: rank // S)"
            )
