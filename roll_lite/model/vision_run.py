"""A run's vision-language model from its `model` keys (docs/vision.md): model.model_type=qwen2_5_vl builds
the tiny Qwen2.5-VL of roll_lite/model/vision.py, qwen3_vl the tiny Qwen3-VL of roll_lite/model/qwen3_vl.py,
sized by the text keys (hidden_size, num_hidden_layers, heads, ...), with the vision tokenizer in every process and, in the driver, the processor that renders the
image rows (data.min_pixels / data.max_pixels). A Qwen2.5-VL or Qwen3-VL folder as model.pretrained_path gives all of
them instead (vision_folder.py: its weights, tokenizer and processor).

The vision special tokens are never sampled: the engine masks them out of the sampling distribution, and the
policy head normalises its log-probs and entropy over the same restricted vocabulary (restricted_vocab.py), so
that the engine's recorded log-probs stay the trainer's. `excluded_token_ids` on the built model says which.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

VISION_MODEL_TYPES = ("qwen2_5_vl", "qwen3_vl")
# the processor's bounds when data.min_pixels / data.max_pixels are null (build_vision_processor's defaults)
DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS = 64, 1024


def is_vision_model(model_config: Any) -> bool:
    """The `model` section builds a vision-language model, or names a folder holding one (vision_folder.py)."""
    from roll_lite.model.vision_folder import folder_vision_type

    if model_config.pretrained_path is not None:
        return folder_vision_type(model_config.pretrained_path) is not None
    return model_config.model_type in VISION_MODEL_TYPES


def model_processor(model_config: Any, data_config: Any = None):
    """The run's processor: a pretrained folder's (vision_folder.py), else run_processor's."""
    if model_config.pretrained_path is not None:
        from roll_lite.model.vision_folder import load_folder_processor

        return load_folder_processor(model_config.pretrained_path, data_config)[0]
    return run_processor(data_config, model_config.model_type)


def run_processor(data_config: Any = None, model_type: str = "qwen2_5_vl"):
    """The processor of a run's image rows (`model_type`'s: Qwen2.5-VL's or Qwen3-VL's): the vision tokenizer +
    Qwen2-VL's image processor within data.min_pixels / data.max_pixels."""
    from roll_lite.model.qwen3_vl import build_qwen3_vl_processor
    from roll_lite.model.vision import build_vision_processor

    low = getattr(data_config, "min_pixels", None)
    high = getattr(data_config, "max_pixels", None)
    if low is None:
        low = DEFAULT_MIN_PIXELS if high is None else min(DEFAULT_MIN_PIXELS, high)
    build = build_qwen3_vl_processor if model_type == "qwen3_vl" else build_vision_processor
    return build(min_pixels=low, max_pixels=max(DEFAULT_MAX_PIXELS, low) if high is None else high)


def run_tokenizer(model_config: Any):
    """The run's tokenizer: the vision tokenizer for a vision-language model, else load_tokenizer's."""
    from roll_lite.model.tokenizer import load_tokenizer

    if not is_vision_model(model_config):
        return load_tokenizer(model_config.tokenizer_path, model_config.chat_template)
    if model_config.pretrained_path is not None:
        return model_processor(model_config).tokenizer
    from roll_lite.model.vision import build_vision_tokenizer

    return build_vision_tokenizer()


def vision_token_ids(tokenizer) -> list[int]:
    from roll_lite.model.vision import VISION_TOKENS

    return [int(i) for i in tokenizer.convert_tokens_to_ids(VISION_TOKENS)]


def vision_config(model_config: Any):
    """The Qwen2.5-VL or Qwen3-VL config of the `model` keys (vision tower: tiny_vision_config's or
    tiny_qwen3_vl_config's)."""
    from roll_lite.model.qwen3_vl import tiny_qwen3_vl_config
    from roll_lite.model.vision import tiny_vision_config

    m = model_config
    if m.pretrained_path is not None:
        from roll_lite.model.vision_folder import folder_config

        return folder_config(m)
    tiny = tiny_qwen3_vl_config if m.model_type == "qwen3_vl" else tiny_vision_config
    # the processor's patch and merge sizes and token ids only: the pixel bounds do not matter here
    return tiny(
        run_processor(model_type=m.model_type),
        hidden_size=m.hidden_size,
        layers=m.num_hidden_layers,
        heads=m.num_attention_heads,
        kv_heads=m.num_key_value_heads,
        intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=m.tie_word_embeddings,
    )


def load_vision_lm(model_config: Any, seed: int) -> nn.Module:
    """The run's Qwen2.5-VL or Qwen3-VL (random init from `seed`; model.freeze_vision: its tower does not train),
    marked with the token ids it never samples (`excluded_token_ids`)."""
    from roll_lite.model.vision import build_vision_model, build_vision_tokenizer

    if model_config.pretrained_path is not None:
        from roll_lite.model.vision_folder import load_folder_vlm

        model = load_folder_vlm(model_config)
        model.excluded_token_ids = vision_token_ids(run_tokenizer(model_config))
        return model
    model = build_vision_model(
        vision_config(model_config),
        dtype=getattr(torch, model_config.dtype),
        seed=seed,
        freeze_vision=model_config.freeze_vision,
    )
    model.excluded_token_ids = vision_token_ids(build_vision_tokenizer())
    return model


def load_run_lm(model_config: Any, vocab_size: int, seed: int) -> nn.Module:
    """The run's model: the vision-language model of the `model` keys, else load_causal_lm's (every worker
    calls this, so that the actor, the reference and the engine start from the same weights)."""
    from roll_lite.model.modeling import load_causal_lm

    if is_vision_model(model_config):
        return load_vision_lm(model_config, seed)
    return load_causal_lm(model_config, vocab_size, seed=seed)


def image_prompt_encoder(model_config: Any, data_config: Any) -> Callable[[list[dict], list], dict] | None:
    """For data.image_key with a vision-language model: (messages, images) -> the processor's {input_ids,
    pixel_values, image_grid_thw}, each image's tokens checked expanded once (roll_lite/data/image_prompts.py
    renders the rows with it); None for a model that reads no images."""
    if not is_vision_model(model_config) or getattr(data_config, "image_key", None) is None:
        return None
    from roll_lite.model.vision import encode_conversation
    from roll_lite.rollout.images import check_expanded_once

    processor = model_processor(model_config, data_config)
    merge = processor.image_processor.merge_size

    def encode(messages: list[dict], images: list) -> dict:
        encoded = encode_conversation(processor, messages, images)
        check_expanded_once(encoded["input_ids"], encoded.get("image_grid_thw"), processor.image_token_id, merge)
        return encoded

    return encode


def vision_parameter_names(model: nn.Module) -> set[str]:
    """The names (in `model`'s state dict) of its vision tower's parameters."""
    from roll_lite.model.vision import vision_tower

    tower = {id(p) for p in vision_tower(model).parameters()}
    return {name for name, p in model.named_parameters() if id(p) in tower}


def save_tokenizer_files(model_config: Any, data_config: Any, tokenizer, path) -> None:
    """Beside a final folder's weights: a vision-language model's processor (tokenizer, image processor settings
    with the run's pixel bounds, chat template: what vision_folder.py reads back), else the tokenizer."""
    if is_vision_model(model_config):
        model_processor(model_config, data_config).save_pretrained(str(path))
    else:
        tokenizer.save_pretrained(path)
