"""A pretrained vision-language model's folder (docs/vision.md, "A pretrained folder"): model.pretrained_path
naming a local Qwen2.5-VL or Qwen3-VL folder as `save_pretrained` writes it (config.json with its vision_config,
the weights, and the processor's files: preprocessor_config.json or processor_config.json, tokenizer.json, the
chat template). The model, the tokenizer and the processor all come from the folder, nothing from a hub: the
patch and merge sizes, the vision special tokens and their ids, the chat template. data.min_pixels /
data.max_pixels, when set, replace the folder's resize bounds.

The processor is Qwen2-VL's image processor (its PIL one: the others need torchvision, which the CPU install does
not have) with the folder's settings, and the tokenizer of tokenizer.json, in roll_lite's image-only processor
classes (vision.py ImageProcessor, qwen3_vl.py Qwen3ImageProcessor). `check_folder_processor` checks it against
config.json: the four vision tokens in the vocabulary, the image token's id, the patch, temporal patch and merge
sizes; every disagreement is one line naming model.pretrained_path and the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

FAMILIES = ("qwen2_5_vl", "qwen3_vl")
MODEL_CLASSES = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration", "qwen3_vl": "Qwen3VLForConditionalGeneration"}
KEY = "model.pretrained_path"


def folder_vision_type(path: str | None) -> str | None:
    """The model_type of a local folder's config.json when it describes a vision-language model (it has a
    vision_config); None for a text model, a hub id, or no readable config.json (preflight reports those)."""
    if not path:
        return None
    file = Path(path).expanduser() / "config.json"
    try:
        settings = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(settings, dict) or "vision_config" not in settings:
        return None
    return str(settings.get("model_type"))


def image_processor_settings(folder: Path) -> tuple[dict, str]:
    """(the image processor's settings, the file holding them): preprocessor_config.json (as a hub folder has
    it), else processor_config.json's `image_processor` (as transformers 5's save_pretrained writes it)."""
    for name, inner in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
        file = folder / name
        if not file.is_file():
            continue
        try:
            settings = json.loads(file.read_text())
        except ValueError as error:
            raise ValueError(f"{KEY}: cannot read {file}: {error}") from None
        if inner is not None:
            settings = settings.get(inner)
        if isinstance(settings, dict):
            return settings, name
    raise ValueError(
        f"{KEY}: '{folder}' has no processor: neither preprocessor_config.json nor processor_config.json with an "
        "image_processor (save the processor with the model: processor.save_pretrained(folder))"
    )


def pixel_bounds(settings: dict, data_config: Any, source: str) -> tuple[int, int]:
    """(min_pixels, max_pixels): data.min_pixels / data.max_pixels where set, else the folder's."""
    size = settings.get("size") or {}
    folder_low = settings.get("min_pixels", size.get("shortest_edge"))
    folder_high = settings.get("max_pixels", size.get("longest_edge"))
    low = getattr(data_config, "min_pixels", None)
    high = getattr(data_config, "max_pixels", None)
    low = folder_low if low is None else low
    high = folder_high if high is None else high
    if low is None or high is None:
        raise ValueError(
            f"{KEY}: {source} gives no pixel bounds (size.shortest_edge / longest_edge): set data.min_pixels and data.max_pixels"
        )
    if low > high:
        key = "data.min_pixels" if getattr(data_config, "min_pixels", None) is not None else "data.max_pixels"
        raise ValueError(f"{key}: the bounds [{low}, {high}] (with the folder's {source}) are empty")
    return int(low), int(high)


