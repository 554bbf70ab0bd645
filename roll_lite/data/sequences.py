"""Assembling token-id lists into the right-padded batch tensors the strategy trains on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from roll_lite.data import DataProto

if TYPE_CHECKING:
    from roll_lite.data.prompts import PromptData
    from roll_lite.rollout import Completions


def build_sequence_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_token_id: int,
    response_log_probs: Sequence[Sequence[float]] | None = None,
) -> DataProto:
    """Rows = prompt + response, right-padded: input_ids, attention_mask, and response_mask
    (1 on the response tokens, the ones the policy generated and is trained on). With the rollout
    engine's log-probs of the response tokens, also `rollout_log_probs` (token-aligned, 0 elsewhere)."""
    if len(prompts) != len(responses):
        raise ValueError(f"build_sequence_batch: {len(prompts)} prompts but {len(responses)} responses")
    width = max(len(p) + len(r) for p, r in zip(prompts, responses))
    rows = len(prompts)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(rows, width, dtype=torch.long)
    response_mask = torch.zeros(rows, width, dtype=torch.long)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        if not prompt:
            raise ValueError(f"build_sequence_batch: row {i} has an empty prompt")
        total = len(prompt) + len(response)
        input_ids[i, :total] = torch.tensor(list(prompt) + list(response), dtype=torch.long)
        attention_mask[i, :total] = 1
        response_mask[i, len(prompt) : total] = 1
    batch = DataProto({"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask})
    if response_log_probs is not None:
        rollout_log_probs = torch.zeros(rows, width, dtype=torch.float32)
        for i, (prompt, response, log_probs) in enumerate(zip(prompts, responses, response_log_probs, strict=True)):
            if len(log_probs) != len(response):
                raise ValueError(
                    f"build_sequence_batch: row {i} has {len(response)} response tokens but {len(log_probs)} log-probs"
                )
            rollout_log_probs[i, len(prompt) : len(prompt) + len(response)] = torch.tensor(
                list(log_probs), dtype=torch.float32
            )
        batch.batch["rollout_log_probs"] = rollout_log_probs
    return batch


def build_target_batch(
    sequences: Sequence[Sequence[int]],
    target_masks: Sequence[Sequence[int]],
    pad_token_id: int,
    images: Sequence[dict | None] | None = None,
) -> DataProto:
    """SFT rows, right-padded: input_ids, attention_mask, and response_mask (1 on the target tokens:
    the response, or every assistant turn). The first token of a row is never a target. With `images`,
    each row's image inputs (non_tensor_batch['image_inputs']: roll_lite/strategy/vision_inputs.py)."""
    width = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(sequences), width, dtype=torch.long)
    response_mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for i, (ids, mask) in enumerate(zip(sequences, target_masks)):
        if len(ids) != len(mask) or not ids or mask[0]:
            raise ValueError(
                f"build_target_batch: row {i} has {len(ids)} tokens, {len(mask)} mask entries and "
                f"{'a target' if mask and mask[0] else 'no target'} at position 0"
            )
        input_ids[i, : len(ids)] = torch.tensor(list(ids), dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
        response_mask[i, : len(ids)] = torch.tensor(list(mask), dtype=torch.long)
    if images is not None and len(images) != len(sequences):
        raise ValueError(f"build_target_batch: {len(images)} image entries for {len(sequences)} rows")
    return DataProto(
        {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask},
        {} if images is None else {"image_inputs": list(images)},
    )


def completion_batch(prompts: "PromptData", generated: "Completions", tokenizer) -> DataProto:
    """Sequences of every (prompt, sample) the engine returned: tensors + response_text, group ids, and
    per row the prompt's answer and extra fields (non_tensor_batch 'answer', 'extra': a dict per row) and, for
    image prompts, their image inputs ('image_inputs').
    When sampling, also the engine's log-prob of each response token ('rollout_log_probs'); with partial
    rollouts (rollout.fully_async), the weight version that sampled it ('rollout_versions', -1 elsewhere)."""
    completions = generated.token_ids
    n = len(completions) // len(prompts)
    batch = build_sequence_batch(
        [p for p in prompts.prompt_ids for _ in range(n)], completions, tokenizer.pad_token_id, generated.log_probs
    )
    batch.batch["group_ids"] = torch.arange(len(prompts)).repeat_interleave(n)
    batch.non_tensor_batch["response_text"] = [tokenizer.decode(c, skip_special_tokens=True) for c in completions]
    batch.non_tensor_batch["answer"] = [a for a in prompts.answers for _ in range(n)]
    batch.non_tensor_batch["extra"] = [e for e in prompts.extras for _ in range(n)]
    batch.non_tensor_batch["prompt"] = [p for p in prompts.prompts for _ in range(n)]  # a string or chat messages
    if prompts.images:  # each sample of a prompt with its prompt's images (roll_lite/strategy/vision_inputs.py)
        batch.non_tensor_batch["image_inputs"] = [entry for entry in prompts.images for _ in range(n)]
    if generated.token_versions is not None:  # partial rollouts: the weight version of each response token
        batch.batch["rollout_versions"] = response_aligned(batch["response_mask"], generated.token_versions, fill=-1)
    if generated.routed_experts is not None:  # an MoE engine's routing (actor.router_replay, docs/moe.md)
        batch.batch["routed_experts"] = token_aligned_experts(batch["attention_mask"], generated.routed_experts)
    return DataProto(batch.batch, batch.non_tensor_batch)


def token_aligned_experts(attention_mask: torch.Tensor, rows: list[torch.Tensor]) -> torch.Tensor:
    """[rows, width, layers, k] int16: each row's experts per token (prompt + response, [tokens, layers, k]) from
    position 0, -1 on padding and wherever the engine recorded none. int16: a quarter of int64's memory."""
    if len(rows) != len(attention_mask):
        raise ValueError(f"routed experts for {len(rows)} rows, the batch has {len(attention_mask)}")
    layers, k = rows[0].shape[1:] if rows else (0, 0)
    aligned = torch.full((*attention_mask.shape, layers, k), -1, dtype=torch.int16)
    for i, (experts, length) in enumerate(zip(rows, attention_mask.sum(-1).tolist())):
        if len(experts) != length:
            raise ValueError(f"row {i}: routed experts for {len(experts)} tokens, the row has {length}")
        aligned[i, :length] = experts.to(torch.int16)
    return aligned


def response_aligned(response_mask: torch.Tensor, values: list[list[int]], fill: int) -> torch.Tensor:
    """[rows, width]: each row's values on its response tokens (right after its prompt), `fill` elsewhere."""
    aligned = torch.full(response_mask.shape, fill, dtype=torch.long)
    for row, row_values in enumerate(values):
        start = int(response_mask[row].nonzero()[0]) if row_values else 0
        aligned[row, start : start + len(row_values)] = torch.tensor(row_values, dtype=torch.long)
    return aligned


def token_ids(batch: DataProto) -> list[list[int]]:
    """Each row's tokens (prompt + response), without the padding."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    return [row[:length] for row, length in zip(batch["input_ids"].tolist(), lengths)]
