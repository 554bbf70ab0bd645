"""Pair losses: a reward model's Bradley–Terry loss and the DPO family (DPO, IPO, SimPO).

A preference batch holds each pair as two consecutive rows, chosen then rejected, and the strategy
keeps them together (meta_info['rows_together'] = 2, roll_lite/strategy/micro_batches.py). Its masks,
all declared in loss_mask_keys (roll_lite/data/pairs.py: PAIR_MASK_KEYS), as the losses read each:
- chosen_mask / rejected_mask: the response tokens of the chosen / rejected rows (zero on the other
  side), so global_valid_samples['chosen_mask'] is the step's number of pairs and
  batch_num_tokens['chosen_mask'] its number of chosen tokens;
- score_mask (reward model): the one token whose score is the sequence's, the last that is not
  padding, as transformers' *ForSequenceClassification reads it;
and reference_logps (DPO, IPO): [rows] the reference model's summed log-prob of each response.

Every loss is Σ over the micro-batch's pairs / the step's pair count: summed over micro-batches and
ranks it is the mean over all pairs of the step, whatever D, A and packing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from roll_lite.loss.aggregation import mask_stats, masked_sum, zero_outside

if TYPE_CHECKING:
    from roll_lite.data.proto import DataProto
    from roll_lite.strategy.micro_batches import LossFunc

PAIR_LOSSES = ("dpo", "ipo", "simpo")
PAIR_MASK = "chosen_mask"  # the mask whose global sample count is the number of pairs


def pair_rows(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices of the chosen and the rejected side of each pair in this micro-batch."""
    chosen, rejected = batch["chosen_mask"].bool().any(-1), batch["rejected_mask"].bool().any(-1)
    rows = len(chosen)
    expected = torch.arange(rows, device=chosen.device) % 2 == 0
    if rows % 2 or not torch.equal(chosen, expected) or not torch.equal(rejected, ~expected):
        raise ValueError(
            "a preference batch holds each pair as two consecutive rows, chosen then rejected, each with "
            "response tokens, and meta_info['rows_together'] = 2 keeps them together; this micro-batch's "
            f"rows have chosen tokens {chosen.tolist()} and rejected tokens {rejected.tolist()}"
        )
    indices = torch.arange(0, rows, 2, device=chosen.device)
    return indices, indices + 1


def _pair_count(batch: DataProto) -> torch.Tensor:
    return mask_stats(batch.meta_info, PAIR_MASK)["global_valid_samples"]


