"""A tiny Qwen3-VL built locally (docs/vision.md, "Qwen3-VL"): its processor and its config, nothing from a hub.
`build_vision_model` (vision.py) builds the model of either family from its config, and `VisionLMWithLogProbs`
is the policy head of both.

What differs from Qwen2.5-VL, and how roll_lite takes it:
- the vision tower: learned position embeddings (`num_position_embeddings`, a square grid resampled
  bilinearly to each image's patches) on top of its 2-D rotary ones, LayerNorm blocks and full attention
  within each image (no windows); its merger is LayerNorm -> Linear -> GELU -> Linear;
- DeepStack: the outputs of the tower's blocks `deepstack_visual_indexes` go through mergers of their own
  and are added to the image tokens' hidden states after the first decoder layers (one layer each).
  transformers places them by the image-token mask of the whole micro-batch in row-major order, so, as for the
  main image features, each micro-batch's images must come in the order of their tokens (row order, or
  sequence order in a packed row): roll_lite/strategy/vision_inputs.py gives them so;
- interleaved M-RoPE: the rotary frequencies go to time, height and width in turn (t h w t h w ...; the
  height and width take `mrope_section[1]` and `[2]` of them, time the rest) instead of in three blocks;
  `get_rope_index` (the same call) gives each image's tokens (t, h, w) positions and moves the next text by
  max(h, w) / merge;
- the language model is Qwen3's (q / k RMSNorm, an explicit head_dim), its keys under `text_config` only;
- the processor: Qwen3VLProcessor (the same four vision tokens and one expansion per placeholder), here with
  Qwen2-VL's image processor (Qwen3-VL's own choice) normalising with mean = std = 0.5.
"""

from __future__ import annotations

from transformers import Qwen3VLProcessor
from transformers.processing_utils import ProcessorMixin

from roll_lite.model.vision import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START, VISION_TOKENS, build_vision_tokenizer


class Qwen3ImageProcessor(Qwen3VLProcessor):
    """Qwen3-VL's processor for images alone (its video processor needs torchvision; roll_lite reads no videos)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.video_token = IMAGE_PAD, VIDEO_PAD
        self.vision_start_token, self.vision_end_token = VISION_START, VISION_END
        ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
        self.image_token_id, self.video_token_id = ids[IMAGE_PAD], ids[VIDEO_PAD]
        self.vision_start_token_id, self.vision_end_token_id = ids[VISION_START], ids[VISION_END]
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


def build_qwen3_vl_processor(
    patch_size: int = 4, merge_size: int = 2, min_pixels: int = 64, max_pixels: int = 1024
) -> Qwen3ImageProcessor:
    """A Qwen3-VL processor made here: the vision tokenizer (vision.py) and Qwen2-VL's image processor with
    small patches, each image resized so that its pixels lie in [min_pixels, max_pixels] with sides multiples
    of patch_size·merge_size."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    if min_pixels > max_pixels:
        raise ValueError(f"min_pixels {min_pixels} is over max_pixels {max_pixels}")
    images = Qwen2VLImageProcessorPil(
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=2,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    tokenizer = build_vision_tokenizer()
    return Qwen3ImageProcessor(image_processor=images, tokenizer=tokenizer, chat_template=tokenizer.chat_template)


def interleaved_mrope_section(head_dim: int) -> list[int]:
    """[time, height, width] counts of the head's head_dim / 2 rotary frequencies, in Qwen3-VL's 24 : 20 : 20
    (height and width at least one each); interleaved, the width's last one is frequency 3·width - 1."""
    half = head_dim // 2
    side = max(1, half * 5 // 16)
    if 3 * side > half:
        raise ValueError(f"Qwen3-VL's interleaved M-RoPE needs a head_dim of at least 6, got {head_dim}")
    return [half - 2 * side, side, side]


def tiny_qwen3_vl_config(
    processor: Qwen3ImageProcessor,
    hidden_size: int = 32,
    layers: int = 2,
    vision_layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    tie_word_embeddings: bool = True,
):
    """A Qwen3-VL config of a few layers and tiny widths, matched to the processor's patches and tokens (the
    arguments are tiny_vision_config's). DeepStack takes the outputs of the first min(vision_layers, layers - 1, 3)
    vision blocks, one decoder layer each: never the last decoder layer, whose output at the image tokens reaches
    no loss (image tokens are never trained), so that a DeepStack merger there would get no gradient."""
    from transformers import Qwen3VLConfig

    tokenizer, images = processor.tokenizer, processor.image_processor
    ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    if hidden_size % heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of the {heads} attention heads")
    head_dim = hidden_size // heads
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": interleaved_mrope_section(head_dim)}
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size or 2 * hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=max_position_embeddings,
            rope_parameters={**rope, "mrope_interleaved": True},
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
        ),
        vision_config=dict(
            depth=vision_layers,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=hidden_size,
            patch_size=images.patch_size,
            spatial_merge_size=images.merge_size,
            temporal_patch_size=images.temporal_patch_size,
            num_position_embeddings=36,  # a 6 x 6 grid, resampled to each image's patches
            deepstack_visual_indexes=list(range(min(vision_layers, layers - 1, 3))),
        ),
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=tie_word_embeddings,
    )
