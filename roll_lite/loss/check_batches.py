"""The loss checker's synthetic batches (roll_lite/loss/checker.py): an RL batch, and a batch of
preference pairs laid out as the DPO and reward-model pipelines lay theirs out."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from roll_lite.data import DataProto
from roll_lite.data.pairs import PairData, build_pair_batch


def random_rl_batch(
    num_rows: int = 12,
    seq_len: int = 24,
    vocab_size: int = 64,
    mask_keys: Sequence[str] = ("response_mask",),
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> DataProto:
    """Right-padded rows of uneven length with a prompt and a response, some rows with an all-zero
    response mask, and the tensors RL losses read: old/ref log-probs, advantages, values, returns.
    Every mask key other than response_mask is a random subset of it."""
    if num_rows < 4 or seq_len < 4:
        raise ValueError("random_rl_batch needs num_rows >= 4 and seq_len >= 4")
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, seq_len + 1, (num_rows,), generator=gen)
    lengths[0], lengths[-1] = seq_len, 2
    prompt_lengths = torch.minimum(torch.randint(1, 5, (num_rows,), generator=gen), lengths - 1)
    positions = torch.arange(seq_len)[None, :]
    attention_mask = (positions < lengths[:, None]).long()
    response_mask = ((positions >= prompt_lengths[:, None]) & (positions < lengths[:, None])).long()
    response_mask[1] = 0
    response_mask[num_rows // 2] = 0
    masks = {"response_mask": response_mask}
    for key in mask_keys:
        if key not in masks:
            subset = (torch.rand(num_rows, seq_len, generator=gen) < 0.6).long() * response_mask
            subset[2] = 0
            masks[key] = subset
    noise = lambda: torch.randn(num_rows, seq_len, generator=gen, dtype=dtype)  # noqa: E731
    base_log_prob = -math.log(vocab_size)
    return DataProto(
        {
            "input_ids": torch.randint(1, vocab_size, (num_rows, seq_len), generator=gen) * attention_mask,
            "attention_mask": attention_mask,
            **masks,
            "old_log_probs": base_log_prob + 0.3 * noise(),
            "ref_log_probs": base_log_prob + 0.3 * noise(),
            "advantages": noise(),
            "values": noise(),
            "returns": noise(),
            "rollout_log_probs": base_log_prob + 0.3 * noise(),  # the engine's: the policy losses report the gap
        },
        meta_info={"loss_mask_keys": list(dict.fromkeys(mask_keys))},
    )


def random_pair_batch(
    num_pairs: int = 6, seq_len: int = 16, vocab_size: int = 64, seed: int = 0, dtype: torch.dtype = torch.float64
) -> DataProto:
    """Preference pairs as the pair pipelines build them (roll_lite/data/pairs.py: build_pair_batch): two
    rows per pair, chosen then rejected, that share their prompt; responses of uneven length up to the row's
    end (one pair of equal lengths); rows_together = 2 and the pipelines' loss_mask_keys (PAIR_MASK_KEYS);
    a margin per pair, and reference_logps ([rows], a reference's summed response log-probs) as the DPO
    pipeline adds them."""
    if num_pairs < 2 or seq_len < 4:
        raise ValueError("random_pair_batch needs num_pairs >= 2 and seq_len >= 4")
    gen = torch.Generator().manual_seed(seed)
    draw = lambda low, high: int(torch.randint(low, high + 1, (1,), generator=gen))  # noqa: E731
    tokens = lambda count: torch.randint(1, vocab_size, (count,), generator=gen).tolist()  # noqa: E731
    chosen: list[tuple[list[int], list[int]]] = []  # (token ids, target mask) of each pair's side
    rejected: list[tuple[list[int], list[int]]] = []
    sides = (chosen, rejected)
    for pair, prompt_length in enumerate(torch.randint(1, 4, (num_pairs,), generator=gen).tolist()):
        prompt = tokens(prompt_length)
        lengths = [draw(1, seq_len - len(prompt)) for _ in sides]
        if pair == 0:  # the longest row: the batch's width
            lengths[0] = seq_len - len(prompt)
        if pair == 1:
            lengths[1] = lengths[0]
        for side, length in zip(sides, lengths):
            side.append((prompt + tokens(length), [0] * len(prompt) + [1] * length))
    margins = torch.rand(num_pairs, generator=gen, dtype=torch.float64).tolist()
    batch = build_pair_batch(PairData(chosen, rejected, margins), pad_token_id=0)
    response_tokens = (batch["chosen_mask"] + batch["rejected_mask"]).sum(-1)
    noise = torch.randn(len(response_tokens), generator=gen, dtype=torch.float64)
    batch.batch["reference_logps"] = (-math.log(vocab_size) * response_tokens + noise).to(dtype)
    return batch
