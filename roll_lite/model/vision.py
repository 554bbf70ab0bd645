"""Vision-language models built locally: a tiny Qwen2.5-VL (vision tower + LM) from a config, and its
processor (the character tokenizer with Qwen's image special tokens + Qwen2-VL's image processor with
small patches), nothing from a hub. The tiny Qwen3-VL's processor and config are in qwen3_vl.py;
build_vision_model and the policy head (VisionLMWithLogProbs) take both.

The processor is the one place an image placeholder is expanded: the chat template writes
`<|vision_start|><|image_pad|><|vision_end|>` per image part, and the processor repeats `<|image_pad|>`
grid_t·grid_h·grid_w / merge_size² times. Ids that already hold the expansion must never go through it
again (peers' recurring bug: the engine expands, the trainer expands a second time).

M-RoPE: Qwen2.5-VL's position ids have 3 rows (time, height, width). `mrope_position_ids` computes
them per sequence with the model's own `get_rope_index`, so that packed sequences each start at 0 in
all three rows.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLProcessor
from transformers.processing_utils import ProcessorMixin

from roll_lite.model.modeling import packed_attention_kwargs
from roll_lite.model.tokenizer import build_char_tokenizer

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]

# compact (roll_lite/data/chat.py) with image parts: one line per message, "U: " / "A: " first.
VISION_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}A: {% elif message['role'] == 'system' %}S: {% else %}U: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}"
    + VISION_START
    + IMAGE_PAD
    + VISION_END
    + "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}<eos>{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A: {% endif %}"
)


class ImageProcessor(Qwen2_5_VLProcessor):
    """Qwen2.5-VL's processor for images alone: its video processor needs torchvision, which the CPU
    install does not have (and roll_lite reads no videos)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.video_token = IMAGE_PAD, VIDEO_PAD
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        self.video_token_id = tokenizer.convert_tokens_to_ids(VIDEO_PAD)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


def build_vision_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer plus the four vision special tokens (ids after the characters)."""
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    return tokenizer


def build_vision_processor(
    patch_size: int = 4, merge_size: int = 2, min_pixels: int = 64, max_pixels: int = 1024
) -> ImageProcessor:
    """A processor made here: images are resized so that their pixels lie in [min_pixels, max_pixels]
    with sides multiples of patch_size·merge_size (Qwen's smart_resize)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    if min_pixels > max_pixels:
        raise ValueError(f"min_pixels {min_pixels} is over max_pixels {max_pixels}")
    images = Qwen2VLImageProcessorPil(
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=2,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
    )
    tokenizer = build_vision_tokenizer()
    return ImageProcessor(image_processor=images, tokenizer=tokenizer, chat_template=tokenizer.chat_template)


def tiny_vision_config(
    processor: ImageProcessor,
    hidden_size: int = 32,
    layers: int = 2,
    vision_layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    tie_word_embeddings: bool = True,
):
    """A Qwen2.5-VL config of a few layers and tiny widths, matched to the processor's patches and tokens."""
    from transformers import Qwen2_5_VLConfig

    tokenizer, images = processor.tokenizer, processor.image_processor
    ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    head_dim = hidden_size // heads
    # M-RoPE splits each head's rotary half (head_dim / 2) into time, height and width sections
    section = [head_dim // 4, head_dim // 8, head_dim // 2 - head_dim // 4 - head_dim // 8]
    return Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size or 2 * hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
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
            window_size=images.patch_size * images.merge_size * 2,
            fullatt_block_indexes=[vision_layers - 1],
        ),
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=tie_word_embeddings,
    )


def build_vision_model(config, dtype: torch.dtype = torch.float32, seed: int = 0, freeze_vision: bool = False):
    """A randomly initialised Qwen2.5-VL or Qwen3-VL (by `config.model_type`: tiny_vision_config's or
    qwen3_vl.tiny_qwen3_vl_config's); `freeze_vision`: the vision tower (its mergers included) is not trained."""
    import transformers

    from roll_lite.model.attention import register_attention

    classes = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration", "qwen3_vl": "Qwen3VLForConditionalGeneration"}
    if config.model_type not in classes:
        raise ValueError(f"build_vision_model: model_type {config.model_type!r} is not one of {', '.join(classes)}")
    torch.manual_seed(seed)  # the packing-aware attention, as build_causal_lm's
    model = getattr(transformers, classes[config.model_type])._from_config(
        config, dtype=dtype, attn_implementation=register_attention()
    )
    if freeze_vision:
        vision_tower(model).requires_grad_(False)
    return model


def vision_tower(model: nn.Module) -> nn.Module:
    visual = getattr(getattr(model, "model", None), "visual", None)
    if not isinstance(visual, nn.Module):
        raise TypeError(f"{type(model).__name__}: no vision tower (expected model.model.visual)")
    return visual


