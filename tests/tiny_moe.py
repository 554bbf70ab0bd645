"""The tiny Qwen3-MoE that the roll-train MoE tests build from the `model` keys (2 layers of 4 experts, 2 per token),
and their roll-train command line."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY_MOE = [
    "model.model_type=qwen3_moe",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "model.num_experts=4",
    "model.num_experts_per_tok=2",
    "model.moe_intermediate_size=16",
]


def roll_train(config: str, output: Path, run_name: str, *overrides: str) -> list[str]:
    """`roll-train --config configs/<config> ...` in this interpreter, writing under `output`/`run_name`."""
    command = [sys.executable, "-m", "roll_lite.cli", "--config", str(REPO / "configs" / config)]
    return [*command, *overrides, f"output_dir={output}", f"run_name={run_name}"]
