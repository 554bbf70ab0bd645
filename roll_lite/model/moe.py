"""Mixture-of-experts routing as data: capture each token's router logits and experts, and replay recorded experts.

transformers 5.19's Qwen3-MoE, Qwen2-MoE and Mixtral blocks share one router contract: `block.gate(hidden)` takes
the block's tokens flattened to [rows * seq, hidden] and returns (router logits [N, E], routing weights [N, k],
expert indices [N, k]); `block.experts(hidden, indices, weights)` then runs the chosen experts. A forward hook on
the router reads that triple (capture) or rewrites it (replay), so no model code is patched.

Replay forces the indices and recomputes the weights from the *current* router logits over the forced experts
(the router's own softmax → gather → renormalise), so gradients still reach the router. Replaying the routing a
forward chose gives bit-identical outputs. The routers take their softmax in float32 even in a float64 model, so
routing weights carry float32 rounding there (deterministic; the aux losses in roll_lite/loss/aux.py take their
probabilities from the float64 logits instead).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

# the MoE architectures a model is built from config as, and their keys of the `model` section (docs/moe.md)
MOE_MODEL_TYPES = ("qwen3_moe", "qwen2_moe")
MOE_MODEL_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")


def moe_blocks(model: nn.Module) -> list[nn.Module]:
    """A model's sparse MoE blocks (a router `.gate` and `.experts`), in layer order (empty for a dense model)."""
    return [
        module
        for module in model.modules()
        if hasattr(module, "experts") and hasattr(getattr(module, "gate", None), "top_k")
    ]


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The routers of a model's sparse MoE blocks, in layer order (empty for a dense model)."""
    return [block.gate for block in moe_blocks(model)]


def is_moe(model: nn.Module) -> bool:
    return bool(moe_routers(model))


@dataclass
class Routing:
    """What one forward's routers did: per MoE layer, logits [N, E] (in the graph) and the experts used [N, k];
    `own`: the experts each router chose itself (under replay, before the recorded ones replaced them)."""

    logits: list[torch.Tensor] = field(default_factory=list)
    experts: list[torch.Tensor] = field(default_factory=list)
    own: list[torch.Tensor] = field(default_factory=list)

    def expert_ids(self, token_shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        """[*token_shape, layers, k]: e.g. [rows, seq, layers, k] for input_ids of shape [rows, seq]."""
        stacked = torch.stack(self.experts, dim=1)  # [N, layers, k]
        return stacked.reshape(*token_shape, *stacked.shape[1:])

    def router_logits(self) -> torch.Tensor:
        """[layers, N, E]."""
        return torch.stack(self.logits)


def replayed_weights(router: nn.Module, logits: torch.Tensor, experts: torch.Tensor, dtype: torch.dtype):
    """The router's weights for given experts: its softmax (float32, as transformers' routers take it), gathered
    at `experts`, renormalised where the router renormalises (Qwen: norm_topk_prob; Mixtral: always)."""
    weights = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, experts)
    if getattr(router, "norm_topk_prob", True):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(dtype)


@contextmanager
def routing(model: nn.Module, replay: torch.Tensor | None = None, keep_logits: bool = True) -> Iterator[Routing]:
    """Record every MoE layer's routing during the forwards run inside the block (layer after layer, forward
    after forward: a generate call records its prefill, then each decoding step). keep_logits=False: experts only.

    `replay` [*token_shape, layers, k] (the input_ids' shape, e.g. [rows, seq] or a packed [1, total]): force
    these experts. Entries < 0 keep the router's own choice (padding, or tokens nobody recorded)."""
    routers = moe_routers(model)
    if not routers:
        raise ValueError(f"{type(model).__name__} has no MoE router (expected blocks with .gate and .experts)")
    if replay is not None and replay.shape[-2] != len(routers):
        raise ValueError(f"replay has {replay.shape[-2]} layers of experts; the model has {len(routers)} MoE layers")
    record = Routing()
    forced = None if replay is None else replay.reshape(-1, *replay.shape[-2:])

    def hook_for(layer: int, router: nn.Module):
        def hook(_module, _inputs, output):
            logits, weights, experts = output
            record.own.append(experts.detach())
            if forced is not None:
                wanted = forced[:, layer].to(experts.device)
                if wanted.shape != experts.shape:
                    raise ValueError(
                        f"replay: {tuple(wanted.shape)} experts for a layer routing {tuple(experts.shape)}"
                    )
                experts = torch.where(wanted >= 0, wanted, experts)
                weights = replayed_weights(router, logits, experts, weights.dtype)
            if keep_logits:
                record.logits.append(logits)
            record.experts.append(experts.detach())
            return logits, weights, experts

        return hook

    handles = [router.register_forward_hook(hook_for(i, router)) for i, router in enumerate(routers)]
    try:
        yield record
    finally:
        for handle in handles:
            handle.remove()


