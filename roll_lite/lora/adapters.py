"""LoRA adapters (peft) on the run's model: which modules get them, their tensors by name, the PEFT
folder format, merging, and the reference as the model with its adapters switched off.

The adapters are injected in place (`peft.inject_adapter_in_model`): the model stays a plain HF
causal LM whose adapted Linear layers hold `base_layer` (frozen) and `lora_A` / `lora_B` (trained),
so the strategy, the decoder-layer sharding and the chunked log-prob head see the same module tree as
without LoRA. Names here are the model's own (`model.layers.0.self_attn.q_proj.lora_A.default.weight`);
`peft_names` turns them into what `PeftModel.save_pretrained` writes.

The LM head is never adapted: the chunked log-prob head (roll_lite/model/logprobs.py) multiplies by its
weight directly, so an adapter there would be skipped in training. nn.Linear modules are, and on an MoE model the
experts' fused [experts, out, in] weights (`target_parameters`: peft's ParamWrapper, which adds B·A per expert to the
weight for the forward's duration). Two wrapped parameters of one experts module nest: the inner wrapper's tensors
are `experts.base_layer.lora_A...`, the base weights `experts.base_layer.base_layer.gate_up_proj`.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from roll_lite.errors import ConfigError
from roll_lite.lora.settings import LoraSettings
from roll_lite.lora.vision import in_scope, language_model_prefix, scoped_targets

ADAPTER = "default"  # peft's adapter name; one adapter per model
ADAPTER_TENSOR = re.compile(r"\.lora_[AB]\.")
BASE_LAYER = re.compile(r"\.base_layer(?=\.)")  # nested wrappers: one per wrapped expert weight
WEIGHTS_FILE = "adapter_model.safetensors"


def linear_module_names(lm: nn.Module) -> list[str]:
    """The short names (q_proj, down_proj, ...) of the model's Linear modules, the LM head left out; of a
    vision-language model's language model only (roll_lite/lora/vision.py)."""
    head, prefix = lm.get_output_embeddings(), language_model_prefix(lm)
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in lm.named_modules()
            if isinstance(module, nn.Linear) and module is not head and in_scope(name, prefix)
        }
    )


def target_modules(settings: LoraSettings, lm: nn.Module, key: str = "actor.lora") -> list[str]:
    """`target_modules` resolved against the model: all-linear, or names each of which must name one
    of its Linear modules (a ConfigError listing them otherwise)."""
    linear = linear_module_names(lm)
    wanted = settings.target_modules
    if wanted == "all-linear":
        return linear
    if isinstance(wanted, str):
        wanted = [wanted]
    unknown = [name for name in wanted if name not in linear]
    if not wanted or unknown:
        what = f"{unknown} match no Linear module" if unknown else "is empty"
        whose = type(lm).__name__ + ("'s language model" if language_model_prefix(lm) else "")
        raise ConfigError(
            f"{key}.target_modules: {what} of {whose}; its Linear modules (the LM head "
            f"cannot take an adapter) are {linear}, or say all-linear"
        )
    return sorted(set(wanted))


def expert_parameter_names(lm: nn.Module) -> list[str]:
    """The short names of the MoE experts' fused 3-D weights (gate_up_proj, down_proj); empty for a dense model."""
    from roll_lite.model.moe import moe_blocks

    return sorted({name for block in moe_blocks(lm) for name, p in block.experts.named_parameters() if p.ndim == 3})


def target_parameters(settings: LoraSettings, lm: nn.Module, key: str = "actor.lora") -> list[str]:
    """`target_parameters` resolved against the model as peft's names (`experts.gate_up_proj`): none, `experts`
    (every expert weight) or a list of short names, each of which must name one (a ConfigError otherwise)."""
    wanted = settings.target_parameters
    if not wanted:
        return []
    from roll_lite.model.moe import moe_blocks

    fused = expert_parameter_names(lm)
    if not fused:
        raise ConfigError(
            f"{key}.target_parameters: {type(lm).__name__} has no MoE experts with fused 3-D weights to adapt; "
            "use null (target_modules adapts its Linear layers)"
        )
    if any(getattr(block.experts, "is_transposed", False) for block in moe_blocks(lm)):
        raise ConfigError(
            f"{key}.target_parameters: {type(lm).__name__}'s experts store [experts, in, out]; unsupported"
        )
    names = fused if wanted == "experts" else [wanted] if isinstance(wanted, str) else list(wanted)
    unknown = [name for name in names if name not in fused]
    if unknown:
        raise ConfigError(
            f"{key}.target_parameters: {unknown} name no expert weight of {type(lm).__name__}; its experts' weights "
            f"are {fused}, or say experts"
        )
    return [f"experts.{name}" for name in sorted(set(names))]


def peft_config(
    settings: LoraSettings, targets: list[str] | str, base_model: str | None = None, parameters: list[str] | None = None
):
    from peft import LoraConfig

    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets,
        target_parameters=parameters or None,
        bias="none",
        base_model_name_or_path=base_model,
    )


def add_adapters(lm: nn.Module, settings: LoraSettings, seed: int, key: str = "actor.lora") -> nn.Module:
    """Inject LoRA adapters in place; afterwards only they require gradients. lora_A draws from a
    generator seeded by `seed` (lora_B starts at zero, so the model computes what it did before)."""
    from peft import inject_adapter_in_model

    parameters = target_parameters(settings, lm, key)
    targets = scoped_targets(target_modules(settings, lm, key), language_model_prefix(lm))
    config = peft_config(settings, targets, parameters=parameters)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(config, lm, adapter_name=ADAPTER)
    return lm


