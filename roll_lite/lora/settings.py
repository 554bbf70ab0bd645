"""The `lora` keys of a trained role (actor.lora, critic.lora): roll_lite/lora/adapters.py applies them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class LoraSettings:
    """LoRA adapters (peft) on the model's Linear layers: only they train, the base stays frozen
    (roll_lite/lora/adapters.py, docs/lora.md)."""

    rank: int = 0  # r; 0: no adapters, every weight trains
    alpha: float = 16.0  # the adapter's output is scaled by alpha / rank
    # dropout on the adapter's input; it draws random numbers per micro-batch, so above 0 a step's
    # gradient depends on how the batch is cut (the exactness promise holds at 0)
    dropout: float = 0.0
    target_modules: Any = "all-linear"  # all-linear (every Linear but the LM head) or a list of names: [q_proj, v_proj]
    # an MoE model's fused expert weights to adapt too (peft's target_parameters, one B·A per expert): experts (all:
    # gate_up_proj and down_proj), a list of their names, or null: none (docs/lora.md)
    target_parameters: Any = None
    # also write the merged model (base + adapters, plain transformers) to final/merged
    save_merged: bool = False

    def validate(self, prefix: str = "") -> None:
        if self.rank < 0:
            raise ValueError(f"{prefix}rank: must be >= 0 (0: no LoRA), got {self.rank}")
        if self.rank and self.alpha <= 0:
            raise ValueError(f"{prefix}alpha: must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"{prefix}dropout: must be in [0, 1), got {self.dropout}")
        if self.rank and self.target_parameters and self.dropout:
            raise ValueError(
                f"{prefix}dropout: peft's expert-weight adapters ({prefix}target_parameters) take no dropout (its "
                f"input cannot be factored out of B·A·x); use 0, got {self.dropout}"
            )
