"""LoRA on a vision-language model (docs/vision.md, "LoRA on a vision-language model"): the adapters go on its
language model alone. The vision tower stays as built, frozen with the rest of the base.

Short names are not enough to say so: Qwen2.5-VL's vision blocks hold `mlp.gate_proj`, `mlp.up_proj` and
`mlp.down_proj` as its decoder layers do, so `target_modules=[gate_proj]` would adapt both. peft is given one
regular expression instead, which it full-matches against each module's name: the wanted short names under the
language model's prefix (`model\\.language_model\\..*\\.(q_proj|v_proj)`). The adapter folder's adapter_config.json
holds the same expression, so PeftModel.from_pretrained adapts the same modules.
"""

from __future__ import annotations

import re

from torch import nn


def language_model_prefix(lm: nn.Module) -> str | None:
    """The language model's name in a vision-language model (`model.language_model`); None for a model without a
    vision tower (model.model.visual)."""
    if not isinstance(getattr(getattr(lm, "model", None), "visual", None), nn.Module):
        return None
    decoder = lm.get_decoder()
    return next(name for name, module in lm.named_modules() if module is decoder)


def in_scope(name: str, prefix: str | None) -> bool:
    """A module name within the part of the model that may take adapters (everything without a prefix)."""
    return prefix is None or name.startswith(prefix + ".")


def scoped_targets(names: list[str], prefix: str | None) -> list[str] | str:
    """peft's target_modules: the short names as they are, or under `prefix` as one regular expression."""
    if prefix is None:
        return names
    return rf"{re.escape(prefix)}\..*\.({'|'.join(re.escape(name) for name in names)})"


def prefix_of_adapters(names) -> str | None:
    """The language model's prefix from adapter tensors' names alone (where there is no model to look at): the
    `model.language_model` that all of them start with, else None."""
    prefixes = {name.split(".layers.")[0] for name in names}
    return prefixes.pop() if prefixes == {"model.language_model"} else None