def encode_conversation(processor: ImageProcessor, messages: list[dict], images: Sequence[Any]) -> dict:
    """One conversation through the chat template and the processor: input_ids [L] (each image's
    placeholder expanded once), pixel_values [patches, C·t·p·p], image_grid_thw [images, 3]."""
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    encoded = processor(text=[text], images=list(images) or None, return_tensors="pt")
    out = {"input_ids": encoded["input_ids"][0]}
    if images:
        out.update(pixel_values=encoded["pixel_values"], image_grid_thw=encoded["image_grid_thw"])
    return out


def mrope_position_ids(model: nn.Module, sequences: Sequence[torch.Tensor], grids: Sequence[torch.Tensor | None]):
    """M-RoPE position ids [3, sum of lengths] of sequences laid end to end (packing): each computed
    alone by the model's get_rope_index, so each restarts at 0 in all three rows. `grids[i]`: the
    image_grid_thw of sequence i's images (None: text only)."""
    image_token_id = model.config.image_token_id
    parts = []
    for ids, grid in zip(sequences, grids):
        row = ids.reshape(1, -1)
        token_types = (row == image_token_id).int()
        positions, _ = model.model.get_rope_index(row, token_types, image_grid_thw=grid)
        parts.append(positions[:, 0])
    return torch.cat(parts, dim=1)


def mrope_layout(lm: nn.Module, input_ids, position_ids, attention_mask, cu_seqlens, image_grid_thw):
    """The 3-row M-RoPE position ids [3, rows, seq] of a padded batch (`attention_mask`) or a packed row
    (`cu_seqlens`) from the strategy's 1-D ones [rows, seq] (restarting per sequence): a text sequence
    keeps them in all three rows, a sequence with image tokens gets mrope_position_ids of its own tokens,
    which restart at 0. `image_grid_thw` holds the grids of the images in the order their tokens come in
    the rows (row by row, or sequence by sequence of the packed row); each sequence takes the grids its
    image tokens need, and every grid must be used (check_expanded_once)."""
    from roll_lite.rollout.images import check_expanded_once, image_token_count

    positions = position_ids[None].expand(3, *position_ids.shape).clone()
    image_token, merge = lm.config.image_token_id, lm.config.vision_config.spatial_merge_size
    if cu_seqlens is not None:
        bounds = cu_seqlens.tolist()
        spans = [(0, start, end) for start, end in zip(bounds[:-1], bounds[1:])]
    else:
        lengths = [input_ids.shape[1]] * len(input_ids) if attention_mask is None else attention_mask.sum(-1).tolist()
        spans = [(row, 0, int(length)) for row, length in enumerate(lengths)]
    sizes = [] if image_grid_thw is None else image_token_count(image_grid_thw, merge)
    used = 0
    for row, start, end in spans:
        ids = input_ids[row, start:end]
        held, first = int((ids == image_token).sum()), used
        while held > sum(sizes[first:used]) and used < len(sizes):
            used += 1
        grids = image_grid_thw[first:used] if used > first else None
        check_expanded_once(ids, grids, image_token, merge)
        if grids is not None:
            positions[:, row, start:end] = mrope_position_ids(lm, [ids], [grids])
    if used != len(sizes):
        raise ValueError(f"{len(sizes) - used} of the {len(sizes)} images have no image tokens in the ids")
    return positions


