"""agg_loss and the per-token losses against values worked out by hand."""

import math

import pytest
import torch

from roll_lite.loss import (
    AGG_MODES,
    agg_loss,
    clipped_value_loss,
    kl_penalty,
    local_mask_stats,
    mask_stats,
    ppo_clipped_loss,
    sequence_ratio_loss,
)

# Row 0: tokens 1, 2 valid (values 1, 2); row 1: token 0, 1, 2 valid (3, 4, 5); row 2: no valid token.
LOSS = torch.tensor([[9.0, 1.0, 2.0], [3.0, 4.0, 5.0], [7.0, 7.0, 7.0]], dtype=torch.float64)
MASK = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 0]])


def test_modes_by_hand():
    stats = local_mask_stats(MASK)
    assert stats["batch_num_tokens"].item() == 5 and stats["global_valid_samples"].item() == 2
    assert agg_loss(LOSS, MASK, "token-mean", **stats).item() == pytest.approx(15 / 5)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum", **stats).item() == pytest.approx((3 + 12) / 2)
    assert agg_loss(LOSS, MASK, "seq-mean-token-mean", **stats).item() == pytest.approx((3 / 2 + 12 / 3) / 2)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", **stats, seq_len_norm=4).item() == pytest.approx(
        15 / (2 * 4)
    )


def test_global_denominators_are_used_as_given():
    # A micro-batch holding rows 0-1 of a global batch with 10 tokens in 4 valid rows.
    value = agg_loss(LOSS[:2], MASK[:2], "token-mean", batch_num_tokens=10, global_valid_samples=4)
    assert value.item() == pytest.approx(15 / 10)
    value = agg_loss(LOSS[:2], MASK[:2], "seq-mean-token-mean", batch_num_tokens=10, global_valid_samples=4)
    assert value.item() == pytest.approx((1.5 + 4) / 4)


def test_numerator_is_masked_even_with_nan_outside_the_mask():
    loss = LOSS.clone()
    loss[2] = float("nan")
    loss[0, 0] = float("inf")
    for mode in AGG_MODES:
        value = agg_loss(loss, MASK, mode, **local_mask_stats(MASK), seq_len_norm=3)
        assert math.isfinite(value.item())


def test_all_masked_gives_zero_loss_and_zero_grad():
    loss = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 3)
    for mode in AGG_MODES:
        value = agg_loss(loss, mask, mode, batch_num_tokens=0, global_valid_samples=0, seq_len_norm=3)
        (grad,) = torch.autograd.grad(value, loss)
        assert value.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))


def test_errors_are_explicit():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-sum"):
        agg_loss(LOSS, MASK, "mean", batch_num_tokens=1, global_valid_samples=1)
    with pytest.raises(ValueError, match="needs batch_num_tokens"):
        agg_loss(LOSS, MASK, "token-mean")
    with pytest.raises(ValueError, match="needs global_valid_samples"):
        agg_loss(LOSS, MASK, "seq-mean-token-mean", batch_num_tokens=5)
    with pytest.raises(ValueError, match="seq_len_norm"):
        agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", **local_mask_stats(MASK))
    with pytest.raises(KeyError, match="add 'kl_mask' to data.meta_info\\['loss_mask_keys'\\]"):
        mask_stats({"batch_num_tokens": {"response_mask": 1}, "global_valid_samples": {"response_mask": 1}}, "kl_mask")


def test_ppo_clipped_loss_by_hand():
    # ratios e^{0.5}=1.6487 (A=+1: clipped at 1.2), e^{-0.5}=0.6065 (A=+1: unclipped), e^{0.5} (A=-1: unclipped)
    log_probs = torch.tensor([[0.5, -0.5, 0.5]], dtype=torch.float64)
    old = torch.zeros(1, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0]], dtype=torch.float64)
    loss, clipped = ppo_clipped_loss(log_probs, old, adv, 0.2, 0.2)
    r = math.exp(0.5)
    assert loss.tolist()[0] == pytest.approx([-1.2, -math.exp(-0.5), r])
    assert clipped.tolist() == [[1.0, 0.0, 0.0]]
    # asymmetric clip: ratio 0.6065 with A=-1 is clipped up to 1-0.3=0.7 -> loss max(0.6065, 0.7) = 0.7
    loss, _ = ppo_clipped_loss(torch.tensor([[-0.5]]), torch.zeros(1, 1), torch.tensor([[-1.0]]), 0.3, 0.28)
    assert loss.item() == pytest.approx(0.7)
    # dual clip: A=-1, ratio e^{2}=7.39 -> plain loss 7.39, bounded by c·|A| = 3
    loss, _ = ppo_clipped_loss(
        torch.tensor([[2.0]]), torch.zeros(1, 1), torch.tensor([[-1.0]]), 0.2, 0.2, dual_clip_c=3.0
    )
    assert loss.item() == pytest.approx(3.0)


def test_sequence_ratio_loss_by_hand():
    log_probs = torch.tensor([[0.0, 0.2, 0.4, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 0]])
    loss = sequence_ratio_loss(
        log_probs, torch.zeros_like(log_probs), torch.tensor([2.0], dtype=torch.float64), mask, 0.1, 0.1
    )
    # mean log-ratio over the 2 masked tokens = 0.3 -> ratio 1.3499, clipped to 1.1 -> max(-2.70, -2.2) = -2.2
    assert loss.tolist() == [[pytest.approx(-2.2)] * 4]


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.125)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(logp, ref, "k4")


def test_clipped_value_loss_by_hand():
    # V=1.0, V_old=0.5, R=0.0, eps=0.2: unclipped (1-0)^2=1, clipped V=0.7 -> 0.49; max -> 1 -> 0.5
    value = clipped_value_loss(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([0.0]), 0.2)
    assert value.item() == pytest.approx(0.5)
    # R=2.0: unclipped 1, clipped (0.7-2)^2=1.69 -> 0.845
    value = clipped_value_loss(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([2.0]), 0.2)
    assert value.item() == pytest.approx(0.845)


def test_masks_are_0_1_not_weights():
    # Masks say which tokens count; a weighted mask is rejected, never silently binarised.
    stats = local_mask_stats(MASK)
    weighted = MASK * 0.5
    for mode in AGG_MODES:
        with pytest.raises(
            ValueError, match="mask 'loss_mask' holds values other than 0 and 1 .*multiply the per-token loss"
        ):
            agg_loss(LOSS, weighted, mode, **stats, seq_len_norm=3)
    as_bool = agg_loss(LOSS, MASK.bool(), "token-mean", **stats)
    as_float = agg_loss(LOSS, MASK.double(), "token-mean", **stats)
    assert as_bool.item() == as_float.item() == 3.0
