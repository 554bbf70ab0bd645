"""Distillation teachers on image prompts (docs/vision.md, "Distillation teachers on image prompts"): a teacher of a
vision-language student is itself a vision-language folder that scores the student's ids, each image's tokens
included, with the sample's own images (the batch's pixel_values, made by the student's processor); the folder
is checked against the student in vision_teacher_folder.py.

The top-k of `distill.signal=top_k_forward_kl`, over the vocabulary without the vision tokens, as every log-prob
of a vision-language policy (restricted_vocab.py): the teacher's top k are the k most likely tokens of its
restricted distribution (the excluded logits set to -inf before the softmax), and the student's log-probs of
those ids are its restricted ones, log p(y) - log(1 - m), from the same chunked pass as its sampled token's.
"""

from __future__ import annotations

from typing import Sequence

import torch

from roll_lite.model.logprobs import chunked_log_probs, head_logits
from roll_lite.model.restricted_vocab import restrict_log_probs


@torch.no_grad()
def restricted_top_k(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    excluded_ids: Sequence[int],
    *,
    chunk_size: int = 1024,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, log-probs), each [N, k]: the k most likely next tokens of the distribution without `excluded_ids`,
    most likely first, chunk by chunk (chunked_top_k's, restricted)."""
    excluded = torch.as_tensor(list(excluded_ids), dtype=torch.long, device=hidden.device)
    ids = torch.empty(hidden.shape[0], k, dtype=torch.long, device=hidden.device)
    log_probs = hidden.new_empty(hidden.shape[0], k, dtype=torch.promote_types(hidden.dtype, torch.float32))
    for start in range(0, hidden.shape[0], chunk_size):
        end = min(start + chunk_size, hidden.shape[0])
        logits = head_logits(hidden[start:end], weight, temperature)
        logits[:, excluded] = float("-inf")
        top = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
        log_probs[start:end], ids[start:end] = top.values, top.indices
        del logits
    return ids, log_probs


def restricted_head_outputs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    shape: torch.Size,
    excluded_ids: Sequence[int],
    *,
    chunk_size: int,
    temperature: float,
    with_entropy: bool,
    top_k: int = 0,
    gather_ids: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """VisionLMWithLogProbs's outputs of shape `shape` with a teacher's top-k (`top_k`: 'top_k_ids',
    'top_k_log_probs') or a student's log-probs of the teacher's ids (`gather_ids` [.., k]: 'top_k_log_probs'),
    all over the vocabulary without `excluded_ids` (none: the full one)."""
    columns = [targets.reshape(-1, 1)]
    if gather_ids is not None:
        columns.append(gather_ids.reshape(len(columns[0]), -1))
    gathered = sum(column.shape[1] for column in columns)  # the sampled token, then the teacher's ids
    excluded = torch.as_tensor(list(excluded_ids), dtype=targets.dtype, device=targets.device)
    columns.append(excluded.expand(len(columns[0]), -1))
    log_probs, entropy = chunked_log_probs(
        hidden,
        weight,
        torch.cat(columns, dim=1),
        chunk_size=chunk_size,
        temperature=temperature,
        with_entropy=with_entropy,
    )
    if len(excluded):
        # the sampled token's (and the entropy) as restricted_log_probs computes them; the teacher's ids the same way
        sampled, entropy = restrict_log_probs(torch.cat([log_probs[:, :1], log_probs[:, gathered:]], 1), entropy)
        limit = 1.0 - torch.finfo(log_probs.dtype).eps
        log_kept = torch.log1p(-log_probs[:, gathered:].exp().sum(-1).clamp(max=limit))  # log(1 - m), as there
        teachers = log_probs[:, 1:gathered] - log_kept[:, None]
    else:
        sampled, teachers = log_probs[:, 0], log_probs[:, 1:gathered]
    outputs = {"log_probs": sampled.reshape(shape).clone()}
    if gather_ids is not None:
        outputs["top_k_log_probs"] = teachers.reshape(*shape, -1).clone()
    if entropy is not None:
        outputs["entropy"] = entropy.reshape(shape).clone()
    if top_k:
        ids, top = restricted_top_k(hidden, weight, top_k, excluded_ids, chunk_size=chunk_size, temperature=temperature)
        outputs.update(top_k_ids=ids.reshape(*shape, top_k), top_k_log_probs=top.reshape(*shape, top_k))
    return outputs
