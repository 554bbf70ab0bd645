"""Mixture-of-experts keys (docs/moe.md): the `model` section's MoE architecture keys, actor.router_replay and the
auxiliary-loss coefficients. A pretrained model's architecture is checked by pipelines/preflight.py, which reads its
config.json."""

from __future__ import annotations

from roll_lite.config.key_checks import check
from roll_lite.config.schema import RunConfig
from roll_lite.model.moe import MOE_MODEL_TYPES

AUX_KEYS = ("moe_aux_loss_coef", "moe_z_loss_coef")


def builds_moe(config: RunConfig) -> bool:
    """Whether the model is built from the `model` keys as an MoE architecture."""
    return config.model.pretrained_path is None and config.model.model_type in MOE_MODEL_TYPES


def moe_key(config: RunConfig) -> str | None:
    """The first actor key that asks for something only an MoE policy has (router_replay, then the auxiliary
    losses' coefficients), without its `actor.`; None: none does."""
    if config.actor.router_replay is not None:
        return "router_replay"
    return next((key for key in AUX_KEYS if getattr(config.actor, key) > 0), None)


def validate_moe(config: RunConfig) -> None:
    model = config.model
    if builds_moe(config):
        check(model.num_experts >= 2, "model.num_experts", f"an MoE layer needs >= 2 experts, got {model.num_experts}")
        check(
            1 <= model.num_experts_per_tok <= model.num_experts,
            "model.num_experts_per_tok",
            f"must be between 1 and model.num_experts={model.num_experts}, got {model.num_experts_per_tok}",
        )
        check(model.moe_intermediate_size >= 1, "model.moe_intermediate_size", "must be >= 1")
    for key in AUX_KEYS:  # the critic trains values: its loss has no auxiliary terms
        check(getattr(config.critic, key) == 0, f"critic.{key}", "the MoE auxiliary losses are the actor's; use 0")
    check(config.critic.router_replay is None, "critic.router_replay", "only the actor replays routing; use null")
    asking = moe_key(config)
    if config.model.pretrained_path is None and asking is not None:
        check(
            builds_moe(config),
            f"actor.{asking}",
            f"model.model_type={model.model_type} is a dense architecture; build one of {', '.join(MOE_MODEL_TYPES)} "
            "or load a pretrained MoE (model.pretrained_path)",
        )
    replay = config.actor.router_replay
    if replay is None:
        return
    key = "actor.router_replay"
    rollout = config.rollout
    check(
        rollout.engine == "hf",
        key,
        f"{replay} needs the engine's routed experts, which only rollout.engine=hf records (vLLM 0.32 returns them "
        "only from its GPU model runner V2; docs/moe.md); set rollout.engine=hf or router_replay=null",
    )
    check(not rollout.exact, key, "rollout.exact's decoding loop does not record routing yet; set rollout.exact=false")
    check(
        not rollout.fully_async,
        key,
        "partial rollouts (rollout.fully_async) do not carry the recorded routing across weight versions yet; use "
        "lockstep rollouts (rollout.async_steps is fine) or router_replay=null",
    )
    check(
        config.environment.name is None,
        key,
        "multi-turn trajectories (environment.name) do not carry the recorded routing yet; use null",
    )