def chat_template(folder: Path) -> str | None:
    """The processor's chat template: chat_template.jinja (transformers 5), else chat_template.json's."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    if (folder / "chat_template.json").is_file():
        try:
            return json.loads((folder / "chat_template.json").read_text()).get("chat_template")
        except (ValueError, AttributeError) as error:
            raise ValueError(f"{KEY}: cannot read {folder / 'chat_template.json'}: {error}") from None
    return None


def load_folder_processor(path: str, data_config: Any = None):
    """The processor of the folder `path` (its family's image-only processor class), its resize bounds
    data.min_pixels / data.max_pixels where set."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from roll_lite.model.qwen3_vl import Qwen3ImageProcessor
    from roll_lite.model.vision import ImageProcessor

    folder = Path(path).expanduser()
    family = folder_vision_type(path)
    if family not in FAMILIES:
        raise ValueError(
            f"{KEY}: '{path}' holds a {family} vision-language model (config.json's model_type); roll_lite reads "
            f"{' and '.join(FAMILIES)} folders"
        )
    settings, source = image_processor_settings(folder)
    kind = str(settings.get("image_processor_type", ""))
    if not kind.startswith("Qwen2VLImageProcessor"):
        raise ValueError(
            f"{KEY}: {source}'s image_processor_type is {kind!r}; roll_lite reads Qwen2-VL's image processor"
        )
    if not (folder / "tokenizer.json").is_file():
        raise ValueError(f"{KEY}: '{path}' has no tokenizer.json (save the processor with processor.save_pretrained)")
    low, high = pixel_bounds(settings, data_config, source)
    taken = {
        k: v
        for k, v in settings.items()
        if k not in ("image_processor_type", "processor_class", "min_pixels", "max_pixels")
    }
    images = Qwen2VLImageProcessorPil(**{**taken, "size": {"shortest_edge": low, "longest_edge": high}})
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.chat_template = chat_template(folder) or tokenizer.chat_template  # the processor's, as transformers'
    if not tokenizer.chat_template:
        raise ValueError(
            f"{KEY}: '{path}' has no chat template (chat_template.jinja / chat_template.json / tokenizer_config.json)"
        )
    classes = {"qwen2_5_vl": ImageProcessor, "qwen3_vl": Qwen3ImageProcessor}
    return classes[family](image_processor=images, tokenizer=tokenizer, chat_template=tokenizer.chat_template), source


def check_folder_processor(hf_config, processor, source: str) -> None:
    """The processor (of `source`, tokenizer.json) against the folder's config.json: one line naming both."""
    from roll_lite.model.vision import IMAGE_PAD, VISION_TOKENS

    tokenizer, images, vision = processor.tokenizer, processor.image_processor, hf_config.vision_config
    vocab = tokenizer.get_vocab()
    missing = [token for token in VISION_TOKENS if token not in vocab]
    if missing:
        raise ValueError(f"{KEY}: tokenizer.json has no {', '.join(missing)} (the vision special tokens)")
    if vocab[IMAGE_PAD] != hf_config.image_token_id:
        raise ValueError(
            f"{KEY}: tokenizer.json gives {IMAGE_PAD} the id {vocab[IMAGE_PAD]} but config.json's image_token_id "
            f"is {hf_config.image_token_id}"
        )
    for mine, theirs in (
        ("merge_size", "spatial_merge_size"),
        ("patch_size", "patch_size"),
        ("temporal_patch_size", "temporal_patch_size"),
    ):
        if getattr(images, mine) != getattr(vision, theirs):
            raise ValueError(
                f"{KEY}: {source}'s {mine} is {getattr(images, mine)} but config.json's vision_config.{theirs} is "
                f"{getattr(vision, theirs)}"
            )
    text = hf_config.get_text_config()
    if len(tokenizer) > text.vocab_size:
        raise ValueError(
            f"{KEY}: tokenizer.json has {len(tokenizer)} tokens but config.json's vocab_size is {text.vocab_size}"
        )


def folder_config(model_config: Any):
    """The folder's config.json (local files only)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_config.pretrained_path, local_files_only=True)


def load_folder_vlm(model_config: Any) -> nn.Module:
    """The folder's Qwen2.5-VL or Qwen3-VL with its weights (local files only), the packing-aware attention;
    model.freeze_vision: its tower does not train."""
    import transformers

    from roll_lite.model.attention import register_attention
    from roll_lite.model.vision import vision_tower

    family = folder_vision_type(model_config.pretrained_path)
    if family not in MODEL_CLASSES:
        raise ValueError(f"{KEY}: '{model_config.pretrained_path}' is no {' or '.join(FAMILIES)} folder")
    model = getattr(transformers, MODEL_CLASSES[family]).from_pretrained(
        model_config.pretrained_path,
        dtype=getattr(torch, model_config.dtype),
        attn_implementation=register_attention(),
        local_files_only=True,
    )
    if model_config.freeze_vision:
        vision_tower(model).requires_grad_(False)
    return model
