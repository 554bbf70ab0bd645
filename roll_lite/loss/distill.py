"""On-policy distillation: the student samples, a teacher scores each sampled token, and the student
learns from the per-token reverse KL between them (docs/distillation.md). Two ways in:

- `distill_advantages`: A_t = reward_weight·A_task + coef·(log π_T − log π_S), the negated
  single-sample reverse-KL estimate of the sampled token, as the advantage of any policy loss (with
  its clipping and rollout corrections), as ROLL and verl's "advantage" mode do;
- `reverse_kl_loss_func`: the policy loss plus coef × a k2 / k3 estimate of KL(π_S‖π_T) on the
  sampled tokens, aggregated like every loss with the injected global stats (exact over D, A and
  packing: tests/test_exactness.py). As a loss on the student's own samples k2's expected gradient is
  the reverse KL's, k3's the forward KL's, and k1's is 0 (the config refuses k1 here);
- `top_k_forward_kl_loss_func`: the policy loss plus coef × Σ_i p_T(i)·(log p_T(i) − log p_S(i)) over
  the teacher's k most likely next tokens at each position (verl's top-k forward KL, not renormalised),
  the student's log-probs of those ids from its chunked head, without full logits.

They read the batch's `teacher_log_probs` (and `teacher_top_k_log_probs`), taken at the temperature
the student sampled at.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from roll_lite.loss.aggregation import agg_loss, mask_stats, token_mean_metric, zero_outside
from roll_lite.loss.kl import kl_penalty

if TYPE_CHECKING:
    from roll_lite.data.proto import DataProto
    from roll_lite.strategy.micro_batches import LossFunc

DISTILL_SIGNALS = ("advantage", "reverse_kl", "top_k_forward_kl")


def distill_advantages(
    task_advantages: torch.Tensor,
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    mask: torch.Tensor,
    coef: float = 1.0,
    reward_weight: float = 0.0,
) -> torch.Tensor:
    """[rows, seq]: reward_weight·A_task + coef·(log π_T − log π_S) on the mask's tokens, 0 elsewhere.
    `student_log_probs` are the sampling policy's (the old ones): the advantage is fixed for the step."""
    task, student, teacher = zero_outside(mask, task_advantages, student_log_probs, teacher_log_probs)
    return reward_weight * task + coef * (teacher - student).to(task.dtype)


def reverse_kl_loss_func(
    policy_loss: LossFunc,
    loss_agg_mode: str = "token-mean",
    coef: float = 1.0,
    estimator: str = "k1",
    mask_key: str = "response_mask",
    seq_len_norm: float | None = None,
) -> LossFunc:
    """`policy_loss` + coef × agg(KL_estimator(π_S‖π_T)) over `mask_key`, with the mask's global stats.
    Reports 'distill_kl' (the estimate's token mean) and 'distill_loss'."""

    def loss_func(batch: DataProto, output: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, metrics = policy_loss(batch, output)
        stats, mask = mask_stats(batch.meta_info, mask_key), batch[mask_key]
        log_probs, teacher = zero_outside(mask, output["log_probs"], batch["teacher_log_probs"])
        kl = kl_penalty(log_probs, teacher, estimator)
        distill_loss = agg_loss(kl, mask, loss_agg_mode, **stats, seq_len_norm=seq_len_norm)
        metrics["distill_kl@sum"] = token_mean_metric(kl, mask, stats["batch_num_tokens"])
        metrics["distill_loss@sum"] = distill_loss.detach()
        return loss + coef * distill_loss, metrics

    return loss_func


def top_k_forward_kl_loss_func(
    policy_loss: LossFunc,
    loss_agg_mode: str = "token-mean",
    coef: float = 1.0,
    mask_key: str = "response_mask",
    seq_len_norm: float | None = None,
) -> LossFunc:
    """`policy_loss` + coef × agg(Σ_k p_T(i_k)·(log p_T(i_k) − log p_S(i_k))) over `mask_key`, i_k the
    teacher's top-k ids (batch['teacher_top_k_ids'], which make the model output 'top_k_log_probs');
    reports 'distill_kl' (the token mean) and 'distill_loss'."""

    def loss_func(batch: DataProto, output: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, metrics = policy_loss(batch, output)
        stats, mask = mask_stats(batch.meta_info, mask_key), batch[mask_key]
        keep = mask.bool()[..., None]
        zero = torch.zeros((), dtype=output["top_k_log_probs"].dtype, device=mask.device)
        teacher = torch.where(keep, batch["teacher_top_k_log_probs"].to(zero.dtype), zero)
        student = torch.where(keep, output["top_k_log_probs"], zero)
        kl = (teacher.exp() * (teacher - student)).sum(-1)
        distill_loss = agg_loss(kl, mask, loss_agg_mode, **stats, seq_len_norm=seq_len_norm)
        metrics["distill_kl@sum"] = token_mean_metric(kl, mask, stats["batch_num_tokens"])
        metrics["distill_loss@sum"] = distill_loss.detach()
        return loss + coef * distill_loss, metrics

    return loss_func
