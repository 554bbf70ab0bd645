"""The exact decoding loop (roll_lite/model/exact_decoding.py) on a vision-language policy (Qwen2.5-VL or
Qwen3-VL; docs/vision.md, "Exact and partial rollouts with images").

- The prefill: each prompt's images go through the vision tower once (all the call's images in one
  get_image_features), and each of its samples' rows gets those features (and Qwen3-VL's DeepStack
  features), merged by the model's own code in place of the image tokens.
- M-RoPE: the prefill's 3-row positions are each prompt's own, from the model's get_rope_index over its
  unpadded ids (mrope_position_ids, as the actor's mrope_layout computes them), left-padded; each decoded
  token then takes the row's largest position + 1 in all three rows, as transformers' rope_deltas do
  (position = cache position + max + 1 - prompt length).
- The vocabulary: the policy head leaves the vision tokens out (model.excluded_token_ids, restricted_vocab.py),
  so the loop samples without them and records their restricted log-prob, computed as the head computes it.

Everything runs under the batch-invariant kernels, the vision tower included: the actor's forward runs it
under them too (the strategy's batch_invariant), on the images of its own micro-batches;
tests/test_exact_vision.py checks that an image's features and the engine's log-probs are the actor's bit
for bit whatever the images beside them.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from roll_lite.model.logprobs import target_log_probs_
from roll_lite.model.restricted_vocab import restrict_log_probs
from roll_lite.rollout.images import check_expanded_once


def is_vision_lm(model: nn.Module) -> bool:
    return hasattr(model.config, "vision_config")


def prefill_inputs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    images: Sequence[dict | None] | None,
    samples: int,
) -> tuple[torch.Tensor, dict]:
    """(3-row positions [3, rows, width], the prefill's image kwargs) of left-padded rows: `samples` rows per
    prompt, `images[i]` prompt i's pixel_values and image_grid_thw (None: text only; `images` None: no image)."""
    prompts = len(input_ids) // samples
    images = [None] * prompts if images is None else list(images)
    if len(images) != prompts:
        raise ValueError(f"generate: {len(images)} image entries for {prompts} prompts")
    config = model.config
    positions = torch.zeros(3, *input_ids.shape, dtype=torch.long, device=input_ids.device)
    for row, (ids, mask) in enumerate(zip(input_ids, attention_mask)):
        entry = images[row // samples]
        grid = None if entry is None else entry["image_grid_thw"]
        own = ids[mask.bool()]
        check_expanded_once(own, grid, config.image_token_id, config.vision_config.spatial_merge_size)
        positions[:, row, mask.bool()] = prompt_positions(model, own, grid)
    with_images = [entry for entry in images if entry is not None]
    if not with_images:
        return positions, {}
    device = input_ids.device
    features = model.model.get_image_features(  # once per prompt's image, not per sample
        torch.cat([entry["pixel_values"] for entry in with_images]).to(device),
        torch.cat([entry["image_grid_thw"] for entry in with_images]).to(device),
        return_dict=True,
    )
    # the features of each row's images, rows in order: the order of the image tokens in the batch
    counts = [len(entry["image_grid_thw"]) for entry in with_images]
    starts = [sum(counts[:k]) for k in range(len(counts))]
    per_row = [i for start, count in zip(starts, counts) for _ in range(samples) for i in range(start, start + count)]
    features.pooler_output = [features.pooler_output[i] for i in per_row]
    deepstack = getattr(features, "deepstack_features", None)
    if deepstack is not None:  # Qwen3-VL: the features it adds in its first layers
        features.deepstack_features = [[layer[i] for i in per_row] for layer in deepstack]
    return positions, {"mm_encoder_outputs": {"image": features}}


def prompt_positions(model: nn.Module, ids: torch.Tensor, grid: torch.Tensor | None) -> torch.Tensor:
    """[3, L] M-RoPE positions of one prompt's ids (`grid`: its images' image_grid_thw, None: text only)."""
    if grid is None:
        return torch.arange(len(ids), device=ids.device).expand(3, -1)
    from roll_lite.model.vision import mrope_position_ids

    return mrope_position_ids(model, [ids], [grid.to(ids.device)])


def next_positions(positions: torch.Tensor) -> torch.Tensor:
    """[3, rows, 1]: the next token's position in all three rows, the row's largest so far + 1."""
    return positions.amax(dim=(0, 2)).view(1, -1, 1).expand(3, -1, -1) + 1


def excluded_ids(model: nn.Module) -> list[int]:
    """The token ids the policy head leaves out (a vision-language run's vision tokens: vision_run.py)."""
    return list(getattr(model, "excluded_token_ids", None) or [])


def mask_excluded(logits: torch.Tensor, excluded: list[int]) -> torch.Tensor:
    """A copy of the logits with the excluded ids at -inf: what is sampled from."""
    masked = logits.clone()
    masked[:, excluded] = float("-inf")
    return masked


def restricted_target_log_probs_(logits: torch.Tensor, chosen: torch.Tensor, excluded: list[int]) -> torch.Tensor:
    """[rows] log p'(chosen) over the vocabulary without `excluded`, reduced as the policy head's
    restricted_log_probs reduces it (overwrites logits)."""
    both = torch.cat([chosen[:, None], torch.tensor(excluded, device=chosen.device).expand(len(chosen), -1)], dim=1)
    return restrict_log_probs(target_log_probs_(logits, both))[0]