def generated_routing(
    record: Routing, layers: int, width: int, prompt_lengths: list[int], lengths: list[int]
) -> list[torch.Tensor]:
    """Per row of a left-padded `generate` call, the experts of its prompt and response tokens [tokens, layers, k].

    The prefill routes the [rows, width] prompts; decoding step j routes response token j - 1 (the token it
    reads). The last response token is never read, so a row that ran to the end gets -1 there (replay then keeps
    the trainer's own choice; that position predicts nothing the loss uses)."""
    steps = [torch.stack(record.experts[i : i + layers], dim=1) for i in range(0, len(record.experts), layers)]
    rows = len(prompt_lengths)
    prefill = steps[0].reshape(rows, width, layers, -1)
    decoded = [step.reshape(rows, 1, layers, -1) for step in steps[1:]]
    routed = torch.cat([prefill, *decoded], dim=1).cpu()
    missing = torch.full((rows, 1, *routed.shape[2:]), -1, dtype=routed.dtype)
    routed = torch.cat([routed, missing], dim=1)
    return [routed[i, width - p : width + n].clone() for i, (p, n) in enumerate(zip(prompt_lengths, lengths))]


class GenerationRouting:
    """The hf engine's recorder (HFEngine(record_experts=GenerationRouting)): wraps one generate call, then
    `rows` gives each row's experts (generated_routing)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._recording = routing(model, keep_logits=False)

    def __enter__(self) -> "GenerationRouting":
        self.record = self._recording.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._recording.__exit__(*exc)

    def rows(self, width: int, prompt_lengths: list[int], lengths: list[int]) -> list[torch.Tensor]:
        return generated_routing(self.record, len(moe_routers(self.model)), width, prompt_lengths, lengths)


def expert_counts(experts: torch.Tensor, mask: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[layers, E] token-slots routed to each expert among the tokens `mask` selects.

    experts: [*token_shape, layers, k] (Routing.expert_ids); mask: [*token_shape], bool or 0/1;
    the MoE auxiliary losses' c (roll_lite/loss/aux.py) and the strategy's counting forward (moe_stats.py)."""
    selected = experts.reshape(-1, *experts.shape[-2:])[mask.reshape(-1).bool()]  # [T, layers, k]
    one_hot = torch.nn.functional.one_hot(selected.long(), num_experts)  # [T, layers, k, E]
    return one_hot.sum(dim=(0, 2)).to(torch.float64)


DRIFT_RAW = "moe_routing/"  # drift_sums' prefix among a training step's metrics (roll_lite/strategy/moe_stats.py)


def routing_drift(used: torch.Tensor, own: torch.Tensor, recorded: torch.Tensor, mask: torch.Tensor) -> dict:
    """Per token [rows, seq], float: its layers with a recorded routing ('routing_known'), those whose experts used
    ('routing_differs') or chosen by the router itself ('routing_own_differs') are not the recorded set.

    used, own, recorded: [rows, seq, layers, k] (recorded: -1 where nothing was recorded); mask: the real tokens."""
    recorded = recorded.to(used.device).long()
    known = (recorded >= 0).all(-1) & mask.bool().to(used.device)[..., None]  # [rows, seq, layers]
    wanted = recorded.sort(-1).values

    def differs(experts: torch.Tensor) -> torch.Tensor:
        return ((experts.long().sort(-1).values != wanted).any(-1) & known).sum(-1).float()

    return {
        "routing_known": known.sum(-1).float(),
        "routing_differs": differs(used),
        "routing_own_differs": differs(own),
    }


def drift_sums(output: dict, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The raw sums of `routing_drift`'s columns over the tokens of `mask` (0-d float64): known / differs /
    own_differs count (token, layer) routings; tokens / tokens_differ count tokens with a recorded routing and those
    with a layer that used other experts. They add up over micro-batches and ranks."""
    keep = mask.bool().to(output["routing_known"].device)
    known, differs = output["routing_known"][keep], output["routing_differs"][keep]
    sums = {
        "known": known.sum(),
        "differs": differs.sum(),
        "own_differs": output["routing_own_differs"][keep].sum(),
        "tokens": (known > 0).sum(),
        "tokens_differ": (differs > 0).sum(),
    }
    return {name: value.detach().double().cpu() for name, value in sums.items()}
