"""LoRA adapters (peft) on the run's model: which modules get them, their tensors by name, the PEFT
folder format, merging, and the reference as the model with its adapters switched off.

The adapters are injected in place (`peft.inject_adapter_in_model`): the model stays a plain HF
causal LM whose adapted Linear layers hold `base_layer` (frozen) and `lora_A` / `lora_B` (trained),
so the strategy, the decoder-layer sharding and the chunked log-prob head see the same module tree as
without LoRA. Names here are the model's own (`model.layers.0.self_attn.q_proj.lora_A.default.weight`);
`peft_names` turns them into what `PeftModel.save_pretrained` writes.

The LM head is never adapted: the chunked log-prob head (roll_lite/model/logprobs.py) multiplies by its
weight directly, so an adapter there would be skipped in training. Only nn.Linear modules are.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from roll_lite.errors import ConfigError
from roll_lite.lora.settings import LoraSettings

ADAPTER = "default"  # peft's adapter name; one adapter per model
ADAPTER_TENSOR = re.compile(r"\.lora_[AB]\.")
WEIGHTS_FILE = "adapter_model.safetensors"


def linear_module_names(lm: nn.Module) -> list[str]:
    """The short names (q_proj, down_proj, ...) of the model's Linear modules, the LM head left out."""
    head = lm.get_output_embeddings()
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in lm.named_modules()
            if isinstance(module, nn.Linear) and module is not head
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
        raise ConfigError(
            f"{key}.target_modules: {what} of {type(lm).__name__}; its Linear modules (the LM head "
            f"cannot take an adapter) are {linear}, or say all-linear"
        )
    return sorted(set(wanted))


def peft_config(settings: LoraSettings, targets: list[str], base_model: str | None = None):
    from peft import LoraConfig

    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets,
        bias="none",
        base_model_name_or_path=base_model,
    )


def add_adapters(lm: nn.Module, settings: LoraSettings, seed: int, key: str = "actor.lora") -> nn.Module:
    """Inject LoRA adapters in place; afterwards only they require gradients. lora_A draws from a
    generator seeded by `seed` (lora_B starts at zero, so the model computes what it did before)."""
    from peft import inject_adapter_in_model

    config = peft_config(settings, target_modules(settings, lm, key))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(config, lm, adapter_name=ADAPTER)
    return lm


def adapted_modules(model: nn.Module) -> list[str]:
    """The short names of the modules that hold an adapter (target_modules as resolved)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return sorted(
        {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)}
    )


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
    return name.replace(".base_layer.", ".")


def merged_state(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """The plain HF state dict of base + adapters: W + scale · B A for every adapted layer. Computed in
    float64 then cast back, so the merge adds no rounding of its own beyond the final cast."""
    merged = {}
    for name, tensor in state.items():
        if is_adapter(name):
            continue
        if ".base_layer." in name and name.endswith(".weight"):
            prefix = name.removesuffix(".base_layer.weight")
            a, b = state[f"{prefix}.lora_A.{ADAPTER}.weight"], state[f"{prefix}.lora_B.{ADAPTER}.weight"]
            tensor = (tensor.double() + scale * (b.double() @ a.double())).to(tensor.dtype)
        merged[base_name(name)] = tensor
    return merged


def to_adapted_names(state: dict[str, torch.Tensor], lm: nn.Module) -> dict[str, torch.Tensor]:
    """A plain HF state dict under the names of `lm`, whose adapted layers hold `base_layer`."""
    names = set(lm.state_dict())
    adapted = {}
    for name, tensor in state.items():
        prefix, _, leaf = name.rpartition(".")
        inner = f"{prefix}.base_layer.{leaf}"
        adapted[inner if inner in names else name] = tensor
    return adapted


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
    targets: list[str],
    base_model: str | None = None,
) -> None:
    """An adapter folder in PEFT's format: adapter_config.json and adapter_model.safetensors."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    peft_config(settings, targets, base_model).save_pretrained(str(folder))
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
