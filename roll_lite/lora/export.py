"""The final folder of a LoRA run: the adapter in PEFT's format, the base it goes on, and on request the
merged model, all written into a temporary folder that becomes `final` only when complete.

    final/                    adapter_config.json, adapter_model.safetensors (PeftModel.from_pretrained)
    final/base/               the base model, when it was built from config (no model.pretrained_path)
    final/merged/             base + adapters as a plain transformers model (actor.lora.save_merged)

adapter_config.json's `base_model_name_or_path` names the base: model.pretrained_path, or final/base.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from roll_lite.lora.adapters import (
    adapted_parameters,
    adapter_state,
    base_state,
    merged_for,
    peft_target_modules,
    write_peft_adapter,
)
from roll_lite.lora.settings import LoraSettings

SaveHF = Callable[[Path, dict[str, torch.Tensor]], None]  # a plain HF state dict -> a model folder


def save_lora_final(
    target: Path,
    state: dict[str, torch.Tensor],
    settings: LoraSettings,
    lm: nn.Module,
    save_hf: SaveHF,
    pretrained_path: str | None,
) -> None:
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    base_model = pretrained_path
    if pretrained_path is None:
        save_hf(partial / "base", base_state(state))
        base_model = str((target / "base").resolve())
    adapters = adapter_state(state)
    write_peft_adapter(partial, adapters, settings, peft_target_modules(lm), base_model, adapted_parameters(lm))
    if settings.save_merged:
        save_hf(partial / "merged", merged_for(state, settings, lm))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
