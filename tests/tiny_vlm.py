"""The tiny vision-language model that the roll-train image tests build from the `model` keys: a language model of
2 layers of width 32 (docs/vision.md; the vision tower's own sizes are roll_lite/model/vision.py's)."""

from __future__ import annotations

TINY_VLM_SIZES = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "model.max_position_embeddings=128",
]
TINY_VLM = ["model.model_type=qwen2_5_vl", *TINY_VLM_SIZES]  # a Qwen2.5-VL
