"""Mixture-of-experts keys (docs/moe.md): the `model` section's MoE architecture keys, actor.router_replay, the
auxiliary-loss coefficients and actor.expert_parallel. A pretrained model's architecture is checked by
pipelines/preflight.py, which reads its config.json."""

from __future__ import annotations

from roll_lite.config.key_checks import check
from roll_lite.config.schema import RunConfig
from roll_lite.model.moe import MOE_MODEL_TYPES
from roll_lite.strategy.config import ENGINE_ROUTING, expert_parallel_problem

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


# measured with benchmarks/vllm_moe.py (docs/moe.md)
VLLM_CPU_MOE = (
    "vLLM 0.32's CPU build generates from an MoE policy, but its log-probs disagree with the trainer's (median "
    "|Δ log p| 1.5e-2 in float32 on a tiny Qwen3-MoE, where the dense model agrees to 5e-7; docs/moe.md); set "
    "rollout.engine=hf"
)


def vllm_cpu_moe_problem(config: RunConfig, has_experts: bool) -> str | None:
    """rollout.engine=vllm on CPU (workers.gpus_per_rank=0) with an MoE policy: refused (VLLM_CPU_MOE)."""
    if has_experts and config.rollout.engine == "vllm" and config.workers.gpus_per_rank == 0:
        return VLLM_CPU_MOE
    return None


def validate_moe(config: RunConfig) -> None:
    model = config.model
    problem = vllm_cpu_moe_problem(config, builds_moe(config))
    check(problem is None, "rollout.engine", str(problem))
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
    _validate_expert_parallel(config)
    lora = config.actor.lora
    if lora.rank and lora.target_parameters:  # whether the model has experts: pipelines/preflight.py
        check(
            config.rollout.engine == "hf",
            "actor.lora.target_parameters",
            "expert-weight adapters are served by rollout.engine=hf only (vLLM's MoE LoRA is unverified here); "
            "set rollout.engine=hf or target_parameters=null",
        )
    asking = moe_key(config)
    if config.model.pretrained_path is None and asking is not None:
        check(
            builds_moe(config),
            f"actor.{asking}",
            f"model.model_type={model.model_type} is a dense architecture; build one of {', '.join(MOE_MODEL_TYPES)} "
            "or load a pretrained MoE (model.pretrained_path)",
        )
    replay = config.actor.router_replay
    if replay not in ENGINE_ROUTING:  # null, or old (R2): the trainer records its own routing, any engine
        return
    key = "actor.router_replay"
    rollout = config.rollout
    check(
        rollout.engine == "hf",
        key,
        f"{replay} needs the engine's routed experts, which only rollout.engine=hf records (vLLM 0.32 returns them "
        "only from its GPU model runner V2; docs/moe.md); set rollout.engine=hf, or router_replay=old (R2: the "
        "trainer's own routing of the old log-probs, replayed in training) or null",
    )
    check(not rollout.exact, key, "rollout.exact's decoding loop does not record routing yet; set rollout.exact=false")


def _validate_expert_parallel(config: RunConfig) -> None:
    """actor.expert_parallel (StrategyConfig.validate has checked it is >= 1 and not with sequence_parallel or
    LoRA): an MoE policy, a degree that divides the actor's ranks and (a model built from the `model` keys) its
    experts, and not with what is unverified at EP > 1 yet. The reference and the teachers run at 1."""
    check(config.critic.expert_parallel == 1, "critic.expert_parallel", "only the actor's experts are split; use 1")
    degree, model = config.actor.expert_parallel, config.model
    if degree == 1:
        return
    key = "actor.expert_parallel"
    if model.pretrained_path is None:
        check(
            builds_moe(config),
            key,
            f"{degree} needs an MoE policy; model.model_type={model.model_type} is a dense architecture (build one of "
            f"{', '.join(MOE_MODEL_TYPES)}, or load a pretrained MoE)",
        )
    experts = model.num_experts if builds_moe(config) else None  # a pretrained model's: pipelines/preflight.py
    problem = expert_parallel_problem(degree, config.workers.actor_dp, experts)
    check(problem is None, key, str(problem).replace("the role's", "workers.actor_dp:"))
    unverified = (
        (config.rollout.exact, "the exact rollout mode (bit for bit unverified with split experts)", "rollout.exact"),
        (
            model.gradient_checkpointing,
            "gradient checkpointing (its recomputed all-to-alls untested)",
            "model.gradient_checkpointing",
        ),
    )
    for used, what, other in unverified:
        check(not used, key, f"{degree} with {what} is not supported yet; set {other}=false or {key}=1")
