"""The hf engine's exact mode (rollout.exact; docs/on-policy.md): decoding whose log-probs equal the
actor's bit for bit. HFEngine(decode=exact_generate) decodes with it (the rollout worker passes it
under rollout.exact).

A decoding loop of its own instead of transformers' generate: the decoder with a KV cache under the
batch-invariant kernels (roll_lite/model/batch_invariant.py), the logits of the last position
computed by the chunked log-prob head's own code (roll_lite/model/logprobs.py: float32, divided by
the temperature), and each sampled token's log-prob reduced from them as the actor reduces its
own. The actor computes its log-probs under the same kernels (the strategy's batch_invariant, set
for the actor by rollout.exact), so whatever the batch of prompts, the padding, the micro-batches or
the packing on either side, π_engine(y_t) and π_actor(y_t) are the same float.

Sampling: top-k and top-p as transformers' warpers, then torch.multinomial, seeded as HFEngine seeds
every call; it samples other tokens than generate does with the same seed.

A vision-language policy (Qwen2.5-VL, Qwen3-VL) decodes through roll_lite/model/exact_vision.py: its
prompts' images merged at the prefill, M-RoPE's 3-row positions, the vision tokens left out of the
vocabulary (sampled from and recorded as its policy head computes them).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from roll_lite.model import exact_vision
from roll_lite.model.batch_invariant import batch_invariant_kernels
from roll_lite.model.logprobs import head_logits, target_log_probs_


def _sample(logits: torch.Tensor, params: Any) -> torch.Tensor:
    """Next token ids [rows] from logits already divided by the temperature."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    if params.greedy:
        return logits.argmax(-1)
    scores = logits.clone()
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    return torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(1)


@torch.no_grad()
def exact_generate(
    model: nn.Module,
    prompts: list[list[int]],
    params: Any,
    pad_token_id: int,
    eos_token_id: int,
    max_time_s: float | None = None,
    images: list[dict | None] | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """(new tokens, their log-probs) per row: prompts × num_samples rows, each prompt's samples together;
    a row ends after its EOS (included) or at max_new_tokens. `params`: roll_lite.rollout.SamplingParams
    (its max_new_tokens, num_samples, temperature, top_k, top_p, greedy). `images`: a vision-language
    model's, per prompt its pixel_values and image_grid_thw (None: text only), its ids already expanded."""
    from transformers import DynamicCache

    start = time.monotonic()
    samples = 1 if params.greedy else params.num_samples
    rows = [prompt for prompt in prompts for _ in range(samples)]
    device = next(model.parameters()).device
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long, device=device)
    attention_mask = torch.zeros_like(input_ids)
    for i, row in enumerate(rows):  # left-padded
        input_ids[i, width - len(row) :] = torch.tensor(row, device=device)
        attention_mask[i, width - len(row) :] = 1
    vision = exact_vision.is_vision_lm(model)
    extra: dict = {}  # the prefill's image features
    if vision:  # the prefill's image features and 3-row M-RoPE positions
        with batch_invariant_kernels():
            position_ids, extra = exact_vision.prefill_inputs(model, input_ids, attention_mask, images, samples)
        decoder = model.model
    elif images is not None:
        raise ValueError(f"generate: images given to {type(model).__name__}, not a vision-language model")
    else:
        position_ids, decoder = (attention_mask.cumsum(-1) - 1).clamp(min=0), model.get_decoder()
    excluded = exact_vision.excluded_ids(model)
    head = model.get_output_embeddings().weight
    temperature = 1.0 if params.greedy else params.temperature
    cache = DynamicCache(config=model.config)
    tokens: list[torch.Tensor] = []
    log_probs: list[torch.Tensor] = []
    finished = torch.zeros(len(rows), dtype=torch.bool, device=device)
    with batch_invariant_kernels():
        step_ids, step_positions = input_ids, position_ids
        for _ in range(params.max_new_tokens):
            hidden = decoder(
                input_ids=step_ids,
                attention_mask=attention_mask,
                position_ids=step_positions,
                past_key_values=cache,
                use_cache=True,
                **extra,
            ).last_hidden_state[:, -1]
            extra = {}
            logits = head_logits(hidden, head, temperature)
            sampled = _sample(exact_vision.mask_excluded(logits, excluded) if excluded else logits, params)
            chosen = torch.where(finished, pad_token_id, sampled)
            if excluded:
                log_probs.append(exact_vision.restricted_target_log_probs_(logits, chosen, excluded))
            else:
                log_probs.append(target_log_probs_(logits, chosen))
            tokens.append(chosen)
            finished |= chosen == eos_token_id
            if bool(finished.all()) or (max_time_s is not None and time.monotonic() - start > max_time_s):
                break
            step_ids = chosen[:, None]
            step_positions = exact_vision.next_positions(step_positions) if vision else step_positions[:, -1:] + 1
            attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
    new_tokens, new_log_probs = torch.stack(tokens, 1).tolist(), torch.stack(log_probs, 1).cpu().tolist()
    lengths = [row.index(eos_token_id) + 1 if eos_token_id in row else len(row) for row in new_tokens]
    return (
        [row[:length] for row, length in zip(new_tokens, lengths)],
        [row[:length] for row, length in zip(new_log_probs, lengths)],
    )
