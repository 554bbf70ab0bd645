"""Image rows rendered into prompts, in the driver (docs/vision.md): each row's chat messages through the
processor's chat template, then the processor, which expands each image placeholder exactly once into the
image's tokens (`encode`: roll_lite/model/vision_run.py image_prompt_encoder). A row gives its prompt ids and
its image inputs {pixel_values, image_grid_thw}, which travel with the prompt to the engine and, per sample,
with the batch to the trainer (non_tensor_batch["image_inputs"], roll_lite/strategy/vision_inputs.py).
Nothing expands them again.
"""

from __future__ import annotations

from typing import Callable

from roll_lite.data.files import DataError, Table
from roll_lite.data.images import check_image_files, checked_image_row

# (chat messages, decoded images) -> {input_ids, pixel_values, image_grid_thw}
ImageEncoder = Callable[[list[dict], list], dict]


def refuse_without_encoder(data) -> None:
    """A model that reads no images: every image row is checked (a bad one is a DataError), then a ConfigError."""
    from roll_lite.errors import ConfigError

    check_image_files(data)
    raise ConfigError(
        "data.image_key: the rows and their images are good, but the model reads no images: set "
        "model.model_type=qwen2_5_vl or qwen3_vl (a vision-language model built from the model keys; docs/vision.md)"
    )


def encode_image_rows(table: Table, data, encode: ImageEncoder) -> tuple[list[list[int]], list[dict]]:
    """Per row of `table`: its prompt ids (each image's tokens expanded once) and its image inputs."""
    ids, images = [], []
    for row in range(len(table.rows)):
        pictures = checked_image_row(table, row, data.image_key, data.prompt_key)
        try:
            encoded = encode(table.rows[row][data.prompt_key], pictures)
        except ValueError as error:  # e.g. a text part that writes an image token itself
            raise DataError(f"{table.where(row)}: key '{data.prompt_key}': {str(error).splitlines()[0]}") from None
        ids.append(encoded["input_ids"].tolist())
        images.append({"pixel_values": encoded["pixel_values"], "image_grid_thw": encoded["image_grid_thw"]})
    return ids, images
