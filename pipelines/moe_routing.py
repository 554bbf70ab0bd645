"""The routing drift of an RL step with an MoE policy (actor.router_replay, docs/moe.md), logged as moe/...

The engine records each token's experts per MoE layer; the actor's forwards compare them with the experts they used
and with those the routers chose themselves (roll_lite.model.moe.routing_drift), where the trainer's weights are the
engine's: at the old-log-prob forward when the step has one (its output's columns, summed here over the batch), else
at the training forward (on-policy: the same weights; its loss reports the sums, taken out of the actor's metrics).
Under actor.router_replay=old (R2) the routing is the trainer's own, recorded at the old-log-prob forward
(take_own_routing); the training forwards' drift then says how far the updates of the step moved the routers.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from roll_lite.model.moe import DRIFT_RAW, drift_sums
from roll_lite.strategy.config import ENGINE_ROUTING

if TYPE_CHECKING:
    from roll_lite.config import RunConfig
    from roll_lite.data import DataProto


def check_recorded(batch: DataProto, config: RunConfig) -> None:
    """A batch to replay must hold the engine's routing: never a silent fall-back to the trainer's own."""
    if config.actor.router_replay in ENGINE_ROUTING and "routed_experts" not in batch.batch:
        raise RuntimeError(
            f"actor.router_replay={config.actor.router_replay}: the rollout engine returned no routed experts "
            "(an MoE policy on rollout.engine=hf records them)"
        )


def take_own_routing(batch: DataProto, old: DataProto) -> None:
    """actor.router_replay=old (R2): the experts the old-log-prob forward routed each token to become the batch's
    `routed_experts` (-1 on padding), which the step's training forwards replay."""
    if "routed_experts" in old.batch and "routed_experts" not in batch.batch:
        real = batch["attention_mask"].bool()[..., None, None]
        batch.batch["routed_experts"] = torch.where(real, old["routed_experts"], -1).to(torch.int16)


def old_log_prob_sums(output: DataProto, batch: DataProto) -> dict[str, torch.Tensor] | None:
    """The drift sums of an old-log-prob forward's output over the batch's real tokens (None: no recorded routing)."""
    if "routing_known" not in output.batch:
        return None
    return drift_sums(output.batch, batch["attention_mask"])


def routing_metrics(driver_sums: dict[str, torch.Tensor] | None, actor_metrics: dict[str, float]) -> dict[str, float]:
    """moe/routing_drift: the share of recorded (token, layer) routings whose experts the trainer used are not the
    engine's (0 under replay); moe/own_routing_drift: the share its routers would have chosen otherwise (what replay
    overrides); moe/routing_drift_tokens: the share of tokens with such a layer; moe/routed_tokens: tokens with a
    recorded routing. The training step's sums are taken out of `actor_metrics` either way."""
    from_loss = {
        name.removeprefix(DRIFT_RAW): actor_metrics.pop(name)
        for name in list(actor_metrics)
        if name.startswith(DRIFT_RAW)
    }
    sums = {name: float(value) for name, value in driver_sums.items()} if driver_sums is not None else from_loss
    if not sums.get("known"):
        return {}
    return {
        "moe/routing_drift": sums["differs"] / sums["known"],
        "moe/own_routing_drift": sums["own_differs"] / sums["known"],
        "moe/routing_drift_tokens": sums["tokens_differ"] / sums["tokens"],
        "moe/routed_tokens": sums["tokens"],
    }


def num_experts(config: RunConfig) -> int:
    """The policy's experts per MoE layer: model.num_experts, or model.pretrained_path's config.json's."""
    if not config.model.pretrained_path:
        return config.model.num_experts
    return _pretrained_experts(config.model.pretrained_path, config.model.trust_remote_code)


@functools.cache
def _pretrained_experts(path: str, trust_remote_code: bool) -> int:
    from transformers import AutoConfig

    model_config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    return getattr(model_config, "num_experts", None) or model_config.num_local_experts


def expert_load_metrics(batch: DataProto, config: RunConfig) -> dict[str, float]:
    """The recorded routing's expert load (the engine's; router_replay=old: the trainer's) over the step's real tokens (prompt and response), per MoE layer l:
    moe/load/layer{l}/expert{e}, the share of that layer's routed slots (token × k) expert e took (1/E each when
    balanced), and moe/load/layer{l}/max, E times the largest share (1: balanced; E: one expert takes all)."""
    if "routed_experts" not in batch.batch:  # no routing recorded (actor.router_replay null, or old on-policy)
        return {}
    experts, experts_per_layer = batch["routed_experts"], num_experts(config)
    recorded = batch["attention_mask"].bool()[..., None] & (experts >= 0).all(-1)  # [rows, seq, layers]
    metrics = {}
    for layer in range(experts.shape[2]):
        picked = experts[:, :, layer][recorded[:, :, layer]].long()  # [tokens, k]
        if picked.numel() == 0:
            continue
        share = torch.bincount(picked.reshape(-1), minlength=experts_per_layer).double() / picked.numel()
        metrics.update({f"moe/load/layer{layer}/expert{e}": float(share[e]) for e in range(experts_per_layer)})
        metrics[f"moe/load/layer{layer}/max"] = float(share.max() * experts_per_layer)
    return metrics
