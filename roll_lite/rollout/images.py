"""Prompts with images in the rollout engine: checks and inputs that need only tensors.

The ids an engine generates from already hold each image's tokens, expanded once by the processor
(roll_lite/model/vision.py); nothing here expands a placeholder, it checks that none was expanded
twice or left unexpanded.
"""

from __future__ import annotations

from typing import Sequence

import torch


def image_token_count(image_grid_thw: torch.Tensor, merge_size: int) -> list[int]:
    """The `<|image_pad|>` tokens each image takes in the ids: t·h·w / merge_size²."""
    return [int(n) for n in image_grid_thw.prod(dim=-1) // merge_size**2]


def check_expanded_once(
    input_ids: torch.Tensor, image_grid_thw: torch.Tensor | None, image_token_id: int, merge_size: int
):
    """ValueError unless the ids hold exactly the image tokens of their images: a placeholder left
    unexpanded, or expanded twice, fails here instead of training on misplaced image features."""
    held = int((input_ids == image_token_id).sum())
    expected = 0 if image_grid_thw is None else sum(image_token_count(image_grid_thw, merge_size))
    if held != expected:
        raise ValueError(
            f"the ids hold {held} image tokens where their images' grids need {expected}: "
            "each image placeholder must be expanded exactly once"
        )


def generation_inputs(
    input_ids: torch.Tensor, images: Sequence[dict | None], image_token_id: int, merge_size: int
) -> dict:
    """What `generate` needs besides the ids for prompts with images: each prompt's pixel_values and
    image_grid_thw (`images[i]`, None for a text prompt) in prompt order, and mm_token_type_ids, without
    which transformers decodes with 1-D positions (see mrope_position_ids). Each prompt's ids must hold
    its images' tokens already expanded (check_expanded_once): the engine expands nothing."""
    if len(images) != len(input_ids):
        raise ValueError(f"generate: {len(images)} image entries for {len(input_ids)} prompts")
    for row, entry in zip(input_ids, images):
        check_expanded_once(row, None if entry is None else entry["image_grid_thw"], image_token_id, merge_size)
    inputs: dict = {"mm_token_type_ids": (input_ids == image_token_id).int()}
    with_images = [entry for entry in images if entry is not None]
    if with_images:
        inputs.update(
            pixel_values=torch.cat([entry["pixel_values"] for entry in with_images]),
            image_grid_thw=torch.cat([entry["image_grid_thw"] for entry in with_images]),
        )
    return inputs
