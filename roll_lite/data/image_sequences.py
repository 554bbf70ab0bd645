"""SFT sequences and preference pairs with images (docs/vision.md, "SFT and DPO on image rows").

A row's images are read and checked as the RL rows' are (roll_lite/data/images.py: `data.image_key`, chat
messages with one `{"type": "image"}` part per image). Its targets are found as for a text row, on the
tokenizer's rendering of the conversation, where each image is one placeholder token (roll_lite/data/sft.py,
pairs.py). The ids trained on are then the processor's: the same conversation through its chat template and
the processor, which expands each placeholder once into its image's tokens; `image_sequence` checks that they
are the tokenizer's ids with each placeholder expanded exactly so (after the BOS the processor puts first), and
carries the targets over. Image tokens are never targets: an image belongs to the prompt, never to an assistant
message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from roll_lite.data.files import DataError, Table
from roll_lite.data.images import checked_image_row

if TYPE_CHECKING:
    from PIL import Image


@dataclass(frozen=True)
class ImageColumn:
    """The rows' images: `key` is data.image_key, `processor` the run's (roll_lite/model/vision_run.py
    run_processor: the vision tokenizer's chat template + Qwen2-VL's image processor)."""

    key: str
    processor: Any


def row_pictures(table: Table, row: int, images: ImageColumn, prompt_key: str) -> list["Image.Image"]:
    """The row's decoded images, its `prompt_key` chat messages holding one image part per image and none in an
    assistant message (DataError naming the file, the row, the key and the image, as for the RL rows)."""
    pictures = checked_image_row(table, row, images.key, prompt_key)
    for j, message in enumerate(table.rows[row][prompt_key]):
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, list):
            if any(isinstance(part, dict) and part.get("type") == "image" for part in content):
                raise DataError(
                    f"{table.where(row)}: key '{prompt_key}': message {j} (assistant) holds an image: images "
                    "belong to the prompt's messages, the targets are the assistant's text"
                )
    return pictures


def image_sequence(
    processor, messages: list[dict], pictures: list, ids: list[int], mask: list[int]
) -> tuple[list[int], list[int], dict]:
    """(the processor's ids of the conversation, their target mask, its image inputs {pixel_values,
    image_grid_thw}). `ids`, `mask`: the tokenizer's rendering of the same messages (one placeholder token per
    image) and its targets. ValueError unless the processor's ids are `ids` with each placeholder expanded once
    into t·h·w / merge² image tokens, after the special tokens the processor puts first."""
    text = processor.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    encoded = processor(text=[text], images=list(pictures), return_tensors="pt")
    grids = encoded["image_grid_thw"]
    counts = [int(n) for n in grids.prod(dim=-1) // processor.image_processor.merge_size**2]  # each image's tokens
    image_token = processor.image_token_id
    if ids.count(image_token) != len(counts):
        raise ValueError(
            f"the conversation renders {ids.count(image_token)} image placeholder(s) for {len(counts)} images"
        )
    expanded, targets, images = [], [], iter(counts)
    for token, target in zip(ids, mask):
        if token == image_token:
            if target:
                raise ValueError("an image placeholder is among the targets: images belong to the prompt")
            size = next(images)
            expanded += [image_token] * size
            targets += [0] * size
        else:
            expanded.append(token)
            targets.append(target)
    processed = encoded["input_ids"][0].tolist()
    first = len(processed) - len(expanded)
    if first < 0 or processed[first:] != expanded or image_token in processed[:first]:
        raise ValueError(
            "the processor's ids are not the chat template's with each image placeholder expanded once into its "
            "image's tokens"
        )
    inputs = {"pixel_values": encoded["pixel_values"], "image_grid_thw": grids}
    return processed, [0] * first + targets, inputs
