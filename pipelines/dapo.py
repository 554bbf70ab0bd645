"""DAPO's batch shaping (Yu et al., 2025): overlong reward shaping, overlong filtering and dynamic
sampling, each off unless its algorithm key turns it on (configs/dapo.yaml turns on all three).

- Overlong reward shaping (algorithm.overlong_buffer = L_cache > 0): with L_max = rollout.max_new_tokens,
  a response of |y| tokens gets (overlong_penalty ×) 0 when |y| <= L_max - L_cache,
  ((L_max - L_cache) - |y|) / L_cache when it is within the buffer, and -1 when it was cut at L_max
  without ending; added to its score.
- Overlong filtering (algorithm.overlong_filter): a response cut at L_max without its EOS leaves the
  loss (its response_mask is zeroed after the rewards are placed); its score still counts in its
  group's baseline.
- Dynamic sampling (algorithm.dynamic_sampling): groups whose scores are all equal carry no GRPO
  signal and are dropped; more prompts are drawn and generated, up to
  algorithm.max_sampling_rounds extra rounds, until prompts_per_step informative groups are found (the
  extra ones are cut). When the rounds run out the step trains on what it found, with a warning (on the first batch, all
  advantages 0, when it found nothing).
"""

from __future__ import annotations

import logging

import torch

from roll_lite.data import DataProto

logger = logging.getLogger("roll_lite")


def truncated_responses(batch: DataProto, max_new_tokens: int, eos_token_id: int) -> torch.Tensor:
    """[rows] bool: responses that reached max_new_tokens without ending with EOS."""
    mask = batch["response_mask"].bool()
    lengths = mask.sum(-1)
    last = torch.where(mask, torch.arange(mask.shape[1]), -1).max(dim=1).values.clamp(min=0)
    ends_with_eos = batch["input_ids"].gather(1, last[:, None]).squeeze(1) == eos_token_id
    return (lengths >= max_new_tokens) & ~ends_with_eos


def overlong_penalty(lengths: torch.Tensor, truncated: torch.Tensor, max_new_tokens: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment per response (0 down to -1; see the module docstring)."""
    start = max_new_tokens - buffer
    within = (start - lengths.double()) / buffer
    penalty = torch.where(lengths > start, within, torch.zeros_like(within))
    return torch.where(truncated, torch.full_like(penalty, -1.0), penalty)


def shape_overlong(
    batch: DataProto, scores: torch.Tensor, metrics: dict, algorithm, max_new_tokens: int, eos_token_id: int
) -> tuple[torch.Tensor, dict]:
    """Scores with the overlong penalty (algorithm.overlong_buffer); unchanged when it is off."""
    if not algorithm.overlong_buffer:
        return scores, metrics
    truncated = truncated_responses(batch, max_new_tokens, eos_token_id)
    lengths = batch["response_mask"].sum(-1)
    penalty = algorithm.overlong_penalty * overlong_penalty(
        lengths, truncated, max_new_tokens, algorithm.overlong_buffer
    )
    return scores + penalty.to(scores.dtype), {**metrics, "dapo/overlong_penalty": penalty.mean().item()}


def filter_overlong(batch: DataProto, metrics: dict, max_new_tokens: int, eos_token_id: int) -> dict:
    """Overlong filtering: the truncated responses' response_mask zeroed (after their rewards are placed,
    so their scores still count in their groups' baselines). Returns the metrics with dapo/filtered."""
    truncated = truncated_responses(batch, max_new_tokens, eos_token_id)
    batch.batch["response_mask"] = batch["response_mask"] * (~truncated).long()[:, None]
    return {**metrics, "dapo/overlong_filtered": truncated.double().mean().item()}


def informative_rows(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """[rows] bool: the rows of groups whose scores are not all equal."""
    groups, inverse = torch.unique(group_ids, return_inverse=True)
    scores = scores.double()
    low = torch.full((len(groups),), float("inf"), dtype=scores.dtype).scatter_reduce(0, inverse, scores, "amin")
    high = torch.full((len(groups),), float("-inf"), dtype=scores.dtype).scatter_reduce(0, inverse, scores, "amax")
    return (high > low)[inverse]


def keep_informative_groups(pipeline, batch: DataProto, scores: torch.Tensor, metrics: dict):
    """Dynamic sampling: (batch, scores, metrics) of at most prompts_per_step informative groups, drawn
    in up to algorithm.max_sampling_rounds extra rounds (pipeline.generate with the current weights)."""
    wanted, rounds = pipeline.config.rollout.prompts_per_step, 0
    first_batch, first_scores = batch, scores
    batches, kept_scores, found, seen = [], [], 0, 0
    metrics = {**metrics, "reward/mean_sampled": scores.double().mean().item()}  # before any group is dropped
    while True:
        keep = informative_rows(scores, batch["group_ids"])
        seen += len(torch.unique(batch["group_ids"]))
        if keep.any():
            rows = keep.nonzero().flatten()
            part = batch.index_select(rows)
            groups = torch.unique(part["group_ids"], return_inverse=True)[1]
            part.batch["group_ids"] = groups + found  # numbered on from the groups found before
            found += int(groups.max()) + 1
            batches.append(part)
            kept_scores.append(scores[rows])
        if found >= wanted or rounds >= pipeline.algorithm.max_sampling_rounds:
            break
        drawn = pipeline.draw_prompts()
        if drawn is None:
            break
        rows = drawn[0]
        rounds += 1
        batch = pipeline.generate(pipeline.train_data.select(rows), pipeline.sampling_params())
        scores, _ = pipeline.shaped_scores(batch)
    metrics = {**metrics, "dapo/informative_groups": found / seen, "dapo/extra_rounds": float(rounds)}
    if not batches:  # every advantage is 0: the step changes nothing but the optimizer's state
        logger.warning(
            "dynamic sampling: no group with different scores in %d groups; the step trains on the "
            "first batch, whose advantages are all 0",
            seen,
        )
        return first_batch, first_scores, metrics
    if found < wanted:
        logger.warning(
            "dynamic sampling: %d of %d informative groups after %d extra round(s) "
            "(algorithm.max_sampling_rounds=%d); training on those",
            found,
            wanted,
            rounds,
            pipeline.algorithm.max_sampling_rounds,
        )
    batch, scores = concat_padded(batches, pipeline.tokenizer.pad_token_id), torch.cat(kept_scores)
    keep = batch["group_ids"] < wanted  # the first prompts_per_step groups found
    return batch.index_select(keep.nonzero().flatten()), scores[keep], metrics


def concat_padded(batches: list[DataProto], pad_token_id: int) -> DataProto:
    """Batches of right-padded rows, each as wide as its longest row, concatenated at the widest:
    input_ids padded with pad_token_id, routed_experts (MoE routing) with -1, every other token-aligned tensor with 0."""
    width = max(b["input_ids"].shape[1] for b in batches)
    fill = {"input_ids": pad_token_id, "routed_experts": -1}
    padded = []
    for b in batches:
        extra = width - b["input_ids"].shape[1]
        tensors = {  # [rows, width] or [rows, width, ...] (routed_experts: [rows, width, layers, k])
            key: torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, extra), value=fill.get(key, 0))
            if t.dim() >= 2 and t.shape[1] == b["input_ids"].shape[1] and extra
            else t
            for key, t in b.batch.items()
        }
        padded.append(DataProto(tensors, b.non_tensor_batch, b.meta_info))
    return DataProto.concat(padded)