def _pair_mean(values: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """This micro-batch's share of a mean over the step's pairs."""
    return values.sum() / pairs.to(values.dtype).clamp(min=1.0)


def _smoothed_sigmoid_loss(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """−log σ(x), or with conservative label smoothing ε (cDPO): −(1−ε) log σ(x) − ε log σ(−x)."""
    loss = -F.logsigmoid(logits)
    if label_smoothing:
        loss = (1.0 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-logits)
    return loss


def bradley_terry_loss_func(center_coef: float = 0.0) -> LossFunc:
    """Reward-model training: mean over pairs of −log σ(s_c − s_r − m), with m the pair's `margin`
    (a [rows] tensor, when the batch has one) and, with `center_coef`, + center_coef·(s_c + s_r)²,
    which keeps scores centred on zero (TRL's center_rewards_coefficient)."""

    def loss_func(batch: DataProto, output: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        chosen, rejected = pair_rows(batch)
        pairs = _pair_count(batch)
        (scores,) = zero_outside(batch["score_mask"], output["scores"])
        sequence_scores = scores.sum(-1)
        chosen_scores, rejected_scores = sequence_scores[chosen], sequence_scores[rejected]
        difference = chosen_scores - rejected_scores
        margin = batch["margin"][chosen].to(difference.dtype) if "margin" in batch.batch else 0.0
        per_pair = -F.logsigmoid(difference - margin)
        if center_coef:
            per_pair = per_pair + center_coef * (chosen_scores + rejected_scores) ** 2
        loss = _pair_mean(per_pair, pairs)
        detached = difference.detach()
        return loss, {
            "loss@sum": loss.detach(),
            "accuracy@sum": _pair_mean((detached > 0).to(detached.dtype), pairs),
            "score_gap@sum": _pair_mean(detached, pairs),
            "chosen_score@sum": _pair_mean(chosen_scores.detach(), pairs),
            "rejected_score@sum": _pair_mean(rejected_scores.detach(), pairs),
        }

    return loss_func


def dpo_loss_func(
    loss_type: str = "dpo",
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    nll_coef: float = 0.0,
    simpo_gamma: float = 0.5,
) -> LossFunc:
    """The DPO family on a pair's response log-probs (π: the policy, ref: reference_logps), as TRL 1.16 computes
    them (DPOTrainer's loss_type sigmoid and ipo, the experimental CPOTrainer's simpo):
    - dpo:   −log σ(β·h), h = (log π_c − log ref_c) − (log π_r − log ref_r)
    - ipo:   (h − 1/(2β))², on per-token mean log-probs (the IPO paper's length normalisation)
    - simpo: −log σ(β·(mean log π_c − mean log π_r) − γ), no reference (γ = simpo_gamma)
    `label_smoothing` ε makes dpo / simpo conservative (cDPO; TRL 1.16 applies it to simpo, and to dpo only up
    to 0.28); `nll_coef` adds the chosen responses' token-mean NLL (over the step's chosen tokens; TRL's
    rpo_alpha). The metrics are TRL's, with TRL's formulas (docs/preferences.md lists them): the implicit
    reward β·(log π − log ref) of summed log-probs, under ipo too, and SimPO's β·mean log π."""
    if loss_type not in PAIR_LOSSES:
        raise ValueError(f"unknown pair loss '{loss_type}'; choose one of {', '.join(PAIR_LOSSES)}")

    def loss_func(batch: DataProto, output: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        chosen, rejected = pair_rows(batch)
        pairs = _pair_count(batch)
        response = batch["chosen_mask"].bool() | batch["rejected_mask"].bool()
        (log_probs,) = zero_outside(response, output["log_probs"])
        logps = log_probs.double().sum(-1)  # as the reference's sums: equal weights give h = 0 exactly
        reference = batch["reference_logps"].to(logps.dtype) if loss_type != "simpo" else torch.zeros_like(logps)
        log_ratios = logps - reference
        if loss_type in ("ipo", "simpo"):  # they compare per-token means
            log_ratios = log_ratios / response.sum(-1).to(logps.dtype)
        h = log_ratios[chosen] - log_ratios[rejected]
        if loss_type == "ipo":
            per_pair = (h - 1.0 / (2.0 * beta)) ** 2
        else:
            per_pair = _smoothed_sigmoid_loss(
                beta * h - (simpo_gamma if loss_type == "simpo" else 0.0), label_smoothing
            )
        loss = preference_loss = _pair_mean(per_pair, pairs)
        metrics = {"preference_loss@sum": preference_loss.detach()}
        if nll_coef:
            stats = mask_stats(batch.meta_info, PAIR_MASK)
            nll = masked_sum(-log_probs, batch["chosen_mask"]) / stats["batch_num_tokens"].to(log_probs.dtype).clamp(
                min=1.0
            )
            loss = loss + nll_coef * nll
            metrics["nll_loss@sum"] = nll.detach()
        # TRL's metrics: of the summed log-probs under dpo and ipo (DPOTrainer), of SimPO's means (CPOTrainer)
        if loss_type == "simpo":
            logps = log_ratios
        rewards = beta * (logps - reference)  # the implicit rewards
        chosen_rewards, rejected_rewards = rewards[chosen].detach(), rewards[rejected].detach()
        return loss, {
            **metrics,
            "rewards/chosen@sum": _pair_mean(chosen_rewards, pairs),
            "rewards/rejected@sum": _pair_mean(rejected_rewards, pairs),
            "rewards/accuracies@sum": _pair_mean((chosen_rewards > rejected_rewards).to(logps.dtype), pairs),
            "rewards/margins@sum": _pair_mean(chosen_rewards - rejected_rewards, pairs),
            "logps/chosen@sum": _pair_mean(logps[chosen].detach(), pairs),
            "logps/rejected@sum": _pair_mean(logps[rejected].detach(), pairs),
        }

    return loss_func
