"""The pair losses' part of the exactness matrix (distributed_harness.py): a preference batch of
five pairs of uneven length, the losses as the pipelines build them, and the independent reference's
model output (the reward model's scores from the plain HF decoder times the score weight)."""

from __future__ import annotations

import math

import torch

from roll_lite.data import DataProto
from roll_lite.data.pairs import PAIR_MASK_KEYS
from roll_lite.loss import bradley_terry_loss_func, dpo_loss_func
from roll_lite.loss.checker import TINY_MODEL

PAIR_LOSSES = ("bt", "dpo", "ipo", "simpo")
PAIR_MODE = "pair-mean"  # pair losses have one aggregation: the mean over the step's pairs
PAIR_ROWS = 10
PAIR_BUDGET = 40  # tokens per micro-batch: a pair (two rows of up to 16) always fits


def pair_batch(dtype: torch.dtype, seq_len: int = 16, pairs: int = PAIR_ROWS // 2) -> DataProto:
    """Pairs as consecutive rows (chosen, rejected) of uneven length, one sharing its chosen and
    rejected length, with every tensor the pair losses read."""
    gen = torch.Generator().manual_seed(31)
    rows = 2 * pairs
    lengths = torch.randint(4, seq_len + 1, (rows,), generator=gen)
    lengths[0], lengths[3], lengths[4] = seq_len, 4, lengths[5]
    prompt_lengths = torch.randint(1, 4, (pairs,), generator=gen).repeat_interleave(2)  # a pair shares its prompt
    positions = torch.arange(seq_len)[None, :]
    attention_mask = (positions < lengths[:, None]).long()
    response = ((positions >= prompt_lengths[:, None]) & (positions < lengths[:, None])).long()
    is_chosen = (torch.arange(rows) % 2 == 0)[:, None]
    vocab = TINY_MODEL["vocab_size"]
    input_ids = torch.randint(1, vocab, (rows, seq_len), generator=gen) * attention_mask
    input_ids[1::2, :3] = input_ids[0::2, :3]  # the shared prompt
    return DataProto(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "chosen_mask": response * is_chosen,
            "rejected_mask": response * ~is_chosen,
            "score_mask": (positions == lengths[:, None] - 1).long(),
            "reference_logps": -math.log(vocab) * response.sum(-1).to(dtype)
            + torch.randn(rows, generator=gen, dtype=dtype),
            "margin": torch.rand(rows, generator=gen, dtype=dtype),
        },
        meta_info={"loss_mask_keys": list(PAIR_MASK_KEYS), "rows_together": 2},  # as the pipelines declare
    )


def make_pair_loss(name: str):
    if name == "bt":
        return bradley_terry_loss_func(center_coef=0.05)
    if name == "dpo":  # with cDPO's smoothing and the chosen side's NLL term
        return dpo_loss_func("dpo", beta=0.5, label_smoothing=0.1, nll_coef=0.3)
    if name == "ipo":
        return dpo_loss_func("ipo", beta=0.5)
    return dpo_loss_func("simpo", beta=2.0, simpo_gamma=0.4, label_smoothing=0.1, nll_coef=0.3)


def score_head_weights(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A score head of about unit output (transformers' init, std 0.02, would leave scores near zero)."""
    weight = 0.2 * torch.randn(
        1, TINY_MODEL["hidden_size"], generator=torch.Generator().manual_seed(6), dtype=torch.float64
    )
    return {"score.weight": weight.to(dtype)}


def reference_scores(lm, batch: dict, head: dict) -> dict:
    """Each token's score from the plain HF decoder: hidden state · score weight, at every real token."""
    hidden = lm.model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).last_hidden_state
    scores = torch.einsum("bth,h->bt", hidden, head["score.weight"][0])
    return {"scores": torch.where(batch["attention_mask"].bool(), scores, 0.0)}