class VisionLMWithLogProbs(nn.Module):
    """The policy head of a Qwen2.5-VL or Qwen3-VL, as CausalLMWithLogProbs is for a text LM: {'log_probs',
    'entropy' (if asked)}, next-token aligned. The image features of `pixel_values` replace the image
    tokens' embeddings (the model's own merge; the ids are never expanded again), then the decoder
    runs with the 3-row M-RoPE `position_ids` [3, rows, seq] and, for a packed row, `cu_seqlens`.
    Given the strategy's 1-D `position_ids` [rows, seq], it computes the 3-row ones per sequence
    (mrope_layout). A forward without images runs a trainable vision tower on a blank image times 0:
    every forward then gives every trainable parameter a gradient, so that the data-parallel ranks'
    FSDP2 reduce-scatters hold the same tensors whichever of their micro-batches have images."""

    # Ulysses: given the whole sequence and its sequence_slice, it merges and positions first (vision_sp.py)
    slices_whole_sequence = True

    def __init__(self, lm: nn.Module, chunk_size: int = 1024):
        super().__init__()
        self.lm, self.chunk_size = lm, chunk_size

    @property
    def decoder(self) -> nn.Module:  # the language model's layers: what FSDP2 shards one by one
        return self.lm.get_decoder()

    def forward(
        self,
        input_ids,
        position_ids,
        attention_mask=None,
        cu_seqlens=None,
        max_seqlen=None,
        pixel_values=None,
        image_grid_thw=None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        top_k: int = 0,
        gather_ids=None,
        sequence_parallel=None,
        sequence_slice: slice | None = None,
    ) -> dict[str, torch.Tensor]:
        from roll_lite.model.logprobs import chunked_log_probs
        from roll_lite.model.restricted_vocab import restricted_log_probs

        if (top_k or gather_ids is not None) and sequence_parallel is not None:
            raise NotImplementedError("a vision-language policy: no teacher top-k under sequence parallelism yet")
        position_ids = self.mrope_positions(input_ids, position_ids, attention_mask, cu_seqlens, image_grid_thw)
        images = dict(pixel_values=pixel_values, image_grid_thw=image_grid_thw)
        if sequence_parallel is not None:  # Ulysses: images merged and positions laid out whole, then sliced
            from roll_lite.model.vision_sp import sliced_hidden_states

            whole = (input_ids, position_ids, attention_mask, cu_seqlens, max_seqlen)
            hidden, targets = sliced_hidden_states(self, *whole, sequence_parallel, sequence_slice, **images)
            input_ids = targets  # this rank's columns: the outputs' shape
        else:
            hidden = self._hidden_states(input_ids, position_ids, attention_mask, cu_seqlens, max_seqlen, **images)
            targets = torch.roll(input_ids, shifts=-1, dims=1)  # the last column is never used
        # a run's model never samples its vision tokens (vision_run.py): the engine's restricted vocabulary
        excluded = getattr(self.lm, "excluded_token_ids", None)
        hidden, weight = hidden.reshape(-1, hidden.shape[-1]), self.lm.get_output_embeddings().weight
        if top_k or gather_ids is not None:  # distillation's top-k, restricted likewise (vision_teacher.py)
            from roll_lite.model.vision_teacher import restricted_head_outputs

            return restricted_head_outputs(
                hidden,
                weight,
                targets,
                input_ids.shape,
                excluded or [],
                chunk_size=self.chunk_size,
                temperature=temperature,
                with_entropy=with_entropy,
                top_k=top_k,
                gather_ids=gather_ids,
            )
        if excluded:
            log_probs, entropy = restricted_log_probs(
                hidden,
                weight,
                targets.reshape(-1),
                excluded,
                chunk_size=self.chunk_size,
                temperature=temperature,
                with_entropy=with_entropy,
            )
        else:
            log_probs, entropy = chunked_log_probs(
                hidden,
                weight,
                targets.reshape(-1),
                chunk_size=self.chunk_size,
                temperature=temperature,
                with_entropy=with_entropy,
            )
        outputs = {"log_probs": log_probs.reshape(input_ids.shape).clone()}
        if entropy is not None:
            outputs["entropy"] = entropy.reshape(input_ids.shape).clone()
        return outputs

    def mrope_positions(self, input_ids, position_ids, attention_mask, cu_seqlens, image_grid_thw) -> torch.Tensor:
        if position_ids.dim() == 2:  # the three rows per sequence, over the whole sequence
            position_ids = mrope_layout(self.lm, input_ids, position_ids, attention_mask, cu_seqlens, image_grid_thw)
        if position_ids.dim() != 3 or position_ids.shape[0] != 3:
            raise ValueError(f"position_ids: M-RoPE needs [3, rows, seq], got {list(position_ids.shape)}")
        return position_ids

    def trunk(self, input_ids, position_ids, attention_mask, cu_seqlens, max_seqlen, pixel_values, image_grid_thw):
        """The final hidden states [rows, seq, hidden], images merged and M-RoPE laid out: what a scalar head
        reads (roll_lite/model/vision_heads.py)."""
        position_ids = self.mrope_positions(input_ids, position_ids, attention_mask, cu_seqlens, image_grid_thw)
        return self._hidden_states(
            input_ids, position_ids, attention_mask, cu_seqlens, max_seqlen, pixel_values, image_grid_thw
        )

    def _hidden_states(
        self, input_ids, position_ids, attention_mask, cu_seqlens, max_seqlen, pixel_values, image_grid_thw
    ):
        packed = packed_attention_kwargs(cu_seqlens, max_seqlen)
        hidden = self.lm.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            pixel_values=pixel_values,
            image_grid_thw=image_grid_thw,
            use_cache=False,
            **packed,
        ).last_hidden_state
        if pixel_values is None:
            hidden = hidden + self._blank_image_times_zero()
        return hidden

    def _blank_image_times_zero(self) -> torch.Tensor | float:
        visual = vision_tower(self.lm)
        if not any(p.requires_grad for p in visual.parameters()) or not torch.is_grad_enabled():
            return 0.0
        settings, merge = self.lm.config.vision_config, self.lm.config.vision_config.spatial_merge_size
        width = settings.in_channels * settings.temporal_patch_size * settings.patch_size**2
        weight = next(visual.parameters())
        grid = torch.tensor([[1, merge, merge]], device=weight.device)
        blank = torch.zeros(merge * merge, width, dtype=weight.dtype, device=weight.device)
        output = self.lm.model.get_image_features(blank, grid, return_dict=True)
        deepstack = getattr(output, "deepstack_features", None) or []  # Qwen3-VL's DeepStack mergers
        return torch.stack([torch.cat(f).sum() for f in [output.pooler_output, *deepstack]]).sum() * 0.0
