"""Images through the strategy's micro-batches: each micro-batch gets exactly its own rows' images, in order.

A batch with images holds, per row, `non_tensor_batch[IMAGE_INPUTS][row]`: the processor's outputs for that
row's prompt, {"pixel_values": [patches, C·t·p·p], "image_grid_thw": [images, 3]}, or None for a text row.
Every split the strategy makes (the data-parallel shares, the micro-batches, their trimming and packing)
selects rows with DataProto.index_select, which carries a row's entry with it. `image_inputs` then lays a
micro-batch's images out in its row order: the order of the image tokens in its padded rows and in its
packed row alike, so that the model's merge (the i-th image's features replace the i-th run of image
tokens) gives each image to its own tokens. The policy head turns the strategy's 1-D positions into
M-RoPE's three rows per sequence (roll_lite/model/vision.py, mrope_layout).

Image tokens are the processor's, never the policy's: a loss mask that covers one is an error, so the
global token and sample counts (micro_batches.local_mask_sums) never count an image token.
"""

from __future__ import annotations

import torch
from torch import nn

from roll_lite.data import DataProto
from roll_lite.model.modeling import CausalLMWithLogProbs, CausalLMWithScoreHead, CausalLMWithValueHead

IMAGE_INPUTS = "image_inputs"


def policy_head(lm: nn.Module, chunk_size: int = 1024) -> nn.Module:
    """CausalLMWithLogProbs, or for a vision-language model its VisionLMWithLogProbs (roll_lite/model/vision.py)."""
    if hasattr(lm.config, "vision_config"):
        from roll_lite.model.vision import VisionLMWithLogProbs

        return VisionLMWithLogProbs(lm, chunk_size)
    return CausalLMWithLogProbs(lm, chunk_size)


def scalar_head(lm: nn.Module, head: str, seed: int = 0) -> nn.Module:
    """head 'value' (critic) or 'score' (a reward model in training, drawn from `seed`): CausalLMWithValueHead /
    CausalLMWithScoreHead, or for a vision-language model its own (roll_lite/model/vision_heads.py)."""
    if head not in ("value", "score"):
        raise ValueError(f"unknown scalar head '{head}'; choose value or score")
    if hasattr(lm.config, "vision_config"):
        from roll_lite.model.vision_heads import VisionLMWithScoreHead, VisionLMWithValueHead

        return VisionLMWithValueHead(lm) if head == "value" else VisionLMWithScoreHead(lm, seed)
    return CausalLMWithValueHead(lm) if head == "value" else CausalLMWithScoreHead(lm, seed)


def has_images(data: DataProto) -> bool:
    return IMAGE_INPUTS in data.non_tensor_batch


def rows_images(micro_batch: DataProto) -> list[dict]:
    """The image entries of the micro-batch's rows with images, in row order."""
    return [entry for entry in micro_batch.non_tensor_batch[IMAGE_INPUTS] if entry is not None]


def image_inputs(model, micro_batch: DataProto) -> dict:
    """The model's image kwargs for a micro-batch: {} for a text batch, else its rows' `pixel_values` and
    `image_grid_thw` laid end to end in row order (none when none of its rows has an image). Under sequence
    parallelism every rank of a group gets them all: the head slices after merging (roll_lite/model/vision_sp.py)."""
    if not has_images(micro_batch):
        return {}
    image_token = getattr(getattr(getattr(model, "lm", None), "config", None), "image_token_id", None)
    if image_token is None:
        raise TypeError(
            f"the batch holds images (non_tensor_batch['{IMAGE_INPUTS}']) but the model "
            f"({type(model).__name__}) is not a vision-language policy"
        )
    check_loss_masks_skip_images(micro_batch, image_token)
    entries = rows_images(micro_batch)
    if not entries:
        return {}
    device = micro_batch["input_ids"].device
    return {
        "pixel_values": torch.cat([entry["pixel_values"] for entry in entries]).to(device),
        "image_grid_thw": torch.cat([entry["image_grid_thw"] for entry in entries]).to(device),
    }


def check_loss_masks_skip_images(data: DataProto, image_token_id: int) -> None:
    """ValueError when a mask named in meta_info['loss_mask_keys'] covers an image token."""
    keys = data.meta_info.get("loss_mask_keys") or []
    is_image = data["input_ids"] == image_token_id
    for key in [keys] if isinstance(keys, str) else keys:
        covered = (data[key].bool() & is_image).nonzero()
        if len(covered):
            row, position = covered[0].tolist()
            raise ValueError(
                f"loss mask '{key}' covers {len(covered)} image token(s) (first: row {row} of the micro-batch, "
                f"position {position}): image tokens are the processor's, never trained or counted; mask them out"
            )