def adapted_modules(model: nn.Module) -> list[str]:
    """The short names of the modules that hold an adapter (target_modules as resolved)."""
    from peft.tuners.lora.layer import ParamWrapper
    from peft.tuners.tuners_utils import BaseTunerLayer

    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, BaseTunerLayer) and not isinstance(module, ParamWrapper)
        }
    )


def peft_target_modules(model: nn.Module) -> list[str] | str:
    """adapted_modules as peft's target_modules: on a vision-language model scoped to its language model."""
    return scoped_targets(adapted_modules(model), language_model_prefix(model))


def wrapped_parameters(model: nn.Module) -> dict[str, str]:
    """Each parameter adapter's prefix (`model.layers.0.mlp.experts.base_layer`) -> the plain HF name of the weight
    it adapts (`model.layers.0.mlp.experts.gate_up_proj`); empty without target_parameters."""
    from peft.tuners.lora.layer import ParamWrapper

    return {
        name: base_name(f"{name}.{module.parameter_name}")
        for name, module in model.named_modules()
        if isinstance(module, ParamWrapper)
    }


def adapted_parameters(model: nn.Module) -> list[str]:
    """target_parameters as resolved, in peft's names (`experts.gate_up_proj`)."""
    return sorted({"experts." + name.rsplit(".", 1)[-1] for name in wrapped_parameters(model).values()})


def adapted_modules_in(adapters: dict[str, torch.Tensor]) -> list[str]:
    """adapted_modules from adapter tensors' names alone (where there is no model to look at)."""
    return sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in adapters if is_adapter(name)})


def has_adapters(model: nn.Module) -> bool:
    return any(ADAPTER_TENSOR.search(name) for name, _ in model.named_parameters())


def scaling(settings: LoraSettings) -> float:
    return settings.alpha / settings.rank


# -- tensors by name ---------------------------------------------------------------------------


def is_adapter(name: str) -> bool:
    return bool(ADAPTER_TENSOR.search(name))


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in state.items() if is_adapter(name)}


def base_name(name: str) -> str:
    """An adapted layer's frozen weight under the name a plain HF checkpoint gives it."""
    return BASE_LAYER.sub("", name)


def _factors(state: dict[str, torch.Tensor], prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    return state[f"{prefix}.lora_A.{ADAPTER}.weight"].double(), state[f"{prefix}.lora_B.{ADAPTER}.weight"].double()


def expert_delta(a: torch.Tensor, b: torch.Tensor, experts: int) -> torch.Tensor:
    """B·A per expert [experts, out, in] from a ParamWrapper's lora_A [r·experts, in] and lora_B [out, r·experts]:
    A's rows are expert-major, B's columns rank-major (peft's layout)."""
    return torch.einsum("ore,eri->eoi", b.reshape(b.shape[0], -1, experts), a.reshape(experts, -1, a.shape[-1]))


def merged_state(
    state: dict[str, torch.Tensor], scale: float, wrapped: dict[str, str] | None = None
) -> dict[str, torch.Tensor]:
    """The plain HF state dict of base + adapters: W + scale · B A for every adapted layer, and for every wrapped
    expert weight (`wrapped`: wrapped_parameters of the model). Computed in float64 then cast back, so the merge adds
    no rounding of its own beyond the final cast."""
    merged = {}
    for name, tensor in state.items():
        if is_adapter(name):
            continue
        if name.endswith(".base_layer.weight"):  # an adapted Linear layer's (wrapped expert weights: below)
            a, b = _factors(state, name.removesuffix(".base_layer.weight"))
            tensor = (tensor.double() + scale * (b @ a)).to(tensor.dtype)
        merged[base_name(name)] = tensor
    for prefix, name in (wrapped or {}).items():
        a, b = _factors(state, prefix)
        weight = merged[name]
        merged[name] = (weight.double() + scale * expert_delta(a, b, weight.shape[0])).to(weight.dtype)
    return merged


def merged_for(state: dict[str, torch.Tensor], settings: LoraSettings, lm: nn.Module) -> dict[str, torch.Tensor]:
    """merged_state of `lm`'s full state dict with `settings`' scale."""
    return merged_state(state, scaling(settings), wrapped_parameters(lm))


def to_adapted_names(state: dict[str, torch.Tensor], lm: nn.Module) -> dict[str, torch.Tensor]:
    """A plain HF state dict under the names of `lm`, whose adapted layers hold `base_layer` (nested wrappers:
    several)."""
    adapted = {base_name(name): name for name in lm.state_dict() if not is_adapter(name)}
    return {adapted.get(name, name): tensor for name, tensor in state.items()}


def base_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The frozen base under plain HF names (the adapters left out)."""
    return {base_name(name): tensor for name, tensor in state.items() if not is_adapter(name)}


def peft_names(adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Adapter tensors under the keys PeftModel.save_pretrained writes (and from_pretrained reads)."""
    return {"base_model.model." + name.replace(f".{ADAPTER}.", "."): tensor for name, tensor in adapters.items()}


def write_peft_adapter(
    folder: Path,
    adapters: dict[str, torch.Tensor],
    settings: LoraSettings,
    targets: list[str] | str,
    base_model: str | None = None,
    parameters: list[str] | None = None,
) -> None:
    """An adapter folder in PEFT's format: adapter_config.json and adapter_model.safetensors."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    peft_config(settings, targets, base_model, parameters).save_pretrained(str(folder))
    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in peft_names(adapters).items()}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})


# -- the reference ----------------------------------------------------------------------------


@contextmanager
def adapters_disabled(model: nn.Module):
    """The base model for a while: every LoRA layer computes its base layer alone (the reference)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    if not layers:
        raise RuntimeError("adapters_disabled: the model has no LoRA adapters")
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
