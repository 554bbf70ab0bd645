"""The tiny Qwen3-VL built locally (roll_lite/model/qwen3_vl.py): its processor, its config (interleaved M-RoPE,
DeepStack never on the last decoder layer) and the policy head's passes that must reach every trainable parameter.
Its training under FSDP2 is in the exactness rows (test_exactness_vision.py) and a roll-train run
(test_vision_run.py)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from roll_lite.model.qwen3_vl import build_qwen3_vl_processor, interleaved_mrope_section, tiny_qwen3_vl_config
from roll_lite.model.vision import (
    VisionLMWithLogProbs,
    build_vision_model,
    build_vision_processor,
    encode_conversation,
    vision_tower,
)

MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x?"}, {"type": "image"}]}]


@pytest.fixture(scope="module")
def encoded():
    images = [Image.new("RGB", (16, 16), (200, 30, 30)), Image.new("RGB", (24, 8), (10, 90, 250))]
    return encode_conversation(build_qwen3_vl_processor(), MESSAGES, images), images


def test_the_processor_expands_each_placeholder_once_and_normalises_as_qwen3_vl(encoded):
    """The same ids as Qwen2.5-VL's processor (the same tokens, one expansion per placeholder: 4 + 3 image
    tokens), pixels normalised with mean = std = 0.5 (Qwen2.5-VL's: CLIP's)."""
    qwen3, images = encoded
    qwen2_5 = encode_conversation(build_vision_processor(), MESSAGES, images)
    assert torch.equal(qwen3["input_ids"], qwen2_5["input_ids"])
    assert torch.equal(qwen3["image_grid_thw"], torch.tensor([[1, 4, 4], [1, 2, 6]]))
    image_token = build_qwen3_vl_processor().image_token_id
    assert int((qwen3["input_ids"] == image_token).sum()) == 4 + 3
    red = (200 / 255 - 0.5) / 0.5  # the first image's red channel, every patch
    assert torch.allclose(qwen3["pixel_values"][:16, 0], torch.tensor(red, dtype=qwen3["pixel_values"].dtype))
    assert not torch.allclose(qwen2_5["pixel_values"][:16, 0], torch.tensor(red, dtype=qwen3["pixel_values"].dtype))


def test_interleaved_mrope_sections_and_a_head_too_small():
    assert interleaved_mrope_section(128) == [24, 20, 20]  # Qwen3-VL's own
    assert interleaved_mrope_section(8) == [2, 1, 1] and interleaved_mrope_section(16) == [4, 2, 2]
    with pytest.raises(ValueError, match="needs a head_dim of at least 6, got 4"):
        tiny_qwen3_vl_config(build_qwen3_vl_processor(), hidden_size=16, heads=4)
    with pytest.raises(ValueError, match="model_type 'qwen2' is not one of qwen2_5_vl, qwen3_vl"):
        build_vision_model(type("Config", (), {"model_type": "qwen2"})())


def gradients(model, encoded, with_images: bool) -> dict[str, torch.Tensor | None]:
    """Every trainable parameter's gradient of the policy head's log-probs of the text tokens after the images."""
    inputs, _ = encoded
    ids = inputs["input_ids"]
    if not with_images:  # the text around the images
        ids = ids[ids != model.config.image_token_id]
    ids = ids[None]
    images = {key: inputs[key] for key in ("pixel_values", "image_grid_thw")} if with_images else {}
    head = VisionLMWithLogProbs(model)
    out = head(ids, torch.arange(ids.shape[1])[None], attention_mask=torch.ones_like(ids), **images)["log_probs"]
    model.zero_grad(set_to_none=True)
    out[0, -4:-1].sum().backward()
    return {name: p.grad for name, p in model.named_parameters() if p.requires_grad}


def test_every_deepstack_merger_reaches_the_loss_and_the_placeholder_pass_touches_them(encoded):
    """DeepStack adds its features after decoder layers 0 .. n - 1, never the last: its output at the image
    tokens reaches no loss (the control: a merger placed there gets an all-zero gradient). A forward without
    images (a placeholder pass) gives every trainable parameter a gradient, the DeepStack mergers' included."""
    processor = build_qwen3_vl_processor()
    config = tiny_qwen3_vl_config(processor, layers=3, vision_layers=3)
    assert config.vision_config.deepstack_visual_indexes == [0, 1]
    model = build_vision_model(config, dtype=torch.float64)
    grads = gradients(model, encoded, with_images=True)
    assert all(g is not None and g.abs().max() > 0 for g in grads.values()), [
        n for n, g in grads.items() if not g.abs().max()
    ]
    config.vision_config.deepstack_visual_indexes = [0, 1, 2]  # the control: one on the last decoder layer
    control = gradients(build_vision_model(config, dtype=torch.float64), encoded, with_images=True)
    assert control["model.visual.deepstack_merger_list.2.linear_fc2.weight"].abs().max() == 0
    placeholder = gradients(model, encoded, with_images=False)
    tower = {name for name, _ in vision_tower(model).named_parameters(prefix="model.visual")}
    assert any("deepstack" in name for name in tower) and all(placeholder[name] is not None for name in tower)
