"""A vision-language policy under Ulysses sequence parallelism: images merged whole, then sliced.

The strategy's exchange (roll_lite/strategy/sequence_parallel.py) hands each of a group's S ranks the whole
micro-batch (the same rows on every rank), the whole sequence's ids, padded to a multiple of S, and the slice
of columns that is this rank's (`sequence_slice`). A text head is given its slice of the ids; a vision head is
not, because three things need the whole sequence:
- the merge: the i-th image's features replace the i-th run of image tokens, counted over the whole
  micro-batch; a slice's image tokens are some run's tail, another's head;
- M-RoPE: an image token's three position rows, and every later token's, depend on the grids of the images
  before it in its sequence (mrope_layout, per sequence of a padded or packed row);
- Qwen3-VL's DeepStack: its features are added, in the first decoder layers, at the image tokens in order.

So every rank of the group runs the vision tower on all the micro-batch's images (it is replicated, as the
decoder's weights are), lays out the whole sequence's three M-RoPE position rows and finds the whole
sequence's image tokens, and only then keeps its columns: their token embeddings, all three position rows,
the image-token mask, and the features (main and DeepStack) of the image tokens in its columns, which those
tokens take in order (columns_features). The decoder then runs as for text (an all-to-all on the heads in
attention, the whole sequence's cu_seqlens or mask).

Gradients are counted once. A rank's loss reaches the tower only through the features its columns kept,
so its features' gradient is nonzero at those rows only; summed over the group (the exchange's
whole_gradient: one all-reduce of [image tokens, hidden] per feature tensor, exact, as it adds zeros) and
divided by S, it is the micro-batch's whole features' gradient / S on every rank, which each rank's tower
back-propagates as one unsplit backward would. The S ranks' tower gradients then sum to the micro-batch's
once, and the strategy's backward scale S and FSDP2's average over the D·S ranks give the tower the
gradient of one global forward/backward, as for the decoder (tests/test_exactness_vision.py, float64).
Back-propagating each rank's partial gradient instead would sum to the same in exact arithmetic, but HF's
vision towers round to float32 inside (RMSNorm, rotary), so an image whose tokens straddle two slices would
then miss the float64 reference by ~2e-10. A rank whose columns hold no image token takes part the same way.
A frozen tower builds no graph and exchanges nothing.

The price: the tower runs S times on the same images (once per rank of the group). The tower is small next
to the decoder and its tokens are a fraction of the sequence's; splitting the images over the S ranks and
gathering the features is not built (docs/vision.md).
"""

from __future__ import annotations

import torch
from torch import nn

from roll_lite.model.modeling import packed_attention_kwargs


def columns_features(features: torch.Tensor, image_mask: torch.Tensor, columns: slice) -> torch.Tensor:
    """The rows of `features` (one per image token of `image_mask` [rows, tokens], in row-major order) whose
    tokens lie in `columns`, in the same order as image_mask[:, columns] holds them."""
    kept = torch.zeros_like(image_mask)
    kept[:, columns] = True
    return features[kept[image_mask]]


def sliced_hidden_states(
    head: nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    max_seqlen,
    sequence_parallel,
    sequence_slice: slice | None,
    pixel_values: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states [rows, width, hidden], next-token targets [rows, width]) of this rank's columns
    `sequence_slice` of the whole micro-batch `input_ids` [rows, tokens] (its M-RoPE `position_ids` [3, rows,
    tokens]; `attention_mask` [rows, tokens] for a padded batch, `cu_seqlens` for a packed row)."""
    if sequence_slice is None:
        raise ValueError("sequence_parallel: a vision-language head needs the whole sequence and its sequence_slice")
    lm, mine = head.lm, sequence_slice
    model = lm.model
    embeds = model.get_input_embeddings()(input_ids[:, mine])
    image_mask = input_ids == lm.config.image_token_id
    language = {}
    if pixel_values is not None:
        output = model.get_image_features(pixel_values, image_grid_thw, return_dict=True)
        features = sequence_parallel.whole_gradient(torch.cat(output.pooler_output).to(embeds.dtype))
        if len(features) != int(image_mask.sum()):
            raise ValueError(
                f"the micro-batch's images give {len(features)} image features for its {int(image_mask.sum())} "
                "image tokens"
            )
        mine_mask = image_mask[:, mine, None].expand_as(embeds)
        embeds = embeds.masked_scatter(mine_mask, columns_features(features, image_mask, mine))
        deepstack = getattr(output, "deepstack_features", None)
        if deepstack:  # Qwen3-VL: added at this rank's image tokens, in their order, in the first layers
            language["visual_pos_masks"] = image_mask[:, mine]
            language["deepstack_visual_embeds"] = [
                columns_features(sequence_parallel.whole_gradient(torch.cat(layer).to(embeds.dtype)), image_mask, mine)
                for layer in deepstack
            ]
    attention = packed_attention_kwargs(cu_seqlens, max_seqlen)
    if cu_seqlens is None:  # padded: the whole sequence's mask
        if attention_mask is None:
            raise ValueError("sequence_parallel: a padded micro-batch needs its attention_mask")
        attention["attention_mask"] = sequence_parallel.sequence_mask(attention_mask)
    hidden = model.language_model(
        inputs_embeds=embeds,
        position_ids=position_ids[:, :, mine],
        use_cache=False,
        sequence_parallel=sequence_parallel,
        **attention,
        **language,
    ).last_hidden_state
    if pixel_values is None:
        hidden = hidden + head._blank_image_times_zero()
    return hidden, torch.roll(input_ids, shifts=-1, dims=1)[:, mine]
