"""Images in observations (docs/vision.md, "Multi-turn conversations with images").

An observation shows the model an image with content parts: a chat message's content may be a list of
`{"type": "text", "text": str}` and `{"type": "image", "image": ...}` parts, and an observation may be such
a list of parts itself (one message of the observation's role). An image is a PIL image, the bytes of an
image file, or the path of one (relative to the environment process's working folder).

In the environment's process (contract.py `checked_parts`): every image is decoded whole and converted to
RGB; one that cannot be is a BadImage, which ends that trajectory as the fault "bad_image"
(env/faults/bad_image), never the run.

In the driver (episodes.py): the processor renders an observation's messages with the chat template, then
expands each image's placeholder exactly once (`encode_messages`; turns.py `observation_inputs`); the ids it adds and
its images' inputs {pixel_values, image_grid_thw} join the trajectory together, and nothing expands them
again: the engine and the trainer get the same ids and the same images (roll_lite/rollout/images.py
check_expanded_once).
"""

from __future__ import annotations

from roll_lite.environments.contract import BadImage


def message_images(messages: list[dict]) -> list:
    """The images of the messages' image parts, in order."""
    return [
        part["image"]
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image"
    ]


def _template_messages(messages: list[dict]) -> list[dict]:
    """The messages as the chat template reads them: an image part is its placeholder, {'type': 'image'}."""
    return [
        {**m, "content": [{"type": "image"} if p["type"] == "image" else p for p in m["content"]]}
        if isinstance(m.get("content"), list)
        else m
        for m in messages
    ]


def encode_messages(
    processor, messages: list[dict], add_generation_prompt: bool = True
) -> tuple[list[int], dict | None]:
    """(ids, image inputs or None): the messages through the processor's chat template, then the processor,
    which expands each image's placeholder once; checked (check_expanded_once)."""
    from roll_lite.rollout.images import check_expanded_once

    images = message_images(messages)
    text = processor.apply_chat_template(
        _template_messages(messages), add_generation_prompt=add_generation_prompt, tokenize=False
    )
    try:
        encoded = processor(text=[text], images=images or None, return_tensors="pt")
    except ValueError as error:  # e.g. Qwen's smart_resize: an aspect ratio over 200
        raise BadImage(f"the processor refused the observation: {str(error).splitlines()[0]}") from None
    ids = encoded["input_ids"][0]
    grid = encoded["image_grid_thw"] if images else None
    try:
        check_expanded_once(ids, grid, processor.image_token_id, processor.image_processor.merge_size)
    except ValueError as error:  # e.g. a text part that writes the image token itself
        raise BadImage(f"the observation's ids: {error}") from None
    inputs = {"pixel_values": encoded["pixel_values"], "image_grid_thw": grid} if images else None
    return ids.tolist(), inputs


def join_image_inputs(entries: list[dict]) -> dict | None:
    """Several pieces' image inputs laid end to end, in order (the order of their image tokens); None: no image."""
    import torch

    if not entries:
        return None
    return {
        "pixel_values": torch.cat([entry["pixel_values"] for entry in entries]),
        "image_grid_thw": torch.cat([entry["image_grid_thw"] for entry in entries]),
    }
